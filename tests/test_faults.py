"""Crash safety: kill -9 anywhere, Ctrl-C, two writers, a full disk, changed inputs, damage."""

import json
import os
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
    ledger_count,
    popen_segpipe,
    run_args,
    segpipe,
    tree_digest,
    wait_for,
)

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
    store = tmp_path_factory.mktemp("ref") / "run.zarr"
    segpipe(*run_args(small, store), "--quiet", check=True)
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
    segpipe(*run_args(small, store), "--quiet", check=True)
    assert_same_store(reference, store)
    assert export_files(store) == export_files(reference)
    print(f"{len(killed_in)} kills survived, in stages: {killed_in}")
    if kills >= 6:  # the kills really were spread over the stages
        assert {"decode", "encode"} & set(killed_in) and {
            s for s in killed_in if "track" in s or "export" in s
        }


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_cleanly_and_resume(small, reference, tmp_path, signum, code):
    store = tmp_path / "run.zarr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "segpipe.cli", *map(str, run_args(small, store))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert wait_for(lambda: ledger_count(store, "encode") >= 1, proc, timeout=300)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "run the same command again" in err and "Traceback" not in err
    done = ledger_count(store, "encode")
    assert 1 <= done < 6  # it stopped after the chunk in flight, not at the end
    segpipe(*run_args(small, store), "--quiet", check=True)
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
        reason = f"cannot mount a small tmpfs: {error}"
        if os.geteuid() == 0:  # `make test` as root, as CI runs it: the test must run
            pytest.fail(reason)
        pytest.skip(f"{reason} (needs root)")
    try:
        store = mount / "run.zarr"
        # the space check would refuse to start: the disk must fill mid-run here
        proc = segpipe(*run_args(small, store), "--no-space-check")
        assert_user_error(proc, "disk full")
        assert 0 < progress(store) < progress(reference)
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(mount)], check=True)
        segpipe(*run_args(small, store), "--quiet", check=True)
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
    other = tmp_path / "other.mp4"  # a different video under the same path
    video = tmp_path / "clip.mp4"
    shutil.copy(small / "clip.mp4", video)
    frames, _ = make_sample.make_clip(num_frames=20, width=96, height=72, seed=5)
    make_sample.write_video(other, frames)
    args = base.copy()
    args[1] = video
    store2 = tmp_path / "video.zarr"
    args[3] = store2
    segpipe(*args, "--quiet", "--export", "none", check=True)
    shutil.copy(other, video)
    assert_user_error(segpipe(*args), "another video")
    segpipe(*args, "--force", "--quiet", "--export", "none", check=True)
    assert zarr.open_group(str(store2), mode="r").attrs["frame_count"] == 20

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
    flip(chunk("memory/forward/recent_maskmem", 2))
    flip(chunk("memory/reverse/prompted_ptr", 0))
    proc = segpipe("repair", "--store", store, check=True)
    for name, k in (
        ("masks", 3),
        ("frames", 1),
        ("features/level1", 4),
        ("memory/forward/recent_maskmem", 2),
        ("memory/reverse/prompted_ptr", 0),
    ):
        assert f"array {name!r} chunk {k}" in proc.stderr, proc.stderr
    # the export above (to another folder) started its own export record; all else is equal
    assert_same_store(reference, store, skip=("ledger/export",), skip_attrs=("exports",))
    proc = segpipe("repair", "--store", store, check=True)
    assert "no damage found" in proc.stderr


KILL_AT_UNLINK = """
import sys
sys.path.insert(0, "tests")
import kill_points

kill_points.at_unlink(int(sys.argv[1]))
kill_points.cli(sys.argv[2:])
"""


def reset_cases(small, store: Path, tmp_path: Path) -> dict:
    """The commands that start something over on a finished run's store: new prompts (the
    tracking goes), new settings with --force (the whole store goes), an export with new
    settings (its records and files go)."""
    entries = json.loads((small / "prompts.json").read_text())["prompts"][:2]
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"prompts": entries}))
    base = list(run_args(small, store))
    prompts = base.copy()
    prompts[prompts.index("--prompts") + 1] = two
    force = base.copy()
    force[force.index("--chunk-size") + 1] = "3"
    folder = store.with_name(store.name.removesuffix(".zarr") + ".export") / "davis"
    export = ["export", "--store", store, "--format", "davis", "--out", folder]
    return {
        "new prompts": prompts,
        "--force": [*force, "--force"],
        "new export settings": [*export, "--objects", "1,2", "--force"],
    }


@pytest.mark.parametrize("case", ["new prompts", "--force", "new export settings"])
def test_kill_9_in_the_middle_of_a_reset_then_rerun(small, reference, tmp_path, case):
    """A reset removes what it starts over (ledgers, arrays, the whole store, an export's
    files). kill -9 after the first few files of a removal are gone (the process kills
    itself at its 4th unlink; folders listed with their zarr.json first, as some file
    systems list them), then the same command again: the store and exports equal the same
    command run uninterrupted. A half-removed node (its zarr.json gone, chunk files left)
    used to read as absent: later resets skipped it and the ledger counted its old
    done-records; a half-removed store was refused as "not a segpipe store"."""
    stores = {}
    for name in ("killed", "straight"):
        root = tmp_path / name
        root.mkdir()
        stores[name] = shutil.copytree(reference, root / "run.zarr")
        shutil.copytree(reference.with_name("run.export"), root / "run.export")
    killed = reset_cases(small, stores["killed"], tmp_path / "killed")
    straight = reset_cases(small, stores["straight"], tmp_path / "straight")
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT_UNLINK, "4", *map(str, killed[case])],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # the kill landed mid-removal
    segpipe(*killed[case], "--quiet", check=True)
    segpipe(*straight[case], "--quiet", check=True)
    assert_same_store(stores["straight"], stores["killed"])
    assert export_files(stores["killed"]) == export_files(stores["straight"])
    assert not any(p.name.endswith(".trash") for p in (tmp_path / "killed").iterdir())
