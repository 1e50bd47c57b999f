"""`run --keep masks`: frames and features dropped as the run goes, same masks, resumable,
and re-prompting decodes and encodes again exactly what the new passes need."""

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    IMAGE_SIZE,
    EncoderCalls,
    assert_same_store,
    assert_user_error,
    freeze,
    ledger_count,
    ledger_records,
    popen_segpipe,
    read_checked,
    run_args,
    run_code,
    run_in_process,
    same_values,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)
from file_log import chunks_opened
from oracle import assert_tracked_as_sam2, oracle_tracking

STAGES = [
    "decode",
    "encode",
    "track_forward",
    "track_reverse",
    "export_davis",
    "export_vis-json",
    "export_overlay",
]


def chunk_files(store: Path, name: str) -> list[str]:
    folder = store / name / "c"
    return (
        sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        if folder.is_dir()
        else []
    )


def export_files(store: Path) -> dict:
    return tree_digest(store.with_name(store.name.removesuffix(".zarr") + ".export"))


def assert_same_results(a: Path, b: Path) -> None:
    for name in ("masks", "object_scores", "tracked"):
        assert same_values(read_checked(a, name), read_checked(b, name)), name
    assert export_files(a) == export_files(b)


RECORDING = """
import sys
sys.path.insert(0, "tests")
import file_log
import kill_points

file_log.record("/features/level", sys.argv[1])
kill_points.cli(sys.argv[2:])
"""


def recorded_run(store: Path, args) -> Path:
    """segpipe's command line with `args`, the feature files it opens recorded in a log
    beside `store` (returned)."""
    log = store.with_name("features.log")
    proc = run_code(RECORDING, log, *args)
    assert proc.returncode == 0, proc.stderr
    return log


@pytest.fixture(scope="module")
def keep_all(small, tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("all") / "run.zarr"
    recorded_run(store, [*run_args(small, store), "--keep", "all", "--quiet"])
    return store


@pytest.fixture(scope="module")
def keep_masks(small, tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("masks") / "run.zarr"
    recorded_run(store, [*run_args(small, store), "--keep", "masks", "--quiet"])
    return store


PROMPTED_CHUNKS = {1, 2}  # the small clip's prompts: frames 5, 8 and 11, in chunks of 4


def test_the_tracker_never_reads_back_the_features_it_was_handed(keep_all):
    """`run` encodes each chunk just before a pass tracks it and hands the features to the
    tracker in memory: under `--keep all` every chunk's features are written (and committed),
    and not one feature file is read back, though both passes read the prompted chunks
    (the prompts are applied from them, then each pass tracks the first)."""
    log = keep_all.with_name("features.log")
    assert chunks_opened(log, "w") == set(range(6))
    assert chunks_opened(log, "r") == set()


def test_keep_masks_writes_only_the_features_a_later_read_needs(keep_masks, keep_all):
    """Under `--keep masks` a chunk that only the pass at hand reads (the forward pass's
    chunks after the prompts, the reverse pass's before them) never reaches the disk: the
    features written are those of the prompted chunks, which both passes read. The masks
    and exports are those of `--keep all`."""
    log = keep_masks.with_name("features.log")
    assert chunks_opened(log, "w") == PROMPTED_CHUNKS
    assert chunks_opened(log, "r") == set()
    assert_same_results(keep_all, keep_masks)


def test_keep_masks_drops_frames_and_features_and_gives_the_same_masks(keep_all, keep_masks):
    assert_same_results(keep_all, keep_masks)
    assert chunk_files(keep_all, "frames") and chunk_files(keep_all, "features/level2")
    for name in ("frames", "features/level0", "features/level1", "features/level2"):
        assert chunk_files(keep_masks, name) == [], name
    # what stays: pts, timestamps, digests, masks, memory
    assert chunk_files(keep_masks, "pts") == chunk_files(keep_all, "pts")
    assert chunk_files(keep_masks, "masks") == chunk_files(keep_all, "masks")
    # dropped is not damaged
    proc = segpipe("repair", "--store", keep_masks, check=True)
    assert "no damage" in proc.stderr.lower(), proc.stderr


def test_kill_9_during_a_keep_masks_run_then_rerun(small, keep_all, tmp_path):
    """kill -9 at seeded random moments of a `--keep masks` run (each landing while the run
    is working: its ledgers moved since it started); the rerun ends with the same masks
    and exports as an uninterrupted `--keep all` run."""
    rng = random.Random(3)
    store = tmp_path / "run.zarr"
    total = sum(ledger_count(keep_all, s) for s in STAGES)

    def progress():
        return sum(ledger_count(store, s) for s in STAGES) + ledger_count(store, "dropped_features")

    killed = 0
    for target in sorted(rng.randint(1, total - 2) for _ in range(4)):
        before = progress()
        proc = popen_segpipe(*run_args(small, store), "--keep", "masks")
        wait_for(lambda: progress() >= max(target, before + 1), proc, timeout=300)
        time.sleep(rng.uniform(0, 0.2))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed += 1
    assert killed >= 3
    run_in_process(small, store, keep="masks")  # the same run again, to the end (in this process)
    assert_same_results(keep_all, store)
    # and SAM 2's own predictor on the same frames (those --keep all kept) and prompts
    assert_tracked_as_sam2(store, oracle_tracking(keep_all, small / "prompts.json"))
    for name in ("frames", "features/level2"):
        assert chunk_files(store, name) == [], name
    # new prompts on that store, a reverse pass from frame 9: chunks 2, 1, 0 (frames 0..11)
    # are decoded again backwards and encoded again, nothing else; as a fresh run
    prompts = tmp_path / "new.json"
    prompts.write_text(json.dumps({"prompts": [{"object": 4, "frame": 9, "box": [10, 5, 50, 40]}]}))
    assert retrack(store, prompts, "reverse") == 12
    assert_same_as_fresh(small, store, prompts, "reverse", tmp_path)


def retrack(store: Path, prompts: Path, direction: str) -> int:
    """`track` in this process with new prompts; the frames the image encoder saw."""
    from segpipe.model import Weights, build_model
    from segpipe.settings import Execution, Tracking
    from segpipe.stages.track.stage import track

    predictor = build_model("sam2.1_hiera_t", IMAGE_SIZE, Weights(random_seed=0))
    calls = EncoderCalls(predictor)
    try:
        track(
            store,
            prompts,
            Tracking(direction),
            execution=Execution(progress=False),
            predictor=predictor,
        )
    finally:
        calls.close()
    return calls.count


def assert_same_as_fresh(small: Path, store: Path, prompts: Path, direction: str, tmp_path: Path):
    """The masks of `store` are those of a fresh `run --prompts PROMPTS --direction D
    --export none` (made in this process: `segpipe.run`, what the command calls)."""
    import segpipe as api

    fresh = tmp_path / "fresh.zarr"
    api.run(
        small / "clip.mp4",
        fresh,
        prompts,
        tracking=api.Tracking(direction=direction),
        decoding=api.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        encoding=api.Encoding(random_weights=0),
        output=api.Output(exports=[]),
        execution=api.Execution(progress=False),
    )
    for name in ("masks", "object_scores", "tracked"):
        assert same_values(read_checked(store, name), read_checked(fresh, name)), name
    for name in ("frames", "features/level2"):
        assert chunk_files(store, name) == [], name  # dropped again after use


def test_new_prompts_on_a_dropped_store_reencode_only_what_the_passes_need(
    small, keep_masks, tmp_path
):
    """New prompts (one object on frame 17, forward) on a `--keep masks` store: the chunks
    of frames 16..23 are decoded and encoded again, nothing else; the masks are those of a
    fresh `--keep all` run with the same prompts."""
    store = tmp_path / "masks.zarr"
    shutil.copytree(keep_masks, store)
    prompts = tmp_path / "new.json"
    prompts.write_text(
        json.dumps({"prompts": [{"object": 7, "frame": 17, "box": [20, 10, 60, 50]}]})
    )
    assert retrack(store, prompts, "forward") == 24 - 16  # chunks 4 and 5 (chunk size 4), once each
    assert_same_as_fresh(small, store, prompts, "forward", tmp_path)


def test_retracking_without_the_source_refuses_in_one_line(small, keep_masks, tmp_path):
    """The source is gone (the store's recorded source path now names no file): new passes
    need chunks decoded again, so `track` refuses in one line and changes nothing."""
    import zarr

    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    group = zarr.open_group(str(store), mode="r+")
    group.attrs["source"] = {**group.attrs["source"], "path": str(tmp_path / "moved.mp4")}
    before = tree_digest(store)
    proc = segpipe(
        "track", "--store", store, "--prompts", small / "prompts.json", "--direction", "forward"
    )
    assert_user_error(proc, "source video", "gone")
    assert tree_digest(store) == before


def test_a_finished_store_without_its_source_tracks_as_a_no_op(keep_masks, tmp_path):
    """Nothing left to track: no chunk needs decoding again, so a gone source is no matter."""
    import zarr

    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    group = zarr.open_group(str(store), mode="r+")
    group.attrs["source"] = {**group.attrs["source"], "path": str(tmp_path / "moved.mp4")}
    before = tree_digest(store)
    proc = segpipe("track", "--store", store, check=True)
    assert "already complete" in proc.stderr, proc.stderr
    assert tree_digest(store) == before


def test_frames_that_decode_differently_now_are_refused(small, keep_masks, tmp_path):
    """The stored digests of frames 20..23 no longer match what the source gives (as another
    decoder might): re-tracking that needs them refuses in one line rather than making
    other features."""
    import zarr

    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    digests = zarr.open_array(str(store / "frame_digests"), mode="r+")
    digests[21] = (np.asarray(digests[21]) + 1).astype(np.uint8)
    prompts = tmp_path / "new.json"
    prompts.write_text(
        json.dumps({"prompts": [{"object": 7, "frame": 17, "box": [20, 10, 60, 50]}]})
    )
    proc = segpipe("track", "--store", store, "--prompts", prompts, "--direction", "forward")
    assert_user_error(proc, "decodes differently", "frame 21")
    assert chunk_files(store, "frames") == []  # nothing restored from the other frames


def test_files_a_crash_left_after_a_drop_are_swept(keep_all, keep_masks, tmp_path):
    """A kill between a drop's record and its deletes leaves the files: the next track (here
    with nothing else to do) deletes them."""
    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    for name, k in (("frames", 1), ("features/level2", 2)):
        left = Path(name) / "c" / str(k) / "0" / "0" / "0"
        (store / left).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(keep_all / left, store / left)
        assert chunk_files(store, name) == [str(left.relative_to(Path(name) / "c"))]
    segpipe("track", "--store", store, check=True)
    for name in ("frames", "features/level2"):
        assert chunk_files(store, name) == [], name


def test_encode_on_its_own_drops_the_frames_it_decoded_again(keep_masks, tmp_path):
    """`encode --force` (other settings) on a `--keep masks` store decodes every chunk again
    to encode it; the frames go again once encoded, the features stay (no pass read them)."""
    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    segpipe(
        "encode",
        "--store",
        store,
        "--random-weights",
        0,
        "--embedding-dtype",
        "bfloat16",
        "--force",
        "--quiet",
        check=True,
    )
    assert chunk_files(store, "frames") == []
    assert len(chunk_files(store, "features/level2")) == 6


def test_a_keep_masks_store_is_not_run_on_dask(small, keep_masks, tmp_path):
    """Passes side by side on workers would each drop what the other still reads: refused in
    one line, the store untouched, whether `--keep masks` is given or the store's."""
    store = tmp_path / "run.zarr"
    shutil.copytree(keep_masks, store)
    before = tree_digest(store)
    for args in (
        ("track", "--store", store, "--workers", 1),
        (*run_args(small, store), "--workers", 1),
        (*run_args(small, tmp_path / "new.zarr"), "--keep", "masks", "--workers", 1),
    ):
        assert_user_error(segpipe(*args), "--keep masks", "--workers")
    assert tree_digest(store) == before and not (tmp_path / "new.zarr").exists()


KILL_MID_FEATURE_WRITE = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.mid_write(sys.argv[1], nth=1)
kill_points.cli(sys.argv[2:])
"""


# --keep masks writes the prompted chunks' features only: the 2nd of them; --keep all writes
# every chunk's, behind its tracking: chunk 3's (a chunk the forward pass tracks after them)
@pytest.mark.parametrize(
    "keep, part", [("masks", "/features/level0/c/2/"), ("all", "/features/level1/c/3/")]
)
def test_a_kill_mid_feature_write_leaves_no_temp_file_behind(small, keep_all, keep, part, tmp_path):
    """zarr writes each chunk file as `<file>.<random>.partial` and renames it: a kill in
    the middle of writing a chunk of features (up to 512 MB at 1024) leaves that temp file.
    The rerun's commit of the chunk removes it; no `.partial` is left in the store, and it
    is not counted as held. Under `--keep all` (features written behind the tracking, by
    another thread) the rerun ends with the store of an uninterrupted run, array for array."""
    store = tmp_path / "run.zarr"
    args = [*map(str, run_args(small, store)), "--keep", keep]
    proc = run_code(KILL_MID_FEATURE_WRITE, part, *args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert list(store.glob("features/**/*.partial")), "the kill landed mid-write"
    run_in_process(small, store, keep=keep)  # the same run again, to the end (in this process)
    assert list(store.rglob("*.partial")) == []
    assert_same_results(keep_all, store)
    if keep == "all":
        assert_same_store(keep_all, store)


HOLD_REDECODING = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.hold_redecoding(int(sys.argv[1]), sys.argv[2])
kill_points.cli(sys.argv[3:])
"""


def test_kill_9_with_the_decode_read_ahead_in_flight_then_rerun(small, keep_all, tmp_path):
    """Under `--keep masks` the forward pass decodes chunk k+1 again ahead, on the frames
    reader's thread, while it tracks chunk k. Chunk 4's decoding is held there: the pass
    tracks and commits chunk 3, then a kill -9 lands with that read-ahead in flight and
    chunk 4 not tracked; the rerun ends with the masks and exports of an uninterrupted
    run."""
    store, flag = tmp_path / "run.zarr", tmp_path / "never"
    args = [*map(str, run_args(small, store)), "--keep", "masks", "--quiet"]
    proc = spawn(
        ["4", flag, *args], code=HOLD_REDECODING, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        tracked = wait_for(lambda: 3 in ledger_records(store, "track_forward"), proc, timeout=300)
        time.sleep(0.5)  # the pass is now waiting for chunk 4's frames
        freeze(proc)
        forward = set(ledger_records(store, "track_forward"))
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert tracked, f"chunk 3 was not tracked while chunk 4 was decoded ahead: {err[-2000:]}"
    assert forward == {1, 2, 3}, forward  # killed with chunk 4's read-ahead in flight
    reader = Path(str(flag) + ".thread").read_text()
    assert reader.startswith("segpipe-frames"), reader  # the read-ahead, not the pass itself
    run_in_process(small, store, keep="masks")
    assert_same_results(keep_all, store)


WAIT_BEFORE_FEATURE_WRITE = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.wait_before_write(sys.argv[1], 1, sys.argv[2])
kill_points.cli(sys.argv[3:])
"""


def test_keep_all_writes_the_features_behind_the_tracking(small, keep_all, tmp_path):
    """Under `--keep all` a chunk's features are written, fsynced and committed by a writer
    thread while the pass tracks the chunk from memory: with the write of chunk 3's
    features held back (its first file waits for a flag), the forward pass still tracks and
    commits chunk 3, whose features are not yet recorded encoded. Let go, the run ends with
    the store of an uninterrupted run."""
    store, flag = tmp_path / "run.zarr", tmp_path / "go"
    args = [*map(str, run_args(small, store)), "--keep", "all", "--quiet"]
    proc = spawn(
        ["/features/level0/c/3/", flag, *args],
        code=WAIT_BEFORE_FEATURE_WRITE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        tracked = wait_for(lambda: 3 in ledger_records(store, "track_forward"), proc, timeout=300)
        assert tracked, "chunk 3 was not tracked while its features' write waited"
        assert 3 not in ledger_records(store, "encode")
        assert not [f for f in (store / "features/level0/c/3").rglob("*") if f.is_file()]
    finally:
        flag.touch()
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    # one write in flight: handing over chunk 4's waited for chunk 3's commit
    assert ledger_records(store, "encode")[3] <= ledger_records(store, "track_forward")[4]
    assert_same_store(keep_all, store)
    assert_same_results(keep_all, store)


def test_keep_masks_records_a_chunk_behind_the_tracking_and_before_the_pass_commits_it(
    small, keep_all, tmp_path, monkeypatch
):
    """Under `--keep masks` chunk 3, which only the forward pass tracks, is never written: its
    records (encoded, its features and frames dropped) are made by the writer thread while
    the pass tracks the chunk from memory. Held back until the pass has tracked all of
    chunk 3 and hands it over (`tracked`), and for two seconds more, the record still lands
    before the pass's commit of chunk 3: a chunk tracked but never recorded encoded would
    stay so (nothing encodes it again under `--keep masks`). The run ends with the results
    of an uninterrupted `--keep all` run."""
    import threading

    from segpipe.stages import encode
    from segpipe.stages.track.supply import ChunkSupply

    real_write, real_tracked = encode.write_features, ChunkSupply.tracked
    handed, seen = threading.Event(), {}

    def tracked(self, unit, k):
        if k == 3:
            handed.set()
        return real_tracked(self, unit, k)

    def held_back(store, k, encoded, write=True):
        if k == 3:
            seen["thread"] = threading.current_thread().name
            seen["handed"] = handed.wait(timeout=60)  # never, were it the pass's own thread
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and 3 not in ledger_records(
                store.path, "track_forward"
            ):
                time.sleep(0.01)
            seen["committed first"] = 3 in ledger_records(store.path, "track_forward")
            seen["write"] = write
        return real_write(store, k, encoded, write)

    monkeypatch.setattr(encode, "write_features", held_back)
    monkeypatch.setattr(ChunkSupply, "tracked", tracked)
    store = tmp_path / "run.zarr"
    run_in_process(small, store, keep="masks")
    assert seen["thread"].startswith("segpipe-features"), seen
    assert seen["handed"] and not seen["write"], seen  # tracked from memory, never written
    assert not seen["committed first"], "the pass committed chunk 3 before its encode record"
    assert ledger_records(store, "encode")[3] <= ledger_records(store, "track_forward")[3]
    assert 3 in ledger_records(store, "dropped_features")
    assert not chunk_files(store, "features/level0")
    assert_same_results(keep_all, store)


@pytest.mark.parametrize("keep", ["all", "masks"])
def test_a_failed_write_behind_stops_the_run_and_a_rerun_ends_as_an_uninterrupted_one(
    small, keep_all, tmp_path, monkeypatch, keep
):
    """The features are written (under `--keep masks`, recorded) by a writer thread: when
    that write fails (here the disk is full for chunk 3's), the run stops with that error,
    the forward pass no further than chunk 3 (under `--keep masks` not committing it: its
    commit waits for the chunk's record) and chunk 4 not encoded, instead of tracking or
    encoding on; the rerun ends with the results (under `--keep all` the store) of an
    uninterrupted run."""
    import errno

    from segpipe.stages import encode

    real = encode.write_features

    def full_disk_at_chunk_3(store, k, *args, **kwargs):
        if k == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(store, k, *args, **kwargs)

    encoded, levels = [], encode.chunk_levels

    def recorded(store, predictor, k, *args, **kwargs):
        encoded.append(k)
        return levels(store, predictor, k, *args, **kwargs)

    store = tmp_path / "run.zarr"
    monkeypatch.setattr(encode, "write_features", full_disk_at_chunk_3)
    monkeypatch.setattr(encode, "chunk_levels", recorded)
    with pytest.raises(OSError, match="No space left"):
        run_in_process(small, store, keep=keep)
    assert 3 not in ledger_records(store, "encode")
    forward = ledger_records(store, "track_forward")
    assert max(forward) <= 3 if keep == "all" else 3 not in forward, forward
    assert 4 not in encoded  # stopped once it failed, not after encoding one more chunk
    monkeypatch.setattr(encode, "chunk_levels", levels)
    monkeypatch.setattr(encode, "write_features", real)
    run_in_process(small, store, keep=keep)
    if keep == "all":
        assert_same_store(keep_all, store)
    assert_same_results(keep_all, store)
