"""The ledger read from its chunk files (and cached), the chunk plan of a pass computed from
chunk bounds, and the vis-json assembly: each equal to the slower definition it replaced.
Real zarr stores on disk."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from segpipe.plan import ChunkPlan, Span
from segpipe.store.layout import reset_from
from segpipe.store.ledger import DONE_RECORD
from segpipe.store.runstore import RunStore


def zarr_done(path: Path, stage: str) -> np.ndarray:
    """The ledger as zarr reads it, record by record (an unreadable record is not done)."""
    arr = zarr.open_group(str(path), mode="r")[f"ledger/{stage}"]
    done = np.zeros(arr.shape[0], bool)
    for k in range(arr.shape[0]):
        try:
            done[k] = arr[k] == 1
        except Exception:  # noqa: BLE001 - checksum or shape failure
            pass
    return done


def fresh_done(path: Path, stage: str) -> np.ndarray:
    return RunStore.open(path).ledger(stage).done()


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore.create(tmp_path / "s.zarr", {"chunk_size": 4})


def record(store: RunStore, stage: str, k: int) -> Path:
    return store.path / "ledger" / stage / "c" / str(k)


def test_done_record_is_what_zarr_writes(store):
    store.ledger("decode").mark_done(3)
    assert record(store, "decode", 3).read_bytes() == DONE_RECORD
    assert len(DONE_RECORD) == 5 and DONE_RECORD[0] == 1


def test_done_equals_zarrs_reading(store):
    ledger = store.ledger("encode")
    for k in (0, 1, 2, 5, 9, 10, 17):
        ledger.mark_done(k)
    ledger.undo(9)
    arr = store.array("ledger/encode")
    arr[11] = 2  # a valid record that is not 1
    arr[12] = 1  # written by zarr directly
    expected = zarr_done(store.path, "encode")
    assert expected.tolist() == [k in (0, 1, 2, 5, 10, 12, 17) for k in range(18)]
    assert np.array_equal(fresh_done(store.path, "encode"), expected)
    assert fresh_done(store.path, "encode").dtype == bool
    assert RunStore.open(store.path).ledger("encode").count() == 7
    assert RunStore.open(store.path).ledger("encode").todo(range(20)) == [
        3,
        4,
        6,
        7,
        8,
        9,
        11,
        13,
        14,
        15,
        16,
        18,
        19,
    ]


def test_missing_ledger_is_empty(store):
    ledger = store.ledger("track_forward")
    assert ledger.done().shape == (0,) and ledger.count() == 0
    assert ledger.todo([3, 1, 2]) == [3, 1, 2]


def test_corrupted_records_are_not_done(store):
    ledger = store.ledger("decode")
    for k in range(8):
        ledger.mark_done(k)
    flipped = bytearray(DONE_RECORD)
    flipped[-1] ^= 0x01
    record(store, "decode", 1).write_bytes(bytes(flipped))  # checksum fails
    record(store, "decode", 2).write_bytes(DONE_RECORD[:3])  # truncated
    record(store, "decode", 3).write_bytes(b"")  # empty
    record(store, "decode", 4).write_bytes(DONE_RECORD + b"\x00")  # trailing byte
    record(store, "decode", 5).unlink()  # missing
    record(store, "decode", 6).unlink()
    record(store, "decode", 6).mkdir()  # not a file
    (record(store, "decode", 0).parent / "junk").write_bytes(DONE_RECORD)  # not a chunk name
    (record(store, "decode", 0).parent / "07").write_bytes(DONE_RECORD)
    (record(store, "decode", 0).parent / "40").write_bytes(DONE_RECORD)  # beyond the shape
    done = fresh_done(store.path, "decode")
    assert done.tolist() == [True, False, False, False, False, False, False, True]
    expected = zarr_done(store.path, "decode")
    assert np.array_equal(done, expected)
    # and zarr itself refuses the damaged records (today's code counted them not done that way)
    arr = store.array("ledger/decode")
    for k in (1, 2, 4):
        with pytest.raises(Exception):
            arr[k]


def test_cache_follows_mark_done_undo_and_reset(store):
    ledger = store.ledger("export_davis")
    assert store.ledger("export_davis") is ledger
    ledger.mark_done(2)
    assert ledger.done().tolist() == [False, False, True]
    for k in (5, 3):
        ledger.mark_done(k)
    ledger.undo(2)
    ledger.undo(40)  # beyond the records: nothing to undo
    want = [False, False, False, True, False, True]
    assert ledger.done().tolist() == want
    assert fresh_done(store.path, "export_davis").tolist() == want
    assert zarr_done(store.path, "export_davis").tolist() == want
    assert ledger.count() == 2 and ledger.todo([5, 4, 3, 2, 9]) == [4, 2, 9]

    # the vector is cached: damage made behind the ledger's back is seen only by a new reader
    record(store, "export_davis", 3).write_bytes(b"\x00")
    assert ledger.done().tolist() == want
    assert fresh_done(store.path, "export_davis").tolist() == [False] * 5 + [True]
    done = ledger.done()
    done[:] = True  # a caller's copy: the cache is not changed through it
    assert ledger.done().tolist() == want

    ledger.reset()
    assert ledger.done().shape == (0,) and fresh_done(store.path, "export_davis").shape == (0,)
    ledger.mark_done(1)
    assert (
        ledger.done().tolist() == [False, True] == fresh_done(store.path, "export_davis").tolist()
    )


def test_a_pass_is_done_where_every_object_is(store):
    """A tracking pass keeps a ledger per object (groups of objects commit their own): the
    pass has chunk k done where each of the tracking's objects has it, read fresh or cached;
    undo and reset go to every object."""
    store.set_attrs(track={"direction": "forward", "object_ids": [4, 7, 9]})
    for slot, chunks in enumerate(([0, 1, 2, 3], [0, 1, 3], [0, 1, 2, 3, 5])):
        for k in chunks:
            store.ledger(f"track_forward/{slot}").mark_done(k)
    want = [True, True, False, True]
    assert store.pass_ledger("forward").done().tolist() == want
    assert fresh_done(store.path, "track_forward").tolist() == want
    assert store.pass_ledger("forward").todo([5, 3, 2, 1]) == [5, 2]
    assert store.pass_ledger("forward").count() == 3
    assert store.pass_ledger("forward").is_done(3) and not store.pass_ledger("forward").is_done(5)
    store.pass_ledger("forward").undo(1)
    assert fresh_done(store.path, "track_forward/2").tolist() == [
        True,
        False,
        True,
        True,
        False,
        True,
    ]
    assert fresh_done(store.path, "track_forward").tolist() == [True, False, False, True]
    store.set_attrs(track={"direction": "forward", "object_ids": [4, 7, 9, 11]})  # a 4th: none
    assert RunStore.open(store.path).pass_ledger("forward").count() == 0
    store.pass_ledger("forward").reset()
    assert not (store.path / "ledger" / "track_forward").exists()
    assert fresh_done(store.path, "track_forward/0").shape == (0,)


def test_reset_from_resets_cached_ledgers(store):
    store.set_attrs(track={"direction": "forward", "object_ids": [1]})
    for stage in ("encode", "track_forward/0", "export_davis"):
        for k in range(3):
            store.ledger(stage).mark_done(k)
        assert store.ledger(stage).count() == 3
    reset_from(store, "track")
    assert store.ledger("encode").count() == 3
    assert store.ledger("track_forward").count() == 0 and store.ledger("export_davis").count() == 0
    assert store.ledger("track_forward/0").count() == 0
    assert fresh_done(store.path, "encode").sum() == 3
    store.delete("ledger")  # a whole folder of ledgers: every cached vector is read again
    assert store.ledger("encode").count() == 0


def test_ledger_written_in_one_assignment_reads_complete(store):
    """How the overhead benchmark builds its ledgers: one zarr assignment."""
    arr = store.create_array("ledger/decode", (1000,), (1,), "uint8", compress=False)
    arr[100:] = 1
    ledger = RunStore.open(store.path).ledger("decode")
    assert ledger.count() == 900 and ledger.todo(range(1000)) == list(range(100))


def frame_chunks(plan, direction, span):
    """The chunks of the pass's frames, listed frame by frame (what `Span.chunks` computes)."""
    return list(dict.fromkeys(plan.chunk_of(f) for f in span.frames(direction)))


def chunks_of(plan, direction, span):
    return span.chunks(plan, direction)


def outcome(fn, *args):
    try:
        return fn(*args)
    except IndexError:
        return IndexError


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_pass_chunks_equal_the_frame_definition(direction):
    cases = 0
    for T in (0, 1, 2, 3, 7, 8, 9, 16, 17, 33):
        for C in (1, 2, 3, 4, 8, 16, 40):
            plan = ChunkPlan(T, C)
            for start in range(-2, T + 3):
                for window in {(0, T), (0, T // 2), (T // 3, T), (T // 3, T // 3 + 2)}:
                    if window[0] >= window[1] or window[1] > T:
                        continue
                    span = Span(start, *window)
                    want = outcome(frame_chunks, plan, direction, span)
                    assert outcome(chunks_of, plan, direction, span) == want, (T, C, span)
                    cases += 1
    assert cases > 1000
    assert Span.whole(0, 20).chunks(ChunkPlan(20, 4), "reverse") == []
    assert Span.whole(9, 20).chunks(ChunkPlan(20, 4), "reverse") == [2, 1, 0]
    assert Span.whole(9, 20).chunks(ChunkPlan(20, 4), "forward") == [2, 3, 4]
    assert Span(9, 5, 14).chunks(ChunkPlan(20, 4), "forward") == [2, 3]
    assert Span(9, 5, 14).chunks(ChunkPlan(20, 4), "reverse") == [2, 1]


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_pass_frame_count_in_equals_the_frames(direction):
    for T, C in ((14, 4), (9, 1), (17, 8), (5, 32)):
        plan = ChunkPlan(T, C)
        for start in range(T):
            for window in ((0, T), (1, T - 1), (T // 2, T // 2 + 1)):
                span = Span(start, *window)
                for k in plan:
                    lo, hi = plan.bounds(k)
                    assert span.count_in(direction, lo, hi) == len(
                        span.frames_in(direction, lo, hi)
                    ), (T, C, span, k)


# -- vis-json assembly --------------------------------------------------------------------


def reference_finish(writer, chunks) -> bytes:
    """How VisJsonWriter.finish assembled the file before: every part parsed once per object
    and key. The new assembly must write the same bytes."""
    length = writer.frames[1] - writer.frames[0]
    W, H = writer.video["width"], writer.video["height"]
    out = []
    out.append('{"info": {"description": "segpipe export"}, "videos": ')
    times = writer.store.read("timestamps", *writer.frames)
    out.append(
        json.dumps(
            [
                {
                    "id": 1,
                    "width": W,
                    "height": H,
                    "length": length,
                    "file_names": [f"{t:05d}.jpg" for t in range(*writer.frames)],
                    "timestamps": [float(v) for v in times],
                }
            ]
        )
    )
    out.append(', "categories": [{"id": 1, "name": "object", "supercategory": "object"}]')
    out.append(', "annotations": [')
    for n, obj in enumerate(writer.ids):
        head = json.dumps(
            {
                "id": n + 1,
                "object_id": obj,
                "video_id": 1,
                "category_id": 1,
                "iscrowd": 0,
                "height": H,
                "width": W,
                "length": length,
            }
        )
        out.append(("," if n else "") + head[:-1])
        for key in ("segmentations", "areas", "bboxes"):
            out.append(f', "{key}": [')
            first = True
            for k in chunks:
                part = json.loads((writer.parts / f"{k:06d}.json").read_text())[str(obj)]
                for item in part[key]:
                    out.append(("" if first else ",") + json.dumps(item))
                    first = False
            out.append("]")
        out.append("}")
    out.append("]}\n")
    return "".join(out).encode()


@pytest.mark.parametrize("ids,batch", [([1, 2, 3, 4, 5], 2), ([7], 64), ([3, 9, 12], 1), ([], 64)])
def test_vis_json_assembly_is_byte_identical(tmp_path, ids, batch):
    from segpipe.stages.export.writers import Job, VisJsonWriter

    H, W, C, frames = 12, 10, 3, (2, 15)
    rng = np.random.default_rng(len(ids) * 10 + batch)
    store = RunStore.create(tmp_path / "s.zarr", {})
    store.create_array("timestamps", (frames[1],), (C,), "float64")[...] = np.arange(frames[1]) / 24
    writer = VisJsonWriter(
        Job(
            tmp_path / "masks.json",
            ids,
            frames,
            {"width": W, "height": H},
            tmp_path / "clip.mp4",
            store,
        )
    )
    writer.BATCH = batch
    writer.start()
    chunks = []
    for k in range(frames[0] // C, -(-frames[1] // C)):
        lo, hi = max(k * C, frames[0]), min((k + 1) * C, frames[1])
        masks = rng.random((hi - lo, len(ids), H, W)) < rng.choice(
            [0.0, 0.05, 0.5], (hi - lo, len(ids), 1, 1)
        )
        writer.chunk(k, lo, hi, [(lo, masks)])  # one batch: the whole chunk
        chunks.append(k)
    want = reference_finish(writer, chunks)
    writer.finish(chunks)
    assert (tmp_path / "masks.json").read_bytes() == want
    assert not (writer.parts / "assemble").exists()
    assert sorted(os.listdir(writer.parts)) == [f"{k:06d}.json" for k in chunks]
    doc = json.loads(want)
    assert [a["object_id"] for a in doc["annotations"]] == ids
    assert all(len(a["segmentations"]) == frames[1] - frames[0] for a in doc["annotations"])
    # an interrupted finish leaves its files behind: the next one starts them afresh
    (writer.parts / "assemble").mkdir()
    (writer.parts / "assemble" / "0.areas").write_text("garbage")
    writer.finish(chunks)
    assert (tmp_path / "masks.json").read_bytes() == want
