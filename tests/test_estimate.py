"""Storage estimate, free-space check and status rates (issue 14, items 3 and 5).

The estimate printed before a run starts is compared with the bytes of the finished store
(every file under it); the refusal runs on a real, small file system (a tmpfs, mounted where
the tests run as root; skipped elsewhere); rates and ETAs are read from real ledger entries,
their commit times set with os.utime, and from an encode caught mid-way with SIGSTOP."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    assert_user_error,
    freeze,
    ledger_count,
    make_sample,
    require_root,
    segpipe,
    spawn,
    tree_digest,
    wait_for,
)

from segpipe.estimate import model_sizes


def write_clip(folder: Path, frames: int, prompt_frames=None, one_object_on=None) -> Path:
    """A 320x240 H.264 clip; prompts on three objects (points, box, mask), or one box."""
    folder.mkdir(parents=True, exist_ok=True)
    video, masks = make_sample.make_clip(num_frames=frames, width=320, height=240, seed=1)
    make_sample.write_video(folder / "clip.mp4", video)
    if one_object_on is None:
        make_sample.write_prompts(folder, masks, frames=prompt_frames)
    else:
        box = make_sample.bbox(masks[one_object_on, 0])
        (folder / "prompts.json").write_text(
            json.dumps({"prompts": [{"object": 1, "frame": one_object_on, "box": box}]})
        )
    return folder


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file())


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def printed(stderr: str, line: str = "total") -> float:
    """A figure of the estimate as the command printed it, in its one line
    (`storage estimate: total 27.1 MiB for ... (frames 1.2 MiB, features ...)`)."""
    assert "storage estimate:" in stderr, stderr
    block = stderr[stderr.index("storage estimate:") :].splitlines()[0]
    match = re.search(rf"\b{line} ([\d,.]+) (B|KiB|MiB|GiB|TiB)", block)
    assert match, stderr
    return float(match.group(1).replace(",", "")) * UNITS[match.group(2)]


# (frames, chunk size, image size, extra options, prompts): 256 float32 with three objects
# (points, box, mask) tracked both ways; 384 under bfloat16 precision with bfloat16
# embeddings (level 2 stays float32) kept to 2 frames in chunks of 1 and one object tracked
# both ways: CPU bfloat16 is slow (about 4 s a frame to encode at 512).
SETTINGS = {
    "256-float32": (8, 4, 256, (), {"prompt_frames": (2, 4, 6)}),
    "384-bfloat16": (
        2,
        1,
        384,
        ("--precision", "bfloat16", "--embedding-dtype", "bfloat16"),
        {"one_object_on": 1},
    ),
    # SAM 3's tracker: its memory snapshots in a transformers session's layout
    "112-sam3-tracker": (8, 4, 112, ("--model", "sam3-tracker-mini"), {"prompt_frames": (2, 4, 6)}),
}


@pytest.fixture(scope="module", params=list(SETTINGS))
def finished(request, tmp_path_factory):
    """A whole run: (its stderr, the store)."""
    frames, chunk, size, extra, prompts = SETTINGS[request.param]
    clip = write_clip(tmp_path_factory.mktemp(f"clip{size}"), frames, **prompts)
    store = clip / "s.zarr"
    proc = segpipe(
        "run",
        clip / "clip.mp4",
        "--store",
        store,
        "--prompts",
        clip / "prompts.json",
        "--chunk-size",
        chunk,
        "--image-size",
        size,
        "--random-weights",
        0,
        "--export",
        "none",
        *extra,
        check=True,
    )
    return proc.stderr, store


def test_estimate_before_the_run_is_within_ten_percent_of_the_store(finished):
    stderr, store = finished
    estimated, actual = printed(stderr), store_bytes(store)
    assert abs(estimated / actual - 1) <= 0.10, (estimated, actual, stderr)
    # frames are measured on a sample of the video, not taken at their raw size
    frames = sum(store_bytes(store / name) for name in ("frames", "pts", "timestamps"))
    assert abs(printed(stderr, "frames") / frames - 1) <= 0.10, (frames, stderr)
    # the total is mostly the exact features: memory and masks, estimated, are checked alone
    # (masks err high by design, assuming the worst compression measured: 1.18 at 256 and
    # 1.32 at 512 here; memory 1.01, and 1.16 on 40 frames at 256)
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    # (sam3-tracker-mini's random masks, mostly empty, compress far below the worst case the
    # masks' estimate assumes: its memory is what that setting checks)
    checked = (("memory", 1.25),) if "sam3" in report["model"]["name"] else ()
    for group, high in checked or (("memory", 1.25), ("masks", 1.5)):
        ratio = printed(stderr, group) / report["on_disk"][group]
        assert 0.9 <= ratio <= high, (group, ratio, stderr)
    # printed before anything was written: the first stage's bar comes after it
    assert stderr.index("storage estimate:") < stderr.index("decode: ")


def test_status_shows_the_estimate_beside_the_bytes_on_disk(finished):
    _, store = finished
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    est, disk = report["estimate"], report["on_disk"]
    assert set(est["groups"]) == {"frames", "features", "memory", "masks", "other"}
    assert disk["total"] == store_bytes(store)
    assert sum(disk[g] for g in est["groups"]) == disk["total"]
    # features are exact: uncompressed, every chunk at full size (only metadata differs)
    assert abs(est["groups"]["features"]["bytes"] - disk["features"]) < 64
    assert abs(est["total"] / disk["total"] - 1) <= 0.01  # finished stages are measured
    text = segpipe("status", "--store", store, check=True).stdout
    assert re.search(r"storage\s+estimate\s+on disk", text), text
    assert re.search(r"^\s+features\s+[\d.,]+ MiB\s+[\d.,]+ MiB", text, re.M), text


def test_bfloat16_level2_is_counted_in_float32(finished):
    """Under bfloat16 precision SAM 2 computes level 2 in float32 and it is stored so."""
    _, store = finished
    report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
    S, T, C = report["image_size"], report["frames"], report["chunk_size"]
    itemsizes = (2, 2, 4) if report["model"]["embedding_dtype"] == "bfloat16" else (4, 4, 4)
    sizes = model_sizes(report["model"]["name"])
    per_frame = sum(
        i * ch * sizes.side(S, level) ** 2
        for level, (i, (ch, _, _)) in enumerate(zip(itemsizes, sizes.levels))
    )
    chunks = -(-T // C)
    data = sum(
        p.stat().st_size
        for p in (store / "features").rglob("*")
        if p.is_file() and p.name != "zarr.json"
    )
    assert data == chunks * (C * per_frame + 3 * 4)  # a crc32c per chunk and level


@pytest.fixture
def small_fs(tmp_path):
    """Mount a tmpfs of a given size (a real file system that fills up); root only."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        require_root("mounting a small tmpfs")  # as root no mount fails the test
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:  # as root (CI runs `make test` as root) the test must run
            pytest.fail(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_refuses_when_the_file_system_is_too_small(tmp_path, small_fs):
    clip = write_clip(tmp_path / "clip", 8, prompt_frames=(2, 4, 6))
    fs = small_fs("2m")  # frames at 256 (~0.3 MiB) fit; features (8 MiB) and frames at 1024 do not
    video, prompts = clip / "clip.mp4", clip / "prompts.json"
    store = fs / "s.zarr"
    decoded = segpipe(
        "decode", video, "--store", store, "--chunk-size", 4, "--image-size", 256, check=True
    )
    assert "storage estimate:" in decoded.stderr
    before = tree_digest(store)

    proc = segpipe("encode", "--store", store, "--random-weights", 0)
    assert_user_error(proc, "not enough space", "needs about", "free", "--no-space-check")
    assert tree_digest(store) == before  # not even the model settings were recorded

    big = ("decode", video, "--store", fs / "big.zarr", "--chunk-size", 4, "--image-size", 1024)
    for args in (
        big,
        (
            "run",
            video,
            "--store",
            fs / "new.zarr",
            "--prompts",
            prompts,
            "--chunk-size",
            4,
            "--image-size",
            256,
            "--random-weights",
            0,
        ),
    ):
        proc = segpipe(*args)
        assert_user_error(proc, "not enough space", "--no-space-check")
        assert not args[3].exists()
    assert tree_digest(store) == before

    # --no-space-check starts anyway: here the disk then fills, and says so
    proc = segpipe(*big, "--no-space-check")
    assert proc.returncode == 1 and "not enough space" not in proc.stderr, proc.stderr
    assert "disk full" in proc.stderr, proc.stderr


def test_keep_masks_is_checked_against_what_it_holds_at_once(tmp_path, small_fs):
    """16 frames at 256 in chunks of 2: the features come to 16 MiB, 3 chunks of them to
    6 MiB. On 10 MiB a `--keep all` run is refused, a `--keep masks` run goes through, and
    so does a rerun that leaves the store's setting to the store."""
    clip = write_clip(tmp_path / "clip", 16, one_object_on=3)
    fs = small_fs("10m")
    args = (
        "run",
        clip / "clip.mp4",
        "--store",
        fs / "s.zarr",
        "--prompts",
        clip / "prompts.json",
        "--chunk-size",
        2,
        "--image-size",
        256,
        "--random-weights",
        0,
        "--export",
        "none",
    )
    assert_user_error(segpipe(*args), "not enough space", "--no-space-check")
    proc = segpipe(*args, "--keep", "masks", check=True)
    assert "frames and features 3 chunks at a time" in proc.stderr, proc.stderr
    # a rerun with other work to do (another direction: tracked anew) and no --keep
    proc = segpipe(*args, "--direction", "forward", check=True)
    assert "frames and features 3 chunks at a time" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def encoding(tmp_path_factory):
    """A real encode caught mid-way: 8 frames at 256 in chunks of 1, decoded, then
    `segpipe encode` stopped (SIGSTOP) after 3 commits. Yields (store, the status report
    taken while it was stopped); the encode is killed afterwards."""
    import segpipe as api

    root = tmp_path_factory.mktemp("encoding")
    clip = write_clip(root / "clip", 8, prompt_frames=(2, 4, 6))
    store = root / "s.zarr"
    api.decode(
        clip / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=1, image_size=256),
        execution=api.Execution(progress=False),
    )
    proc = spawn(
        ["encode", "--store", store, "--random-weights", 0, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: ledger_count(store, "encode") >= 3, proc, timeout=300)
        freeze(proc)
        report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
        text = segpipe("status", "--store", store, check=True).stdout
    finally:
        proc.kill()  # a stopped process is killed as well
        proc.wait(timeout=60)
    return store, report, text


def test_status_while_encode_runs(encoding):
    """status, from another process while encode works, reports its frames/s and an ETA."""
    _, report, text = encoding
    done = report["stages"]["encode"]["done"]
    assert 3 <= done < 8, report["stages"]
    p = report["progress"]["encode"]
    assert p["frames_per_s"] > 0 and p["frames_left"] == 8 - done
    assert p["eta_s"] is not None and p["eta_s"] >= 0 and not p["stalled"]
    assert re.search(r"encode\s+\d+ / 8\s+[\d.]+\s+\d+:\d\d:\d\d", text), text
    assert "decode" not in report["progress"]  # finished stages have none
    assert report["estimate"]["groups"]["features"]["basis"].startswith("float32")


def test_status_rate_and_eta_from_commit_times(encoding, tmp_path):
    """The same store with 3 chunks committed 10 s apart (their entries' times set): one
    chunk's frame per 10 s, and, while a process holds the store, an ETA of the frames left
    at that rate, less the 10 s the chunk in flight has been under way."""
    from segpipe.status import describe, render

    store = tmp_path / "copy.zarr"
    shutil.copytree(encoding[0], store)
    entries = store / "ledger" / "encode" / "c"
    for f in entries.iterdir():
        if int(f.name) >= 3:
            f.unlink()  # chunks 0-2 done, 3-7 to do
    now = time.time()
    for k, t in ((0, now - 30), (1, now - 20), (2, now - 10)):
        os.utime(entries / str(k), (t, t))
    from segpipe.store.lock import store_lock

    with store_lock(store):  # a process works on it (this one): an ETA
        report = json.loads(segpipe("status", "--store", store, "--json", check=True).stdout)
        p = report["progress"]["encode"]
        assert p["frames_per_s"] == pytest.approx(0.1, rel=1e-3)
        assert p["frames_left"] == 5
        assert p["eta_s"] == pytest.approx(5 / 0.1 - 10, abs=3)
        assert not p["stalled"]
        text = segpipe("status", "--store", store, check=True).stdout
        line = next(l for l in text.splitlines() if l.strip().startswith("encode"))
        assert "0.10" in line and re.search(r"0:00:[34]\d", line) and "last commit" in line, text
    # none does (stopped, killed): the rate, but no ETA for a process that is gone
    p = describe(store, now=now)["progress"]["encode"]
    assert p["frames_per_s"] == pytest.approx(0.1, rel=1e-3) and p["eta_s"] is None
    assert "stopped, no ETA" in render(describe(store, now=now))

    # an hour without a commit: not advancing, no ETA
    later = describe(store, now=now + 3600)["progress"]["encode"]
    assert later["stalled"] and later["eta_s"] is None
    assert "not advancing" in render(describe(store, now=now + 3600))
    # a pause inside the window (stopped, resumed) is left out of the rate
    os.utime(entries / "0", (now - 5000, now - 5000))
    p = describe(store, now=now)["progress"]["encode"]
    assert p["frames_per_s"] == pytest.approx(0.1, rel=1e-3) and p["commits_in_window"] == 2


@pytest.mark.parametrize("command", ["decode", "encode", "run"])
def test_help_names_the_estimate_and_the_override(command):
    text = segpipe(command, "--help", check=True).stdout
    assert "estimate" in text and "--no-space-check" in text


def test_status_help_names_rates_and_estimate():
    text = segpipe("status", "--help", check=True).stdout
    assert "ETA" in text and "estimate" in text
