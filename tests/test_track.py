"""Tracking against the oracle: SAM 2's own SAM2VideoPredictor on the same frames, weights and
prompts, whole video in memory. Every comparison is bit-for-bit: masks, and the object score
logits (with random weights thresholded masks are a coarse probe), as the store reads them
back with a missing chunk file detected, not read as fill.

The module's encoded stores are read-only for tests: a test that tracks copies the store it
needs, so no test depends on what another one did to a store first."""

import json
import random
import shutil
import signal
import time

import numpy as np
import pytest
from conftest import (
    IMAGE_SIZE,
    EncoderCalls,
    assert_user_error,
    chunk_files,
    ledger_count,
    popen_segpipe,
    read_checked,
    segpipe,
    tree_digest,
    tree_mtimes,
    wait_for,
)
from oracle import oracle_tracking, same_bits

from segpipe.settings import Decoding, Encoding, Execution, Tracking
from segpipe.stages.decode import decode
from segpipe.stages.encode import encode
from segpipe.stages.track.stage import track
from segpipe.store.runstore import RunStore

T = 40
CHUNK_SIZES = [1, 3, 7, 16, 64]


@pytest.fixture(scope="module")
def stores(tmp_path_factory, clip_dir, predictor):
    """One encoded store per chunk size (decoded and encoded in-process, by the stage
    functions the CLI calls). Read-only: copy one (`copy_of`) before tracking in it."""
    root = tmp_path_factory.mktemp("track")
    out = {}
    for C in CHUNK_SIZES:
        store = root / f"c{C}.zarr"
        decode(clip_dir / "clip.mp4", store, Decoding(C, IMAGE_SIZE), quiet=True)
        encode(store, Encoding(random_weights=0), Execution(progress=False), predictor=predictor)
        out[C] = store
    return out


@pytest.fixture(autouse=True)
def stores_stay_unchanged(request):
    """Guards the read-only rule: no test may change a shared store (`tracked7` too)."""
    if "stores" not in request.fixturenames:
        yield
        return
    stores = dict(request.getfixturevalue("stores"))
    if "tracked7" in request.fixturenames:
        stores["tracked7"] = request.getfixturevalue("tracked7")
    before = {C: tree_mtimes(s) for C, s in stores.items()}
    yield
    assert {C: tree_mtimes(s) for C, s in stores.items()} == before, "a shared store changed"


def copy_of(stores, chunk_size, tmp_path):
    return shutil.copytree(stores[chunk_size], tmp_path / f"c{chunk_size}.zarr")


@pytest.fixture(scope="module")
def tracked7(stores, clip_dir, predictor, tmp_path_factory):
    """The chunk-size-7 store tracked in both directions with the clip's prompts, in one
    band of rows. Read-only: copy it before tracking or exporting in it."""
    store = copy_of(stores, 7, tmp_path_factory.mktemp("tracked7"))
    track(
        store,
        clip_dir / "prompts.json",
        Tracking("both"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    return store


@pytest.fixture(scope="module")
def oracle(stores, clip_dir, predictor):
    return oracle_tracking(stores[CHUNK_SIZES[0]], clip_dir / "prompts.json")


def assert_matches_oracle(store, oracle, direction, label=""):
    """Masks equal and object scores bit-identical to SAM 2's, as read back from the store;
    each mask's area recorded is its pixel count."""
    masks, scores = read_checked(store, "masks"), read_checked(store, "object_scores")
    assert oracle.masks[direction].any()
    assert masks.shape == oracle.masks[direction].shape, (direction, label)
    assert np.array_equal(masks, oracle.masks[direction]), (direction, label)
    areas = read_checked(store, "object_areas")
    assert np.array_equal(areas, masks.sum((2, 3))), (direction, label)
    assert scores.dtype == np.float32, (direction, label)
    assert same_bits(scores, oracle.scores[direction]), (direction, label)


def test_prompts_cover_points_box_mask_on_different_frames(clip_dir):
    entries = json.loads((clip_dir / "prompts.json").read_text())["prompts"]
    assert {"points", "box", "mask"} <= {k for e in entries for k in e}
    assert len({e["frame"] for e in entries}) >= 2 and len({e["object"] for e in entries}) >= 2


def test_oracle_scores_cover_exactly_the_tracked_frames(oracle):
    for direction, expected in (
        ("both", np.ones(T, bool)),
        ("forward", np.arange(T) >= 9),
        ("reverse", np.arange(T) <= 9),
    ):
        scores = oracle.scores[direction]
        assert scores.shape == (T, 3) and scores.dtype == np.float32
        assert np.array_equal(~np.isnan(scores), np.repeat(expected[:, None], 3, 1)), direction
        assert len(np.unique(scores[expected])) > T // 2  # real logits, not a constant


# every chunk size once, every direction at least once: a pass's chunks do not depend on
# the direction setting (the reverse-only and forward-only passes are the passes of both)
CASES = [(1, "both"), (3, "forward"), (7, "reverse"), (16, "both"), (64, "both")]


@pytest.mark.parametrize("chunk_size, direction", CASES)
def test_masks_bit_identical_to_sam2(
    stores, oracle, clip_dir, predictor, chunk_size, direction, tmp_path
):
    store = copy_of(stores, chunk_size, tmp_path)
    track(
        store,
        clip_dir / "prompts.json",
        Tracking(direction),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    assert_matches_oracle(store, oracle, direction, chunk_size)
    assert read_checked(store, "masks").shape == (T, 3, 120, 160)
    assert RunStore.open(store).array("masks").attrs["object_ids"] == [1, 2, 3]
    # one zarr chunk per object and pipeline chunk, every one written
    assert RunStore.open(store).array("masks").chunks == (chunk_size, 1, 120, 160)
    assert chunk_files(store, ["masks"]) == {
        f"masks/c/{k}/{o}/0/0" for k in range(-(-T // chunk_size)) for o in range(3)
    }
    tracked = read_checked(store, "tracked")  # (T, O): per object
    assert tracked.shape == (T, 3)
    expected = {
        "both": np.ones(T, bool),
        "forward": np.arange(T) >= 9,
        "reverse": np.arange(T) <= 9,
    }[direction]
    assert np.array_equal(tracked, np.repeat(expected[:, None], 3, axis=1))


# (direction, window, chunk size): each window's passes as SAM 2's propagate_in_video
# arguments, written out by hand from `track --frames`'s documented meaning (prompts on
# frames 9, 14, 20; forward from max(A, 9) to B-1, reverse from min(B-1, 9) down to A)
WINDOWS = [
    ("forward", (12, 30), 7, {"forward": dict(start_frame_idx=12, max_frame_num_to_track=17)}),
    ("forward", (0, 17), 3, {"forward": dict(start_frame_idx=9, max_frame_num_to_track=7)}),
    ("reverse", (3, 30), 7, {"reverse": dict(start_frame_idx=9, max_frame_num_to_track=6)}),
    ("reverse", (2, 6), 3, {"reverse": dict(start_frame_idx=5, max_frame_num_to_track=3)}),
    (
        "both",
        (5, 25),
        3,
        {
            "forward": dict(start_frame_idx=9, max_frame_num_to_track=15),
            "reverse": dict(start_frame_idx=9, max_frame_num_to_track=4),
        },
    ),
]


@pytest.mark.parametrize("direction, window, chunk_size, arguments", WINDOWS)
def test_a_tracking_window_is_sam2s_start_frame_and_frame_count(
    stores, clip_dir, predictor, direction, window, chunk_size, arguments, tmp_path, request
):
    store = copy_of(stores, chunk_size, tmp_path)
    lo, hi = window
    track(
        store,
        clip_dir / "prompts.json",
        Tracking(direction, frames=f"{lo}:{hi}"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    want = oracle_tracking(
        stores[CHUNK_SIZES[0]],
        clip_dir / "prompts.json",
        directions=list(arguments),
        arguments=arguments,
    )
    assert_matches_oracle(store, want, direction, window)
    tracked = read_checked(store, "tracked")
    assert tracked.any() and not tracked[:lo].any() and not tracked[hi:].any()
    assert RunStore.open(store).attrs["track"]["frames"] == [lo, hi]
    # a second track without --frames resumes the same window: nothing to do
    before = tree_digest(store)
    track(store, None, execution=Execution(progress=False), predictor=predictor)
    assert tree_digest(store) == before
    if direction == "both":  # and `--frames :` tracks the whole video again, as SAM 2 does
        track(
            store,
            None,
            Tracking(frames=":"),
            execution=Execution(progress=False),
            predictor=predictor,
        )
        assert "frames" not in RunStore.open(store).attrs["track"]
        assert_matches_oracle(store, request.getfixturevalue("oracle"), "both", "whole")


def test_masks_in_bands_of_rows_are_the_same(
    stores, tracked7, oracle, clip_dir, predictor, tmp_path, monkeypatch
):
    """Large frames chunk their masks in bands of rows too (a zarr chunk stays within
    `MASK_CHUNK_BYTES`): here 50 rows at chunk size 7, so bands 0..49, 50..99 and a short
    100..119; the chunk of the prompts is written by both passes. Same masks as SAM 2, every
    band's file written, and exports byte for byte those of the one-band store."""
    from segpipe.stages.export.stage import export
    from segpipe.store import masks as maskio

    whole = shutil.copytree(tracked7, tmp_path / "whole" / "c7.zarr")
    assert RunStore.open(whole).array("masks").chunks == (7, 1, 120, 160)  # one band
    monkeypatch.setattr(maskio, "MASK_CHUNK_BYTES", 7 * 160 * 50)
    store = copy_of(stores, 7, tmp_path)
    track(
        store,
        clip_dir / "prompts.json",
        Tracking("both"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    assert RunStore.open(store).array("masks").chunks == (7, 1, 50, 160)
    assert_matches_oracle(store, oracle, "both", 7)
    assert chunk_files(store, ["masks"]) == {
        f"masks/c/{k}/{o}/{band}/0"
        for k in range(-(-T // 7))
        for o in range(3)
        for band in range(3)
    }
    for fmt in ("davis", "overlay"):
        ours = export(store, fmt, tmp_path / f"ours_{fmt}", quiet=True)
        ref = export(whole, fmt, tmp_path / f"ref_{fmt}", quiet=True)
        assert (
            tree_digest(ours) == tree_digest(ref)
            if ours.is_dir()
            else ours.read_bytes() == ref.read_bytes()
        ), fmt


def test_kill_mid_track_then_resume_matches_sam2(stores, oracle, clip_dir, tmp_path, predictor):
    """`segpipe track` killed (-9) mid-pass, then tracked again with the stored prompts and
    direction (in this process): SAM 2's masks."""
    rng = random.Random(4)
    store = copy_of(stores, 3, tmp_path)
    target = rng.randint(1, 8)
    proc = popen_segpipe(
        "track", "--store", store, "--prompts", clip_dir / "prompts.json", "--direction", "both"
    )
    assert wait_for(lambda: ledger_count(store, "track_forward") >= target, proc, timeout=300)
    time.sleep(rng.uniform(0, 0.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ledger_count(store, "track_forward") < 11  # 31 forward frames in chunks of 3
    track(
        store, None, execution=Execution(progress=False), predictor=predictor
    )  # the stored prompts and direction
    assert_matches_oracle(store, oracle, "both", "killed")


def test_reprompting_retracks_without_the_encoder(tracked7, clip_dir, tmp_path, predictor):
    """A store tracked with the clip's prompts, tracked again with new ones: the passes run
    again without the image encoder and give SAM 2's masks for the new prompts."""
    store = shutil.copytree(tracked7, tmp_path / "c7.zarr")
    masks = np.load(clip_dir / "masks.npy")
    ys, xs = np.nonzero(masks[25, 2])
    second = tmp_path / "second.json"
    second.write_text(
        json.dumps(
            {
                "prompts": [
                    {
                        "object": 7,
                        "frame": 25,
                        "points": [[float(xs.mean()), float(ys.mean())]],
                        "labels": [1],
                    },
                    {"object": 1, "frame": 30, "box": [10, 10, 60, 50]},
                ]
            }
        )
    )
    calls = EncoderCalls(predictor)
    track(store, second, Tracking("both"), execution=Execution(progress=False), predictor=predictor)
    calls.close()
    assert calls.count == 0
    assert RunStore.open(store).array("masks").attrs["object_ids"] == [7, 1]
    assert_matches_oracle(store, oracle_tracking(store, second), "both", "re-prompted")
    before = tree_digest(store)
    track(
        store, second, execution=Execution(progress=False), predictor=predictor
    )  # finished: a no-op
    assert tree_digest(store) == before


def test_sam2_itself_crashes_without_the_memory_cast(stores, clip_dir):
    """Why `install_memory_cast` exists: object 2 is tracked before its first prompt."""
    import torch
    from sam2.build_sam import build_sam2_video_predictor

    torch.manual_seed(0)
    raw = build_sam2_video_predictor(
        "configs/sam2.1/sam2.1_hiera_t.yaml",
        device="cpu",
        hydra_overrides_extra=[f"++model.image_size={IMAGE_SIZE}"],
    )
    with pytest.raises(RuntimeError, match="dtype"):
        oracle_tracking(stores[64], clip_dir / "prompts.json", raw)


def test_the_memory_cast_changes_nothing_where_sam2_does_not_crash(
    stores, clip_dir, predictor, tmp_path
):
    """segpipe always installs the memory cast; the oracle applies it only where SAM 2
    crashes without it. Where SAM 2 does not crash (every object prompted on the first
    tracked frame), SAM 2 with and without the cast, and segpipe, agree bit for bit. (From
    frame 22, inside a chunk of 7: 18 frames, more than SAM 2's 7 memories and 16 object
    pointers.)"""
    from oracle import memory_cast, sam2_predictor

    masks = np.load(clip_dir / "masks.npy")
    entries = []
    for o in range(3):
        ys, xs = np.nonzero(masks[22, o])
        entries.append(
            {
                "object": o + 1,
                "frame": 22,
                "points": [[float(xs.mean()), float(ys.mean())]],
                "labels": [1],
            }
        )
    prompts = tmp_path / "first.json"
    prompts.write_text(json.dumps({"prompts": entries}))
    sam2 = sam2_predictor("sam2.1_hiera_t", IMAGE_SIZE, seed=0)
    plain = oracle_tracking(stores[64], prompts, sam2, directions=["forward"])
    handle = memory_cast(sam2)
    try:
        cast = oracle_tracking(stores[64], prompts, sam2, directions=["forward"])
    finally:
        handle.remove()
    assert plain.masks["forward"].any()
    assert np.array_equal(plain.masks["forward"], cast.masks["forward"])
    assert same_bits(plain.scores["forward"], cast.scores["forward"])
    store = copy_of(stores, 7, tmp_path)
    track(
        store,
        prompts,
        Tracking("forward"),
        execution=Execution(progress=False),
        predictor=predictor,
    )
    assert_matches_oracle(store, plain, "forward", "no crash")


BAD_PROMPTS = {
    "frame_out_of_range": (
        {"object": 1, "frame": 40, "points": [[5, 5]], "labels": [1]},
        "out of range",
    ),
    "point_outside": ({"object": 1, "frame": 2, "points": [[5, 500]], "labels": [1]}, "outside"),
    "box_outside": ({"object": 1, "frame": 2, "box": [0, 0, 170, 20]}, "box"),
    "bad_label": ({"object": 1, "frame": 2, "points": [[5, 5]], "labels": [2]}, "labels must be"),
    "points_without_labels": ({"object": 1, "frame": 2, "points": [[5, 5]]}, "together"),
    "unknown_key": (
        {"object": 1, "frame": 2, "points": [[5, 5]], "labels": [1], "colour": 3},
        "unknown key",
    ),
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
