"""EdgeTAM and SAM 3's tracker (through Hugging Face transformers), tracked chunk by chunk by
segpipe, bit for bit transformers' own session over the whole video (`hf_oracle`): chunk
sizes 1, 4 and 16; points, boxes and masks; forward, reverse and both; a kill -9 in the
middle of the tracking then a rerun; `--keep masks`. Small configs of the real
architectures with seeded random weights (`-mini` models)."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import make_sample
import numpy as np
import pytest
from conftest import assert_user_error, ledger_records, run_code, segpipe, tree_digest
from hf_oracle import hf_model, hf_oracle, hf_prompted
from oracle import assert_tracked_as_sam2
from PIL import Image

from segpipe.models.hf.configs import edgetam_config, sam3_tracker_config
from segpipe.store.runstore import RunStore

# the family's -mini model at its test size: EdgeTAM's perceiver pools 16 x 16 latents at
# stride 16 (256 at least); SAM 3's tracker at 8 x 8 patches of 14
FAMILIES = {
    "edgetam": ("edgetam-mini", 256, edgetam_config),
    "sam3-tracker": ("sam3-tracker-mini", 112, sam3_tracker_config),
}


def prompts_of(small: Path, folder: Path, family: str, which: str) -> Path:
    """The small clip's prompts (object 1 by points on frame 5, 2 by a box on 8, 3 by a
    mask on 11): `all` of them, or `mask` (object 3's alone). EdgeTAM in transformers cannot
    hold a mask prompt beside other objects (refused, below): its `all` is points and box."""
    data = json.loads((small / "prompts.json").read_text())
    entries = data["prompts"]
    if which == "mask" or family == "edgetam":
        entries = [e for e in entries if ("mask" in e) == (which == "mask")]
    for e in entries:
        if "mask" in e:
            e["mask"] = str(small / e["mask"])
    path = folder / f"{family}-{which}.json"
    path.write_text(json.dumps({"prompts": entries}))
    return path


def run_args(small, store, prompts, family, chunk, *more):
    model, size, _ = FAMILIES[family]
    return (
        "run", small / "clip.mp4", "--store", store, "--prompts", prompts, "--chunk-size",
        chunk, "--image-size", size, "--model", model, "--random-weights", 0, "--quiet", *more,
    )  # fmt: skip


@pytest.fixture(scope="module")
def oracles(small, tmp_path_factory):
    """Per (family, prompts): the oracle over the small clip's frames at the family's size."""
    folder = tmp_path_factory.mktemp("families")
    out = {}
    for family, (model, size, config) in FAMILIES.items():
        store = folder / f"{family}.zarr"
        segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", size, check=True)
        net = out[family] = hf_model(family, config(size, mini=True), seed=0)
        for which in ("all", "mask"):
            prompts = prompts_of(small, folder, family, which)
            out[family, which] = (prompts, hf_oracle(store, prompts, family, net))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_tracked_as_transformers_own_session(small, oracles, tmp_path, family, chunk):
    prompts, oracle = oracles[family, "all"]
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, prompts, family, chunk), check=True)
    assert_tracked_as_sam2(store, oracle, "both")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_one_direction_and_a_mask_prompt(small, oracles, tmp_path, family, direction):
    prompts, oracle = oracles[family, "mask"]
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, prompts, family, 4, "--direction", direction), check=True)
    assert_tracked_as_sam2(store, oracle, direction)


KILL = """
import sys
sys.path.insert(0, "tests")
import kill_points
kill_points.mid_write(sys.argv[1], int(sys.argv[2]))
kill_points.cli(sys.argv[3:])
"""

# Where a kill lands: halfway through writing the nth chunk of a pass's memory snapshot, the
# chunks before it committed; the rerun restores the snapshot before it.
# - EdgeTAM, forward, 4th chunk (frames 16..19 from a prompt on frame 5): the snapshot after
#   frame 15 holds mask memories for 10..15 and pointers alone for 6..9.
# - EdgeTAM, one object by a mask on frame 11, forward, 2nd chunk: the snapshot after the
#   first (frames 8..11) holds nothing in reach but the prompted output (a mask prompt's,
#   its score in EdgeTAM's other shape).
# - SAM 3's tracker, reverse, 2nd chunk: the snapshot after frames 5..4 holds the outputs
#   the prompts' model calls left on frames 8 and 11, which a reverse pass reads.
KILLS = {
    "edgetam": ("edgetam", "all", "forward", 4),
    "edgetam-mask": ("edgetam", "mask", "forward", 2),
    "sam3-tracker": ("sam3-tracker", "all", "reverse", 2),
}


@pytest.mark.parametrize("kill", list(KILLS))
def test_killed_mid_tracking_then_rerun_under_keep_masks(small, oracles, tmp_path, kill):
    """Killed halfway through writing a chunk's memory, then run again: the chunks
    committed before the kill are not tracked again, and the result is transformers'."""
    family, which, direction, nth = KILLS[kill]
    prompts, oracle = oracles[family, which]
    store = tmp_path / "s.zarr"
    args = run_args(small, store, prompts, family, 4, "--keep", "masks")
    killed = run_code(KILL, f"memory/{direction}/session/recent_frame", nth, *args)
    assert killed.returncode == -9, killed.stderr
    ledger = RunStore.open(store).pass_ledger(direction)
    done = ledger.count()
    assert done == nth - 1, done  # the kill landed mid-pass: the chunks before it committed
    committed = dict(ledger_records(store, f"track_{direction}"))
    segpipe(*args, check=True)
    again = ledger_records(store, f"track_{direction}")
    assert all(again[k] == t for k, t in committed.items())  # not tracked again
    assert_tracked_as_sam2(store, oracle, "both")


def test_repair_finds_a_damaged_memory_chunk_and_nothing_in_a_whole_store(small, oracles, tmp_path):
    """A whole store: no damage (one whose first forward chunk had nothing in reach either).
    A chunk of the session memory removed: found, its pass redone from there, the masks
    transformers' again."""
    quiet = tmp_path / "mask.zarr"
    segpipe(*run_args(small, quiet, oracles["edgetam", "mask"][0], "edgetam", 4), check=True)
    proc = segpipe("repair", "--store", quiet, check=True)
    assert "no damage found" in proc.stderr, proc.stderr
    prompts, oracle = oracles["edgetam", "all"]
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, prompts, "edgetam", 4), check=True)
    proc = segpipe("repair", "--store", store, check=True)
    assert "no damage found" in proc.stderr, proc.stderr
    damaged = store / "memory/forward/session/recent_maskmem_features/c/2/0/0/0"
    damaged.unlink()
    proc = segpipe("repair", "--store", store, check=True)
    assert "recent_maskmem_features" in proc.stderr and "chunk 2" in proc.stderr, proc.stderr
    assert damaged.is_file()
    assert_tracked_as_sam2(store, oracle, "both")
    assert "no damage found" in segpipe("repair", "--store", store, check=True).stderr


def test_what_transformers_families_do_not_do_is_refused_before_any_write(small, tmp_path):
    """A mask prompt beside other objects (transformers' own EdgeTAM fails on it), and SAM
    2's --non-overlap, --object-start own and --object-batch: one line each, the encoded
    store as it was."""
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", 256, check=True)
    segpipe(
        "encode", "--store", store, "--model", "edgetam-mini", "--random-weights", 0, check=True
    )
    before = tree_digest(store)
    proc = segpipe("track", "--store", store, "--prompts", small / "prompts.json")
    assert_user_error(proc, "edgetam-mini", "mask prompt beside other objects")
    points = prompts_of(small, tmp_path, "edgetam", "all")
    own = ["--object-start", "own", "--direction", "forward"]
    for option in (["--non-overlap"], own, ["--object-batch", "2"]):
        proc = segpipe("track", "--store", store, "--prompts", points, *option)
        assert_user_error(proc, " ".join(option[:2]) if option is own else option[0], "alone")
    assert tree_digest(store) == before
    # `run` says so before it decodes, and so for a size the model cannot take
    fresh = tmp_path / "new.zarr"
    mask = run_args(small, fresh, small / "prompts.json", "edgetam", 4)
    assert_user_error(segpipe(*mask), "mask prompt beside other objects")
    size = [*run_args(small, fresh, points, "edgetam", 4), "--image-size", 128]
    assert_user_error(segpipe(*size), "at least 256")
    assert not fresh.exists()


def test_a_store_of_one_family_refuses_another(small, tmp_path):
    """A store encoded by SAM 3's tracker refuses SAM 2 and EdgeTAM, and an unknown model is
    named: one line each, the store as it was. (448: a size each of them takes.)"""
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", 448, check=True)
    encode = ("encode", "--store", store, "--random-weights", 0, "--model")
    segpipe(*encode, "sam3-tracker-mini", check=True)
    before = tree_digest(store)
    for other in ("sam2.1_hiera_t", "edgetam-mini"):
        assert_user_error(segpipe(*encode, other), "model name")
    assert_user_error(segpipe(*encode, "no-such-tracker"), "no-such-tracker")
    assert tree_digest(store) == before


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_studios_preview_is_the_sessions_output_on_the_prompt(small, oracles, tmp_path, family):
    """The studio's preview of each prompt (points, box, mask): from the frame encoded now
    (a store decoded only), then from the stored features, both transformers' output
    right after the prompt is added."""
    from segpipe.prompts import load
    from segpipe.settings import Encoding
    from segpipe.web.preview import Previewer

    model, size, _ = FAMILIES[family]
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", size, check=True)
    prompts = [p for which in ("all", "mask") for p in load(oracles[family, which][0], 24, 96, 72)]
    seen = []
    for encoded in (False, True):
        if encoded:
            segpipe("encode", "--store", store, "--model", model, "--random-weights", 0, check=True)
        previewer = Previewer(store, Encoding(model=model, random_weights=0), "cpu")
        for p in prompts:
            mask, score = previewer.mask([p])
            want_mask, want_score = hf_prompted(store, [p], family, oracles[family])
            assert (mask == want_mask).all(), (family, encoded, p.object_id)
            assert score == want_score, (family, encoded, p.object_id)
            seen.append(mask.any())
    assert any(seen)


def test_two_dask_workers_track_as_the_session(small, oracles, tmp_path):
    """`--workers 2`: the encode on both workers, the passes each in one task (SAM 3's
    tracker encodes its objects' memories as one batch: one group)."""
    prompts, oracle = oracles["sam3-tracker", "all"]
    store = tmp_path / "s.zarr"
    segpipe(*run_args(small, store, prompts, "sam3-tracker", 4, "--workers", 2), check=True)
    assert_tracked_as_sam2(store, oracle, "both")


def test_a_checkpoint_of_another_family_is_refused(small, tmp_path):
    """A transformers folder whose config is another model's, and a SAM 2 .pt file: one
    line each, the store as it was."""
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", 256, check=True)
    before = tree_digest(store)
    other = tmp_path / "sam2-hf"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "sam2_video"}))
    (other / "model.safetensors").write_bytes(b"")
    proc = segpipe("encode", "--store", store, "--model", "edgetam", "--checkpoint", other)
    assert_user_error(proc, "sam2_video", "not edgetam's")
    pt = tmp_path / "sam2.pt"
    pt.write_bytes(b"PK")
    proc = segpipe("encode", "--store", store, "--model", "edgetam", "--checkpoint", pt)
    assert_user_error(proc, "not a transformers checkpoint folder")
    assert tree_digest(store) == before


class GatedHub(http.server.BaseHTTPRequestHandler):
    """A hub that answers every request as huggingface.co does a gated repository to a
    client without a login."""

    def do_GET(self):
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model facebook/sam3 is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_gated_repository_without_a_login_says_how_to_log_in(small, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = tmp_path / "s.zarr"
        segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", 112, check=True)
        before = tree_digest(store)
        env = {
            "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "HF_HOME": str(tmp_path / "hf"),
            "HF_TOKEN": "",
        }
        proc = segpipe(
            "encode", "--store", store, "--model", "sam3-tracker", "--checkpoint",
            "hf:facebook/sam3", env=env,
        )  # fmt: skip
        assert_user_error(proc, "hf:facebook/sam3 is gated", "log in")
        assert tree_digest(store) == before
    finally:
        server.shutdown()


def test_a_dataset_with_per_object_masks_and_vos_inferences_non_overlap_refused(tmp_path):
    """`segpipe dataset` over a JPEG-folder video with SAM 3's tracker: per-object PNGs for
    every object and frame; without --per-obj-png-file (vos_inference's non-overlap, SAM 2's
    alone) one line before any video."""
    frames, masks = make_sample.make_clip(num_frames=8, width=80, height=60, seed=1)
    video = tmp_path / "JPEGImages" / "v1"
    video.mkdir(parents=True)
    for t, frame in enumerate(frames):
        Image.fromarray(frame).save(video / f"{t:05d}.jpg", quality=90)
    for o in range(3):
        folder = tmp_path / "PerObject" / "v1" / f"{o + 1:03d}"
        folder.mkdir(parents=True)
        Image.fromarray(masks[0, o].astype(np.uint8) * 255).save(folder / "00000.png")
    args = [
        "dataset", "--base-video-dir", tmp_path / "JPEGImages", "--input-mask-dir",
        tmp_path / "PerObject", "--output-mask-dir", tmp_path / "out", "--work-dir",
        tmp_path / "work", "--image-size", 112, "--random-weights", 0, "--model",
        "sam3-tracker-mini",
    ]  # fmt: skip
    assert_user_error(segpipe(*args), "--per-obj-png-file")
    assert not (tmp_path / "work").exists()
    segpipe(*args, "--per-obj-png-file", check=True)
    for o in ("001", "002", "003"):
        assert len(list((tmp_path / "out" / "v1" / o).glob("*.png"))) == 8
