"""The fault harness off the easy path: kill -9 in the middle of the exports that read the
source (overlay, frames) and of every reset (new export settings, new prompts, --force), on
MPEG-TS and AVI sources (B-frame H.264 with a keyframe every 2 frames: their seeks land
late, so a resumed export reads other ranges than an uninterrupted one), and of the resets
of a run that goes on on two Dask workers. After each kill the same command runs again (on
two workers, in that case), and the store and every exported file equal, byte for byte,
those of the same commands run uninterrupted on another store. (Kills mid-export of every
format on MP4: tests/test_export.py; of a Dask run's exports: tests/test_dask.py.)

The killed commands run in a process of their own; the uninterrupted ones and the reruns
run segpipe's command line in this process (the same code, without a new interpreter's
start-up for each)."""

import json
import signal
from pathlib import Path

import make_sample
import pytest
from conftest import assert_same_store, run_args, run_code, tree_digest
from test_export_order import late_seeks, straight

from segpipe.cli import cli
from segpipe.stages.export.stage import FORMATS
from segpipe.store.runstore import RunStore

KILLED = """
import sys
sys.path.insert(0, "tests")
import kill_points

how, at, under = sys.argv[1:4]
if how == "unlink":
    kill_points.at_unlink(int(at), under)
else:
    kill_points.mid_write(at, 2)
kill_points.cli(sys.argv[4:])
"""
EXPORTS = ",".join(FORMATS)


def killed(how: str, at: str, args, under: Path) -> None:
    """Run segpipe's command line with `args`, killed -9 in-process at `at`: the 4th file
    removal under the folder `under` (`how` "unlink": not Dask's own clean-ups of its
    scratch folder), or halfway through writing the 2nd chunk file of the array whose
    path holds `at` (`how` "write"). Asserts that the kill landed."""
    proc = run_code(KILLED, how, at, under, *args)
    assert proc.returncode == -signal.SIGKILL, (args, proc.stderr[-2000:])


def committed(store: Path, fmt: str) -> int:
    """How many chunks of the export in `fmt` are recorded done (a record half written by
    the kill is a temporary file)."""
    records = store / "ledger" / f"export_{fmt}" / "c"
    return sum(not p.name.endswith(".partial") for p in records.iterdir())


def here(args) -> None:
    """segpipe's command line with `args`, in this process."""
    cli.main([*map(str, args), "--quiet"], prog_name="segpipe", standalone_mode=False)


def exports_of(store: Path) -> dict:
    return tree_digest(store.with_name(store.name.removesuffix(".zarr") + ".export"))


def assert_same(a: Path, b: Path) -> None:
    assert_same_store(a, b)
    assert exports_of(a) == exports_of(b)
    assert exports_of(a)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A 12-frame clip prompted on frames 5, 8 and 11, as MP4 and, with a keyframe every 2
    frames (libx264's B-frames), as MPEG-TS and AVI: every chunk start's seek lands late."""
    root = tmp_path_factory.mktemp("sources")
    frames, masks = make_sample.make_clip(num_frames=12, width=96, height=72, seed=1)
    make_sample.write_prompts(root, masks, frames=(5, 8, 11))
    videos = {"mp4": root / "clip.mp4"}
    make_sample.write_video(videos["mp4"], frames)
    for suffix in ("ts", "avi"):
        videos[suffix] = root / f"clip.{suffix}"
        make_sample.write_video(videos[suffix], frames, encoder_options={"g": "2"})
        assert late_seeks(videos[suffix], straight(videos[suffix]), 4) == [4, 8]
    return videos


def commands(video: Path, store: Path, workers: list) -> dict:
    """The run, then the three commands that start something over on its store: an export
    with new settings (its record and files), new prompts (the tracking and exports), new
    settings with --force (the whole store); those two with `workers`."""
    base = [*run_args(video.parent, store), "--export", EXPORTS]
    base[1] = video
    base[base.index("--image-size") + 1] = 64  # kills at set points: any size will do
    two = store.parent / "two.json"
    entries = json.loads((video.parent / "prompts.json").read_text())["prompts"][:2]
    two.write_text(json.dumps({"prompts": entries}))
    prompts = base.copy()
    prompts[prompts.index("--prompts") + 1] = two
    force = base.copy()
    force[force.index("--chunk-size") + 1] = "3"
    davis = store.with_name(store.name.removesuffix(".zarr") + ".export") / "davis"
    export = ["export", "--store", store, "--format", "davis", "--out", davis]
    return {
        "run": base,
        "new export settings": [*export, "--objects", "1,2", "--force"],
        "new prompts": [*prompts, *workers],
        "--force": [*force, "--force", *workers],
    }


@pytest.mark.parametrize("where", ["ts", "avi", "mp4 on two workers"])
def test_kill_9_in_every_export_and_every_reset_then_rerun(sources, tmp_path, where):
    """On one store, in turn: `run` killed in the middle of each export that reads the source
    (the 2nd done-record of that export the run writes half written: a chunk of it
    exported, the next one's files written), then run to the end; then each reset killed after its removal began (at
    its 4th file removal, while the old tree is emptied from the trash it was renamed
    into), and rerun. After each command the store and the exports equal those of the same
    commands run uninterrupted on another store. On two workers the run is made in one
    process (the same store: tests/test_dask.py), and the resets of the tracking and of the
    store are killed in one process too (a client resets before it starts its cluster's
    work, by the same code; kills of Dask clients: tests/test_dask.py), then rerun on two
    workers; `export` has no workers."""
    suffix = where.split()[0]
    workers = ["--workers", "2"] if "workers" in where else []
    a, b = tmp_path / "straight" / "run.zarr", tmp_path / "killed" / "run.zarr"
    a.parent.mkdir()
    b.parent.mkdir()
    ours = commands(sources[suffix], a, [])
    theirs = commands(sources[suffix], b, workers)
    alone = commands(sources[suffix], b, [])  # what is killed
    here(ours["run"])
    if not workers:
        for fmt in ("overlay", "frames"):
            killed("write", f"ledger/export_{fmt}/", theirs["run"], b.parent)
            assert 1 <= committed(b, fmt) < committed(a, fmt), fmt  # mid-export of fmt
    here(theirs["run"])
    assert_same(a, b)
    for case in ("new export settings", "new prompts", "--force"):
        here(ours[case])
        killed("unlink", "4", alone[case], b.parent)
        assert RunStore.trash_of(b).exists(), case  # the kill landed mid-removal
        here(theirs[case])
        assert_same(a, b)
        assert not RunStore.trash_of(b).exists(), case
