"""Crash safety: kill -9 anywhere, Ctrl-C, two writers, a full disk, changed inputs, damage."""

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import make_sample
import numpy as np
import pytest
import zarr
from conftest import (
    assert_same_store,
    assert_user_error,
    freeze,
    ledger_count,
    ledger_records,
    popen_segpipe,
    require_root,
    run_args,
    run_code,
    run_in_process,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)
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


@pytest.fixture(scope="module")
def reference(small, tmp_path_factory):
    """An uninterrupted `run` with `run_args`, made in this process (`segpipe.run`)."""
    store = tmp_path_factory.mktemp("ref") / "run.zarr"
    run_in_process(small, store)
    return store


def progress(store: Path) -> int:
    return sum(ledger_count(store, s) for s in STAGES)


def export_files(store: Path) -> dict:
    folder = store.with_name(store.name.removesuffix(".zarr") + ".export")
    return tree_digest(folder)


def test_kill_9_at_random_moments_across_all_stages(small, reference, tmp_path, request):
    """Kill `segpipe run` at N seeded random moments spread over all four stages, rerun until
    it completes: every array and every exported file equals an uninterrupted run's."""
    kills = request.config.getoption("--fault-kills")
    rng = random.Random(request.config.getoption("--fault-seed"))
    total = progress(reference)
    targets = sorted(rng.randint(0, total - 1) for _ in range(kills))
    store = tmp_path / "run.zarr"
    killed_in = []
    for target in targets:
        # each kill lands after this run has done some new work (and at least up to the
        # target), then somewhere inside the next chunk
        floor = progress(store) + 1
        proc = popen_segpipe(*run_args(small, store))
        wait_for(lambda: progress(store) >= max(target, floor), proc, timeout=300)
        time.sleep(rng.uniform(0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            stage = next(
                (s for s in STAGES if ledger_count(store, s) < ledger_count(reference, s)), "end"
            )
            killed_in.append(stage)
    run_in_process(small, store)  # the same run again, to the end (in this process)
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)
    # and SAM 2's own predictor on the same frames and prompts
    assert_tracked_as_sam2(store, oracle_tracking(reference, small / "prompts.json"))
    print(f"{len(killed_in)} kills survived, in stages: {killed_in}")
    if kills >= 6:  # the kills really were spread over the stages
        assert {"decode", "encode"} & set(killed_in) and {
            s for s in killed_in if "track" in s or "export" in s
        }


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_cleanly_and_resume(small, reference, tmp_path, signum, code):
    store = tmp_path / "run.zarr"
    proc = spawn(run_args(small, store), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for(lambda: ledger_count(store, "encode") >= 1, proc, timeout=300)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "run the same command again" in err and "Traceback" not in err
    done = ledger_count(store, "encode")
    assert 1 <= done < 6  # it stopped after the chunk in flight, not at the end
    run_in_process(small, store)  # the same run again, to the end (in this process)
    assert_same_store(reference, store)


def test_one_writer_per_store_and_stale_lock_takeover(small, reference, tmp_path):
    store = tmp_path / "run.zarr"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; sys.path.insert(0, '.');"
                "from segpipe.store.lock import store_lock\n"
                f"with store_lock({str(store)!r}):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    before = tree_digest(store)
    proc = segpipe(*run_args(small, store))
    assert_user_error(proc, "in use by", f"pid {holder.pid}")
    assert tree_digest(store) == before
    holder.send_signal(signal.SIGKILL)  # dies holding the lock: the lock file stays behind
    holder.wait()
    lock = store.with_name(f".{store.name}.lock")
    assert json.loads(lock.read_text())["pid"] == holder.pid
    segpipe(*run_args(small, store), "--quiet", check=True)  # stale: taken over
    assert_same_store(reference, store)


def test_disk_full_then_space_freed_continues_identically(small, reference, tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    size = sum(f.stat().st_size for f in reference.rglob("*") if f.is_file())
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size // 2}", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        error = proc.returncode and (proc.stderr.strip() or f"mount exited {proc.returncode}")
    except OSError as e:  # no mount command
        error = str(e)
    if error:
        require_root(f"a small tmpfs ({error})")
        pytest.fail(f"cannot mount a small tmpfs: {error}")  # as root the test must run
    try:
        store = mount / "run.zarr"
        # the space check would refuse to start: the disk must fill mid-run here
        proc = segpipe(*run_args(small, store), "--no-space-check")
        assert_user_error(proc, "disk full")
        assert 0 < progress(store) < progress(reference)
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(mount)], check=True)
        run_in_process(small, store)  # the same run again, to the end (in this process)
        assert_same_store(reference, store)
        assert export_files(store) == export_files(reference)
    finally:
        subprocess.run(["umount", str(mount)])


def test_changed_inputs_are_refused_and_force_starts_over(small, reference, tmp_path):
    store = tmp_path / "run.zarr"
    shutil.copytree(reference, store)
    base = list(run_args(small, store))
    before = tree_digest(store)
    for change, words in (
        (["--random-weights", "1"], ["model weights"]),
        (["--chunk-size", "8"], ["chunk_size"]),
        (["--image-size", "256"], ["image_size"]),
    ):
        args = base.copy()
        i = args.index(change[0])
        args[i + 1] = change[1]
        assert_user_error(segpipe(*args), *words)
        assert tree_digest(store) == before
    # a different video under the same path; both short (the prompts' frames 5, 8 and 11
    # are in both), of different lengths, so the frame count tells which one was run
    other = tmp_path / "other.mp4"
    video = tmp_path / "clip.mp4"
    frames, _ = make_sample.make_clip(num_frames=12, width=96, height=72, seed=1)
    make_sample.write_video(video, frames)
    frames, _ = make_sample.make_clip(num_frames=16, width=96, height=72, seed=5)
    make_sample.write_video(other, frames)
    args = base.copy()
    args[1] = video
    store2 = tmp_path / "video.zarr"
    args[3] = store2
    # made by the same run in this process; the refusal and --force run as commands
    run_in_process(small, store2, exports=[], video=video)
    assert zarr.open_group(str(store2), mode="r").attrs["frame_count"] == 12
    shutil.copy(other, video)
    assert_user_error(segpipe(*args), "another video")
    segpipe(*args, "--force", "--quiet", "--export", "none", check=True)
    assert zarr.open_group(str(store2), mode="r").attrs["frame_count"] == 16

    # new weights with --force: encode and everything after it start over
    args = base.copy()
    args[args.index("--random-weights") + 1] = "1"
    segpipe(*args, "--force", "--quiet", check=True)
    group = zarr.open_group(str(store), mode="r")
    assert group.attrs["model"]["weights"] == {"random_seed": 1}
    assert not np.array_equal(
        group["features/level2"][:4],
        zarr.open_group(str(reference), mode="r")["features/level2"][:4],
    )


def test_new_prompts_redo_only_tracking_and_export(small, reference, tmp_path):
    store = tmp_path / "run.zarr"
    shutil.copytree(reference, store)
    shutil.copytree(reference.with_name("run.export"), tmp_path / "run.export")
    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    prompts = tmp_path / "two.json"
    prompts.write_text(json.dumps({"prompts": entries}))
    features = {k: v for k, v in tree_digest(store).items() if k.startswith(("features", "frames"))}
    args = list(run_args(small, store))
    args[args.index("--prompts") + 1] = prompts
    proc = segpipe(*args, check=True)
    assert "starting over" in proc.stderr and "encode: already complete" in proc.stderr
    assert {
        k: v for k, v in tree_digest(store).items() if k.startswith(("features", "frames"))
    } == features
    group = zarr.open_group(str(store), mode="r")
    assert group["masks"].shape[1] == 2
    doc = json.loads((tmp_path / "run.export" / "masks.json").read_text())
    assert len(doc["annotations"]) == 2


def test_damaged_chunks_are_detected_and_repaired(small, reference, tmp_path):
    store = tmp_path / "run.zarr"
    shutil.copytree(reference, store)

    def chunk(name, k):
        ndim = len(zarr.open_group(str(store), mode="r")[name].shape)
        return store.joinpath(name, "c", str(k), *["0"] * (ndim - 1))

    def flip(path):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    masks = chunk("masks", 3)
    flip(masks)
    proc = segpipe("export", "--store", store, "--format", "davis", "--out", tmp_path / "d")
    assert_user_error(proc, "damaged", "'masks' chunk 3", "segpipe repair")

    frames = chunk("frames", 1)
    frames.write_bytes(frames.read_bytes()[:50])  # truncated
    chunk("features/level1", 4).unlink()  # deleted: zarr alone would read zeros
    flip(chunk("memory/forward/0/recent_maskmem", 2))
    flip(chunk("memory/reverse/1/prompted_ptr", 0))
    proc = segpipe("repair", "--store", store, check=True)
    for name, k in (
        ("masks", 3),
        ("frames", 1),
        ("features/level1", 4),
        ("memory/forward/0/recent_maskmem", 2),
        ("memory/reverse/1/prompted_ptr", 0),
    ):
        assert f"array {name!r} chunk {k}" in proc.stderr, proc.stderr
    # the export above (to another folder) started its own export record; all else is equal
    assert_same_store(reference, store, skip=("ledger/export",), skip_attrs=("exports",))
    proc = segpipe("repair", "--store", store, check=True)
    assert "no damage found" in proc.stderr


QUEUED = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.wait_before_write(sys.argv[1], 1, sys.argv[2])
kill_points.cli(sys.argv[3:])
"""


def test_kill_9_with_a_write_queued_behind_the_tracking_then_rerun(small, reference, tmp_path):
    """The tracker's writes run behind it (`segpipe.behind`): chunk k is written and
    committed while the pass goes on. The masks write of forward chunk 2 is held (the pass
    starts at chunk 1, frame 5), and the pass goes on regardless: it encodes chunk 3 (the
    old order, write then go on, would wait for the held write for ever). A kill -9 there,
    chunk 2 queued and not committed, then a rerun: every array and exported file equals an
    uninterrupted run's."""
    store = tmp_path / "run.zarr"
    proc = spawn(
        ["/masks/c/2/", tmp_path / "never", *run_args(small, store)],
        code=QUEUED,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        went_on = wait_for(lambda: 3 in ledger_records(store, "encode"), proc, timeout=300)
        freeze(proc)
        forward = set(ledger_records(store, "track_forward"))
    finally:
        proc.kill()
        proc.wait()
    assert went_on, "the pass waited for the held write of chunk 2"
    assert forward == {1}, forward  # chunk 2 was queued, not committed, at the kill
    run_in_process(small, store)
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)


def test_a_chunk_is_written_while_the_next_is_tracked(small, reference, tmp_path):
    """Timestamps from a real run: the write of forward chunk 1 (its masks, memory, commit
    and exports) is held until the tracker has tracked every frame of chunk 2, on the main
    thread, meanwhile. Were the writes not behind the tracking, chunk 2 could not be
    tracked before chunk 1's write ended, and the held write would give up (the run fails).
    The result is an uninterrupted run's."""
    import threading

    from segpipe.stages.track.tracker import Tracker

    write, track_frame = Tracker.write, Tracker.track_frame
    tracked_all = threading.Event()
    seen = {"frames": {}, "writes": {}}

    def held_write(self, k, *args):
        began = time.perf_counter()
        if (self.direction, k) == ("forward", 1):
            assert tracked_all.wait(120), "chunk 2 was not tracked while chunk 1 was written"
        write(self, k, *args)
        seen["writes"][self.direction, k] = (began, time.perf_counter(), threading.get_ident())

    def timed_frame(self, f, *args):
        began = time.perf_counter()
        out = track_frame(self, f, *args)
        seen["frames"][self.direction, f] = (began, time.perf_counter(), threading.get_ident())
        if self.direction == "forward" and f == self.plan.bounds(2)[1] - 1:
            tracked_all.set()
        return out

    Tracker.write, Tracker.track_frame = held_write, timed_frame
    try:
        store = tmp_path / "run.zarr"
        run_in_process(small, store)
    finally:
        Tracker.write, Tracker.track_frame = write, track_frame
    began, ended, writer = seen["writes"]["forward", 1]
    chunk2 = [seen["frames"]["forward", f] for f in range(*store_plan_bounds(2))]
    main = threading.main_thread().ident
    assert writer != main and all(t == main for _, _, t in chunk2)
    # What proves the overlap is that the run ended at all: the held write waited for
    # chunk 2's last frame (a write in line would have waited in vain and failed the run).
    # The timestamps say the same: chunk 2 tracked from start to end on the main thread
    # before chunk 1's write ended (that write may get its thread late: its start is not
    # asserted).
    assert all(b < ended for _, b, _ in chunk2), (began, ended, chunk2)
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)


def store_plan_bounds(k: int) -> tuple[int, int]:
    """Frames of chunk k in `run_args`' chunks of 4."""
    return 4 * k, 4 * k + 4


UNLINK = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.at_unlink(1, sys.argv[1])
kill_points.cli(sys.argv[2:])
"""


def test_kill_9_while_the_overlays_parts_are_removed_then_rerun(small, reference, tmp_path):
    """Killed at the first removal of the overlay's parts (its record already says complete),
    then run again: the parts are gone and the exports equal an uninterrupted run's."""
    store = tmp_path / "run.zarr"
    parts = tmp_path / "run.export" / ".overlay.mp4.parts"
    killed = run_code(UNLINK, parts, *run_args(small, store))
    assert killed.returncode == -9, killed.stderr
    assert parts.is_dir() and (tmp_path / "run.export" / "overlay.mp4").is_file()
    run_in_process(small, store)
    assert not parts.exists()
    assert export_files(store) == export_files(reference)
