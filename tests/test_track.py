"""Tracking against the oracle: SAM 2's own SAM2VideoPredictor on the same frames, weights and
prompts, whole video in memory. Every comparison is bit-for-bit."""
import json
import random
import shutil
import signal

import numpy as np
import pytest
import zarr

from conftest import (IMAGE_SIZE, EncoderCalls, assert_user_error, ledger_count, popen_segpipe,
                      segpipe, tree_digest, wait_for)
from oracle import oracle_masks
from segpipe.stages.encode import encode
from segpipe.stages.track import track

T = 40
CHUNK_SIZES = [1, 3, 7, 16, 64]


@pytest.fixture(scope="module")
def stores(tmp_path_factory, clip_dir, predictor):
    """One encoded store per chunk size (decode by the CLI, encode in-process)."""
    root = tmp_path_factory.mktemp("track")
    out = {}
    for C in CHUNK_SIZES:
        store = root / f"c{C}.zarr"
        segpipe("decode", clip_dir / "clip.mp4", "--store", store, "--chunk-size", C,
                "--image-size", IMAGE_SIZE, "--quiet", check=True)
        encode(store, random_seed=0, quiet=True, predictor=predictor)
        out[C] = store
    return out


@pytest.fixture(scope="module")
def oracle(stores, clip_dir, predictor):
    return oracle_masks(stores[CHUNK_SIZES[0]], clip_dir / "prompts.json", predictor)


def test_prompts_cover_points_box_mask_on_different_frames(clip_dir):
    entries = json.loads((clip_dir / "prompts.json").read_text())["prompts"]
    assert {"points", "box", "mask"} <= {k for e in entries for k in e}
    assert len({e["frame"] for e in entries}) >= 2 and len({e["object"] for e in entries}) >= 2


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_masks_bit_identical_to_sam2(stores, oracle, clip_dir, predictor, chunk_size):
    store = stores[chunk_size]
    for direction in ("both", "forward", "reverse"):
        track(store, clip_dir / "prompts.json", direction, quiet=True, predictor=predictor)
        group = zarr.open_group(str(store), mode="r")
        masks = group["masks"][...]
        assert masks.shape == (T, 3, 120, 160) and group["masks"].attrs["object_ids"] == [1, 2, 3]
        assert oracle[direction].any()
        assert np.array_equal(masks, oracle[direction]), (direction, chunk_size)
        tracked = group["tracked"][...]
        expected = {"both": np.ones(T, bool), "forward": np.arange(T) >= 9,
                    "reverse": np.arange(T) <= 9}[direction]
        assert np.array_equal(tracked, expected)
        assert np.isnan(group["object_scores"][...][~tracked]).all()


def test_kill_mid_track_then_resume_matches_sam2(stores, oracle, clip_dir, tmp_path):
    rng = random.Random(4)
    store = shutil.copytree(stores[3], tmp_path / "s.zarr")
    target = rng.randint(1, 8)
    proc = popen_segpipe("track", "--store", store, "--prompts", clip_dir / "prompts.json",
                         "--direction", "both")
    assert wait_for(lambda: ledger_count(store, "track_forward") >= target, proc, timeout=300)
    import time
    time.sleep(rng.uniform(0, 0.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ledger_count(store, "track_forward") < 11  # 31 forward frames in chunks of 3
    segpipe("track", "--store", store, "--quiet", check=True)  # the stored prompts and direction
    assert np.array_equal(zarr.open_group(str(store), mode="r")["masks"][...], oracle["both"])


def test_reprompting_retracks_without_the_encoder(stores, clip_dir, tmp_path, predictor):
    store = shutil.copytree(stores[7], tmp_path / "s.zarr")
    track(store, clip_dir / "prompts.json", "both", quiet=True, predictor=predictor)
    masks = np.load(clip_dir / "masks.npy")
    ys, xs = np.nonzero(masks[25, 2])
    second = tmp_path / "second.json"
    second.write_text(json.dumps({"prompts": [
        {"object": 7, "frame": 25, "points": [[float(xs.mean()), float(ys.mean())]], "labels": [1]},
        {"object": 1, "frame": 30, "box": [10, 10, 60, 50]},
    ]}))
    calls = EncoderCalls(predictor)
    track(store, second, quiet=True, predictor=predictor)  # the store's direction: both
    calls.close()
    assert calls.count == 0
    group = zarr.open_group(str(store), mode="r")
    assert group["masks"].attrs["object_ids"] == [7, 1]
    expected = oracle_masks(store, second, predictor)["both"]
    assert np.array_equal(group["masks"][...], expected)
    before = tree_digest(store)
    track(store, second, quiet=True, predictor=predictor)  # finished: a no-op
    assert tree_digest(store) == before


def test_sam2_itself_crashes_without_the_memory_cast(stores, clip_dir):
    """Why `install_memory_cast` exists: object 2 is tracked before its first prompt."""
    import torch
    from sam2.build_sam import build_sam2_video_predictor
    torch.manual_seed(0)
    raw = build_sam2_video_predictor("configs/sam2.1/sam2.1_hiera_t.yaml", device="cpu",
                                     hydra_overrides_extra=[f"++model.image_size={IMAGE_SIZE}"])
    with pytest.raises(RuntimeError, match="dtype"):
        oracle_masks(stores[64], clip_dir / "prompts.json", raw)


BAD_PROMPTS = {
    "frame_out_of_range": ({"object": 1, "frame": 40, "points": [[5, 5]], "labels": [1]}, "out of range"),
    "point_outside": ({"object": 1, "frame": 2, "points": [[5, 500]], "labels": [1]}, "outside"),
    "box_outside": ({"object": 1, "frame": 2, "box": [0, 0, 170, 20]}, "box"),
    "bad_label": ({"object": 1, "frame": 2, "points": [[5, 5]], "labels": [2]}, "labels must be"),
    "points_without_labels": ({"object": 1, "frame": 2, "points": [[5, 5]]}, "together"),
    "unknown_key": ({"object": 1, "frame": 2, "points": [[5, 5]], "labels": [1], "colour": 3}, "unknown key"),
    "mask_wrong_size": ({"object": 1, "frame": 2, "mask": "small.png"}, "the video is 160x120"),
    "mask_missing": ({"object": 1, "frame": 2, "mask": "nowhere.png"}, "not found"),
}


@pytest.mark.parametrize("case", [*BAD_PROMPTS, "empty_list", "not_json"])
def test_bad_prompts_are_refused_and_nothing_is_written(stores, tmp_path, case):
    from PIL import Image
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(tmp_path / "small.png")
    path = tmp_path / "prompts.json"
    if case == "empty_list":
        path.write_text('{"prompts": []}')
        words = ["empty"]
    elif case == "not_json":
        path.write_text('{"prompts": [')
        words = ["not valid JSON"]
    else:
        entry, word = BAD_PROMPTS[case]
        good = {"object": 2, "frame": 1, "box": [1, 1, 20, 20]}
        path.write_text(json.dumps({"prompts": [good, entry]}))
        words = ["prompt #1", word]
    store = stores[16]
    before = tree_digest(store)
    assert_user_error(segpipe("track", "--store", store, "--prompts", path), *words)
    assert tree_digest(store) == before
