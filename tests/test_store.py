"""The store's promises below the stages: every chunk has a file, commits reach the disk with
their directory entries, one writer per store whatever the path or the caller."""

import os
import shutil
import subprocess
import sys

import make_sample
import numpy as np
import pytest
import zarr
from conftest import ROOT, assert_user_error, segpipe, tree_digest

from segpipe.errors import StoreLocked
from segpipe.store.runstore import RunStore


def test_reopened_arrays_still_write_all_fill_chunks(tmp_path):
    store = RunStore.create(tmp_path / "s.zarr", {"chunk_size": 4})
    store.create_array("masks", (12, 2, 3), (4, 2, 3), "bool", fill_value=False)
    reopened = RunStore.open(tmp_path / "s.zarr")
    reopened.array("masks")[4:8] = False  # all fill
    reopened.array("masks")[8:12] = np.ones((4, 2, 3), bool)
    assert reopened.chunk_file("masks", 1, 3).is_file()
    assert reopened.chunk_file("masks", 2, 3).is_file()
    assert not reopened.read("masks", 4, 8).any()


def test_masks_pack_to_numpy_bits_on_the_device_and_read_back_in_bounded_batches(tmp_path):
    """The tracker packs each frame's masks with torch (on the device: one sync per chunk on
    CUDA) exactly as numpy.packbits does, odd sizes padded; `mask_batches` gives every frame
    once, in order, in batches of at most the budget, whatever the budget."""
    import torch

    from segpipe.stages.track.tracker import pack_bits
    from segpipe.store.masks import mask_batches, pack, unpack, write_packed

    rng = np.random.default_rng(0)
    for H, W in ((5, 3), (8, 16), (13, 17)):
        m = rng.random((3, H, W)) < 0.5
        assert np.array_equal(pack_bits(torch.from_numpy(m)).numpy(), pack(m)), (H, W)
        assert np.array_equal(unpack(pack(m), H, W), m)
    T, O, H, W, C = 11, 3, 13, 17, 4
    m = rng.random((T, O, H, W)) < 0.3
    store = RunStore.create(tmp_path / "s.zarr", {"chunk_size": C})
    store.create_array("masks", (T, O, H, W), (C, 1, H, W), "bool", fill_value=False)
    write_packed(store, 0, T, pack(m))
    assert np.array_equal(store.read("masks"), m)
    for budget, slots in (
        (1, [0, 1, 2]),
        (2 * O * H * W, [2, 0]),
        (O * H * W, [1]),
        (1 << 30, [0, 2]),
    ):
        for lo, hi in ((0, 4), (4, 8), (8, 11), (5, 7)):
            batches = list(mask_batches(store, lo, hi, slots, budget))
            assert [a for a, _ in batches] == list(
                np.cumsum([lo] + [len(b) for _, b in batches])[:-1]
            )
            assert all(b.nbytes <= max(budget, len(slots) * H * W) for _, b in batches)
            assert np.array_equal(np.concatenate([b for _, b in batches]), m[lo:hi][:, slots])


def test_an_all_black_chunk_written_on_resume_has_a_file(tmp_path):
    """Frames 8..15 are black; the decode resumes at chunk 1, through a reopened array."""
    frames, _ = make_sample.make_clip(num_frames=24, width=64, height=48)
    frames[8:16] = 0
    video = tmp_path / "black.mkv"
    make_sample.write_video(video, frames, codec="ffv1")
    store = tmp_path / "s.zarr"
    segpipe("decode", video, "--store", store, "--chunk-size", 8, "--image-size", 32, check=True)
    group = zarr.open_group(str(store), mode="r+")
    del group.attrs["frame_count"], group.attrs["decode_warning"]
    for name in ("frames", "pts", "timestamps"):
        group[name].resize((8, *group[name].shape[1:]))
    group["ledger/decode"].resize((1,))
    segpipe("decode", video, "--store", store, "--chunk-size", 8, "--image-size", 32, check=True)
    assert (store / "frames" / "c" / "1" / "0" / "0" / "0").is_file()
    assert not RunStore.open(store).read("frames", 8, 16).any()
    proc = segpipe("repair", "--store", store, check=True)
    assert "no damage found" in proc.stderr


def test_attributes_set_or_dropped_together_are_one_write(tmp_path, monkeypatch):
    """decode records `frame_count` and `decode_warning` together: written one key at a time, a
    kill between the two left a store that read as decoded but lacked the warning. A spy on
    zarr's LocalStore.set (it still writes) counts the writes of the group's zarr.json."""
    from zarr.storage import LocalStore

    store = RunStore.create(tmp_path / "s.zarr", {"chunk_size": 4})
    writes = []
    real = LocalStore.set

    async def spy(self, key, value, *args, **kwargs):
        writes.append(key)
        return await real(self, key, value, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "set", spy)
    store.set_attrs(frame_count=24, decode_warning=None, model={"name": "m"})
    assert writes == ["zarr.json"]
    store.drop_attrs("frame_count", "model", "absent")
    assert writes == ["zarr.json"] * 2
    monkeypatch.undo()
    attrs = zarr.open_group(str(tmp_path / "s.zarr"), mode="r").attrs.asdict()
    assert attrs == {
        "format": "segpipe",
        "schema_version": attrs["schema_version"],
        "chunk_size": 4,
        "decode_warning": None,
    }


@pytest.mark.parametrize("old", [1, 3])
def test_a_store_of_an_older_schema_version_is_refused_in_one_line(
    decoded, clip_dir, tmp_path, old
):
    """Version 1 covered layouts this segpipe no longer reads (masks in one chunk per pipeline
    chunk, attributes stores lacked), 3 kept the tracking's memory, ledgers and scores for
    all objects together (4: per object, for groups of objects): every command refuses such
    a store in one line that says how to go on, and leaves it as it is. (4, which
    `segpipe migrate` converts: `test_migrate.py`.)"""
    from segpipe.store.runstore import SCHEMA_VERSION

    assert SCHEMA_VERSION == 5
    assert zarr.open_group(str(decoded), mode="r").attrs["schema_version"] == 5  # made today
    zarr.open_group(str(decoded), mode="r+").attrs["schema_version"] = old
    before = tree_digest(decoded)
    for args in (
        ("decode", clip_dir / "clip.mp4", "--store", decoded),
        ("decode", clip_dir / "clip.mp4", "--store", decoded, "--force"),
        ("status", "--store", decoded),
        ("export", "--store", decoded, "--format", "davis", "--out", tmp_path / "out"),
        ("repair", "--store", decoded),
    ):
        proc = segpipe(*args)
        assert_user_error(
            proc,
            f"store {decoded} has schema version {old}",
            "this segpipe reads version 5",
            "make a new store",
            f"a new --store, or delete {decoded}",
            "run the command again",
        )
    assert tree_digest(decoded) == before
    assert not (tmp_path / "out").exists()


# -- power loss: directory entries are durable before the ledger entry ---------------------


def test_commit_fsyncs_the_directories_of_new_chunks_before_the_ledger(
    tmp_path, monkeypatch, clip_dir
):
    """A spy on os.fsync (it still syncs) records what was made durable, in order."""
    from segpipe.settings import Decoding
    from segpipe.stages.decode import decode

    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    store = (tmp_path / "s.zarr").resolve()
    decode(clip_dir / "clip.mp4", store, Decoding(8, 32), quiet=True)
    monkeypatch.undo()
    previous = 0
    for k in range(5):  # each chunk's own fsyncs: those since the previous ledger entry
        entry = synced.index(str(store / "ledger" / "decode" / "c" / str(k)))
        before = set(synced[previous:entry])
        previous = entry + 1
        for name in ("frames", "pts", "timestamps"):
            chunk = store.joinpath(name, "c", str(k), *["0"] * (3 if name == "frames" else 0))
            assert str(chunk) in before, chunk
            for folder in chunk.parents:  # every directory entry on the way to the store
                assert str(folder) in before, (folder, k)
                if folder == store:
                    break
        after = set(synced[entry:])
        assert str(store / "ledger" / "decode" / "c") in after  # the entry's own name


KILL_MID_CHUNK_WRITE = """
import sys
sys.path.insert(0, "tests")
import kill_points
from segpipe.store.runstore import RunStore

kill_points.mid_write("/a/")
k = int(sys.argv[2])
RunStore.open(sys.argv[1]).array("a")[k * 4 : k * 4 + 4] = 2
"""


def test_a_kill_mid_chunk_write_leaves_the_old_chunk_or_none(tmp_path):
    """zarr (3.1.3 on) writes a chunk file whole or not at all: a temp file, renamed over
    the chunk. A process killed halfway through writing a chunk's bytes leaves the chunk
    as it was (rewritten: the old values, checksum valid) or absent (new), never torn."""
    from segpipe.errors import DamagedStore

    path = tmp_path / "s.zarr"
    store = RunStore.create(path, {"chunk_size": 4})
    store.create_array("a", (8, 64), (4, 64), "uint8")
    store.array("a")[0:4] = 1  # chunk 0 exists; chunk 1 does not
    for chunk in (0, 1):
        proc = subprocess.run(
            [sys.executable, "-c", KILL_MID_CHUNK_WRITE, str(path), str(chunk)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == -9, proc.stderr  # killed inside the write
        assert list(path.glob("a/c/**/*.partial")), "the kill landed mid-write"
    store = RunStore.open(path)
    assert (store.read("a", 0, 4) == 1).all()  # the old chunk, whole
    with pytest.raises(DamagedStore, match="missing"):
        store.read("a", 4, 8)  # never written: absent, not torn


# -- one writer per store ------------------------------------------------------------------


def hold_lock(path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; sys.path.insert(0, '.');"
                "from segpipe.store.lock import store_lock\n"
                f"with store_lock({str(path)!r}):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture
def decoded(tmp_path, clip_dir):
    store = tmp_path / "real" / "s.zarr"
    segpipe(
        "decode",
        clip_dir / "clip.mp4",
        "--store",
        store,
        "--chunk-size",
        8,
        "--image-size",
        32,
        check=True,
    )
    return store


def test_a_symlink_or_relative_path_finds_the_same_lock(decoded, tmp_path, clip_dir):
    link = tmp_path / "link.zarr"
    link.symlink_to(decoded)
    holder = hold_lock(decoded)
    try:
        before = tree_digest(decoded)
        for path in (link, os.path.relpath(decoded, ROOT)):
            proc = segpipe("decode", clip_dir / "clip.mp4", "--store", path, "--force")
            assert_user_error(proc, "in use by", f"pid {holder.pid}")
        assert tree_digest(decoded) == before
    finally:
        holder.kill()
        holder.wait()


def test_another_thread_is_refused_like_another_process(decoded):
    import threading

    from segpipe.errors import StoreLocked
    from segpipe.store.lock import store_lock

    outcome = []

    def second_writer():
        try:
            with store_lock(decoded):
                outcome.append("entered")
        except StoreLocked as e:
            outcome.append(str(e))

    with store_lock(decoded):
        thread = threading.Thread(target=second_writer)
        thread.start()
        thread.join()
    assert len(outcome) == 1 and "another thread" in outcome[0], outcome
    with store_lock(decoded):  # released: taken again
        pass


def test_work_started_from_python_takes_the_lock(decoded, clip_dir):
    from segpipe.stages.decode import decode
    from segpipe.stages.export.stage import export

    holder = hold_lock(decoded)
    try:
        before = tree_digest(decoded)
        with pytest.raises(StoreLocked, match="in use by"):
            decode(clip_dir / "clip.mp4", decoded, force=True, quiet=True)
        with pytest.raises(StoreLocked, match="in use by"):
            export(decoded, "davis", decoded.parent / "out", quiet=True)
        assert tree_digest(decoded) == before
    finally:
        holder.kill()
        holder.wait()
    # and the other way round: while Python holds it, the CLI is refused
    from segpipe.store.lock import store_lock

    with store_lock(decoded), store_lock(decoded):  # re-entrant within one process
        assert_user_error(segpipe("decode", clip_dir / "clip.mp4", "--store", decoded), "in use by")
    shutil.rmtree(decoded.parent / "out", ignore_errors=True)


def test_the_lock_file_goes_when_the_work_ends(decoded, clip_dir):
    """No `.s.zarr.lock` is left beside a store after a command, done or failed; one refused
    because another process holds the lock leaves the holder's file as it was."""
    lock = decoded.with_name(f".{decoded.name}.lock")
    assert not lock.exists()  # the decode that made it
    failed = segpipe("track", "--store", decoded)  # fails inside the lock: not encoded
    assert_user_error(failed, "not encoded")
    assert not lock.exists()
    holder = hold_lock(decoded)
    try:
        record = lock.read_text()
        refused = segpipe("decode", clip_dir / "clip.mp4", "--store", decoded, "--force")
        assert_user_error(refused, "in use by", f"pid {holder.pid}")
        assert lock.read_text() == record
    finally:
        holder.kill()
        holder.wait()
    assert lock.exists()  # a killed holder's file stays: stale, taken over (and then removed)
    segpipe("decode", clip_dir / "clip.mp4", "--store", decoded, "--quiet", check=True)
    assert not lock.exists()


def test_asking_who_holds_the_lock_never_refuses_a_writer(decoded):
    """`holder` (status) and `check_lease` (every Dask write) ask who holds the lock without
    taking it: a writer taking the lock at that moment is never refused. Two threads loop:
    one takes and releases the lock, one asks; no refusal."""
    import threading

    from segpipe.store.lock import holder, store_lock

    refusals, asked, rounds = [], [0], 3000
    stop = threading.Event()

    def ask():
        while not stop.is_set():
            holder(decoded)
            asked[0] += 1

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        for _ in range(rounds):
            try:
                with store_lock(decoded):
                    pass
            except StoreLocked as e:
                refusals.append(str(e))
    finally:
        stop.set()
        thread.join()
    assert asked[0] > rounds // 10, asked  # the two really overlapped
    assert refusals == [], f"{len(refusals)} of {rounds}: {refusals[0]}"


def test_a_stale_lease_refuses_every_write_to_the_store(tmp_path):
    """A store opened under a Dask task's lease (`RunStore.open(path, lease=token)`) checks
    the lease inside zarr's own store, before every write: chunks, new arrays, metadata,
    attributes, ledger records and deletions. Under the client's live token they go
    through; under a token of a run that was taken over, none does and no file changes."""
    from segpipe.store.lock import store_lock, token

    path = tmp_path / "s.zarr"
    store = RunStore.create(path, {"chunk_size": 4})
    store.create_array("a", (8, 3), (4, 3), "uint8")
    with store_lock(path):  # this test is the client: it holds the lock
        live = RunStore.open(path, lease=token(path))
        live.array("a")[0:4] = 1
        live.ledger("decode").mark_done(0)
        live.set_attrs(frame_count=8)
        before = tree_digest(path)
        stale = RunStore.open(path, lease="a token of a run that was taken over")
        writes = {
            "a chunk": lambda: stale.array("a").__setitem__(slice(4, 8), 2),
            "a new array": lambda: stale.create_array("b", (8,), (4,), "uint8"),
            "a resize": lambda: stale.array("a").resize((12, 3)),
            "attributes": lambda: stale.set_attrs(frame_count=9),
            "dropped attributes": lambda: stale.drop_attrs("frame_count"),
            "a ledger record": lambda: stale.ledger("decode").mark_done(1),
            "a ledger undo": lambda: stale.ledger("decode").undo(0),
            "a ledger reset": lambda: stale.ledger("decode").reset(),
            "a deletion": lambda: stale.delete("a"),
        }
        for what, write in writes.items():
            with pytest.raises(StoreLocked, match="no longer locked"):
                write()
            assert tree_digest(path) == before, what
    assert RunStore.open(path).read("a", 0, 4).tolist() == [[1, 1, 1]] * 4


def test_the_groups_zarr_makes_above_a_new_array_are_made_durable(tmp_path, monkeypatch):
    """zarr writes `ledger/zarr.json` (and `memory/`, `memory/forward/`, ...) when it creates
    an array below them. Each is fsynced with the array's own metadata and the directory
    entries: after a power loss an empty group file would hide every array under it."""
    fsynced = []
    real = os.fsync

    def recording(fd):
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    path = tmp_path / "s.zarr"
    store = RunStore.create(path, {"chunk_size": 4})
    monkeypatch.setattr(os, "fsync", recording)
    store.create_array("memory/forward/prompted_frame", (4,), (4,), "int64")
    store.ledger("decode").mark_done(0)
    for group in ("memory", "memory/forward", "ledger"):
        assert str(path / group / "zarr.json") in fsynced, (group, fsynced)
    for folder in ("memory", "memory/forward", "ledger", ""):
        assert str(path / folder).rstrip("/") in fsynced, folder  # their entries too
