"""The same command in two fresh processes gives the same bytes, from making the input on:
a synthetic clip (the held-out kind `bench_quality.py` makes: bouncing objects, an occluder)
is generated, encoded to H.264, prompted and run through every stage, once per model we
ship or test with; two such processes give byte-identical videos, stores and exports, though
one may run on every CPU of the machine and the other on one (as on a smaller machine, or
under `taskset`: an encoder that sizes its threads by the CPUs, as libx264 does by default,
makes other bytes), at the same torch thread count."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import zarr
from conftest import ROOT, assert_same_store, tree_digest

MAKE_AND_RUN = """
import json, os, subprocess, sys
from pathlib import Path
if os.environ.get("PIN_TO_CPU"):  # first of all: the encoder and segpipe run on this CPU alone
    os.sched_setaffinity(0, {int(os.environ["PIN_TO_CPU"])})
sys.path.insert(0, "data")
import make_sample, synthetic
out, model = Path(sys.argv[1]), sys.argv[2]
frames, masks = synthetic.make_clip(
    num_frames=8, height=192, width=256, seed=1_000_003, motions=("bounce",),
    num_objects=2, distractors=1, occluder=True,
)
make_sample.write_video(out / "clip.mp4", frames)
boxes = [make_sample.bbox(masks[0, o]) for o in range(masks.shape[1])]
prompts = [{"object": o + 1, "frame": 0, "box": b} for o, b in enumerate(boxes)]
(out / "prompts.json").write_text(json.dumps({"prompts": prompts}))
weights = ["--model", "segpipe_tiny"] if model == "segpipe_tiny" else ["--random-weights", "0"]
subprocess.run(
    [sys.executable, "-m", "segpipe.cli", "run", str(out / "clip.mp4"), "--store",
     str(out / "clip.zarr"), "--prompts", str(out / "prompts.json"), "--chunk-size", "4",
     "--image-size", "128", "--quiet", *weights],
    check=True,
)
"""


@pytest.mark.parametrize("model", ["segpipe_tiny", "sam2.1_hiera_t"])
def test_two_fresh_processes_make_the_same_bytes(model, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:  # in CI (.ci/run sets SEGPIPE_CI) every test must run: fail there
        (pytest.fail if os.environ.get("SEGPIPE_CI") else pytest.skip)(
            "one process on every CPU and one on one CPU needs two CPUs"
        )
    made = []
    for n, pin in enumerate(["", str(cpus[0])]):
        out = tmp_path / str(n)
        out.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", MAKE_AND_RUN, str(out), model],
            cwd=ROOT,
            capture_output=True,
            text=True,
            # torch's bits follow its thread count: the same in both
            env={**os.environ, "OMP_NUM_THREADS": "1", "PIN_TO_CPU": pin},
        )
        assert proc.returncode == 0, proc.stderr
        made.append(out)
    a, b = made
    assert (a / "clip.mp4").read_bytes() == (b / "clip.mp4").read_bytes()
    assert_same_store(a / "clip.zarr", b / "clip.zarr", skip_attrs=("source",))
    sources = [zarr.open_group(str(d / "clip.zarr"), mode="r").attrs["source"] for d in made]
    for source in sources:  # the file's own: its modification time and its folder
        source.pop("mtime_ns")
        source["path"] = Path(source["path"]).name
    assert sources[0] == sources[1]
    assert tree_digest(a / "clip.export") == tree_digest(b / "clip.export")
    assert len(tree_digest(a / "clip.export")) >= 8  # PNGs, JSON and the overlay
