"""EdgeTAM and SAM 3's tracker (through Hugging Face transformers), tracked chunk by chunk by
segpipe, bit for bit transformers' own session over the whole video (`hf_oracle`): chunk
sizes 1, 4 and 16; points, boxes and masks; forward, reverse and both; a kill -9 in the
middle of the tracking then a rerun; `--keep masks`. Small configs of the real
architectures with seeded random weights (`-mini` models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_user_error, run_code, segpipe
from hf_oracle import hf_model, hf_oracle
from oracle import assert_tracked_as_sam2

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
        net = hf_model(family, config(size, mini=True), seed=0)
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
kill_points.mid_write(sys.argv[1], 3)
kill_points.cli(sys.argv[2:])
"""


@pytest.mark.parametrize("family", list(FAMILIES))
def test_killed_mid_tracking_then_rerun_under_keep_masks(small, oracles, tmp_path, family):
    """Killed halfway through writing the third chunk of the forward pass's memory, then
    run again: only what was not committed is redone, and the result is transformers'."""
    prompts, oracle = oracles[family, "all"]
    store = tmp_path / "s.zarr"
    args = run_args(small, store, prompts, family, 4, "--keep", "masks")
    killed = run_code(KILL, "memory/forward/session/recent_frame", *args)
    assert killed.returncode == -9, killed.stderr
    done = RunStore.open(store).pass_ledger("forward").count()
    assert 0 < done < 5, done  # the kill landed mid-pass: some chunks committed, not all
    segpipe(*args, check=True)
    assert_tracked_as_sam2(store, oracle, "both")


def test_edgetam_refuses_a_mask_beside_other_objects(small, oracles, tmp_path):
    store = tmp_path / "s.zarr"
    proc = segpipe(*run_args(small, store, small / "prompts.json", "edgetam", 4))
    assert_user_error(proc, "edgetam", "mask prompt beside other objects")


def test_a_store_of_one_family_refuses_another(small, tmp_path):
    store = tmp_path / "s.zarr"
    segpipe("decode", small / "clip.mp4", "--store", store, "--image-size", 112, check=True)
    segpipe(
        "encode",
        "--store",
        store,
        "--model",
        "sam3-tracker-mini",
        "--random-weights",
        0,
        check=True,
    )
    proc = segpipe("encode", "--store", store, "--model", "sam2.1_hiera_t", "--random-weights", 0)
    assert_user_error(proc, "model name")
