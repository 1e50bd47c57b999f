"""The chunk ledger: one done-record per pipeline chunk and stage, a one-byte zarr chunk
written last, after the chunk's data is durable; read straight from its files, since a
long video has tens of thousands.

A tracking pass keeps one ledger per object (`ledger/track_<direction>/<slot>`): objects
are tracked in groups that may run side by side (`stages.track.groups`), each committing
its own objects' records, so no two groups write one file. `PassLedger` reads them as one:
a chunk is done for the pass when it is done for every object."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import google_crc32c  # zarr's own crc32c implementation (Crc32cCodec)
import numpy as np
import zarr

from segpipe.fsutil import fsync_entry

if TYPE_CHECKING:
    from segpipe.store.runstore import RunStore


PASS_STAGES = ("track_forward", "track_reverse")


def pass_stage(direction: str) -> str:
    """The ledger (stage) name of the tracking pass `direction`: "track_forward", ..."""
    return f"track_{direction}"


def object_stage(direction: str, slot: int) -> str:
    """The ledger of one object (its slot in the tracking's objects) in pass `direction`."""
    return f"{pass_stage(direction)}/{slot}"


def _record(value: int) -> bytes:
    """A ledger chunk file as zarr writes it: the uint8 value, then its crc32c checksum,
    exactly as `Crc32cCodec` appends it (the uint32 in native byte order)."""
    data = np.array([value], dtype=np.uint8).tobytes()
    return data + np.uint32(google_crc32c.value(data)).tobytes()


DONE_RECORD = _record(1)  # the only chunk file that reads back as 1 (done)


def is_done_record(path: Path) -> bool:
    """Whether the ledger's chunk file at `path` records its chunk done (one file read: a
    watcher's look at one chunk, without reading the whole ledger again)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(DONE_RECORD) + 1) == DONE_RECORD
    except OSError:
        return False


class Ledger:
    """Per-stage done-records: uint8 array `ledger/<stage>`, one zarr chunk per pipeline chunk.

    The done-vector is read once (from the chunk files directly: a long video has tens of
    thousands) and then kept up to date by `mark_done`, `undo` and `reset`; a store has one
    writer, so it stays true. `RunStore.ledger` hands out one `Ledger` per stage."""

    def __init__(self, store: RunStore, stage: str):
        self.store = store
        self.name = f"ledger/{stage}"
        self._done: bytearray | None = None  # 1 per chunk recorded done; None: not read yet
        # encode's reader thread may restore chunk k+1's frames (undo their drop) while its
        # writer thread drops chunk k's: one change to a ledger at a time
        self._lock = threading.RLock()

    def _array(self, create: bool = False) -> zarr.Array | None:
        arr = self.store.array(self.name)
        if arr is None and create:
            arr = self.store.create_array(self.name, (0,), (1,), "uint8", compress=False)
        return arr

    def _vector(self) -> bytearray:
        with self._lock:
            if self._done is None:
                self._done = self._read()
            return self._done

    def _read(self) -> bytearray:
        arr = self._array()
        if arr is None or arr.shape[0] == 0:
            return bytearray()
        done = self._read_files(arr.shape[0])
        return done if done is not None else self._read_zarr(arr)

    def _read_files(self, n: int) -> bytearray | None:
        """Chunk k is done when its file holds exactly `DONE_RECORD` (value 1 and a matching
        crc32c); a missing, short, corrupt or unreadable file is not done, as zarr reads it."""
        folder = self.store.path / self.name / "c"
        done = bytearray(n)
        use_dir_fd = os.open in os.supports_dir_fd
        try:
            names = os.listdir(folder)
            dir_fd = os.open(folder, os.O_RDONLY) if use_dir_fd else None
        except FileNotFoundError:
            return done  # no chunk written yet
        except OSError:
            return None  # read through zarr instead
        size = len(DONE_RECORD) + 1  # one byte more: a longer file is not a done record
        try:
            for name in names:
                if not (name.isascii() and name.isdigit()):
                    continue
                k = int(name)
                if k >= n or str(k) != name:
                    continue
                try:
                    fd = (
                        os.open(name, os.O_RDONLY, dir_fd=dir_fd)
                        if use_dir_fd
                        else os.open(folder / name, os.O_RDONLY)
                    )
                    try:
                        data = os.read(fd, size)
                    finally:
                        os.close(fd)
                except OSError:
                    continue  # unreadable (or a directory): not done
                if data == DONE_RECORD:
                    done[k] = 1
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        return done

    @staticmethod
    def _read_zarr(arr: zarr.Array) -> bytearray:
        """Through zarr, where the chunk folder cannot be listed (an unreadable record: not done)."""
        try:
            return bytearray((arr[:] == 1).astype(np.uint8).tobytes())
        except Exception:  # noqa: BLE001 - a damaged record
            done = bytearray(arr.shape[0])
            for k in range(arr.shape[0]):
                try:
                    done[k] = int(arr[k] == 1)
                except Exception:  # noqa: BLE001
                    pass
            return done

    def done(self) -> np.ndarray:
        """Boolean vector over chunk indices recorded so far; an unreadable record counts as
        not done (the chunk is simply redone)."""
        return np.frombuffer(bytes(self._vector()), dtype=np.uint8) == 1

    def is_done(self, chunk: int) -> bool:
        done = self._vector()
        return chunk < len(done) and done[chunk] == 1

    def todo(self, chunks) -> list[int]:
        """The chunks of `chunks` (in their order) not recorded done."""
        done = self._vector()
        n = len(done)
        return [k for k in chunks if not (k < n and done[k])]

    def count(self) -> int:
        return self._vector().count(1)

    def commit_times(self, chunks) -> dict[int, float]:
        """When each of `chunks` recorded done was committed: its entry file's modification
        time (the entry is written once, last, when the chunk is done; the ledger records no
        time itself). Chunks not done, or whose entry cannot be read, are left out."""
        done, folder, times = self._vector(), self.store.path / self.name / "c", {}
        for k in chunks:
            if k < len(done) and done[k]:
                try:
                    times[k] = os.stat(folder / str(k)).st_mtime
                except OSError:
                    pass
        return times

    def _set(self, chunk: int, value: int) -> None:
        if self._done is not None:
            if chunk >= len(self._done):
                self._done.extend(bytes(chunk + 1 - len(self._done)))
            self._done[chunk] = value

    def reread(self) -> "Ledger":
        """Forget the done-vector, so the next question reads the records again: other
        processes (Dask workers, under this one's lock) commit chunks too."""
        self._done = None
        return self

    def reserve(self, chunks: int) -> None:
        """Size the record for chunks 0..chunks-1 now. Growing it rewrites the array's
        metadata, so it is done before work goes to Dask workers, which then commit chunks
        side by side without resizing it."""
        arr = self._array(create=True)
        if chunks > arr.shape[0]:
            arr.resize((chunks,))
            fsync_entry(self.store.path / self.name / "zarr.json", self.store.path)

    def mark_done(self, chunk: int) -> None:
        with self._lock:
            self._mark_done(chunk)

    def _mark_done(self, chunk: int) -> None:
        try:
            arr = self._array(create=True)
            if chunk >= arr.shape[0]:
                arr.resize((chunk + 1,))
                fsync_entry(self.store.path / self.name / "zarr.json", self.store.path)
            arr[chunk] = 1
            fsync_entry(self.store.path / self.name / "c" / str(chunk), self.store.path)
        except BaseException:
            self._done = None  # the record's state is unknown: read it again when asked
            raise
        self._set(chunk, 1)

    def undo(self, chunk: int) -> None:
        """Mark one chunk not done (repair), durably."""
        with self._lock:
            try:
                arr = self._array()
                if arr is not None and chunk < arr.shape[0]:
                    arr[chunk] = 0
                    fsync_entry(self.store.path / self.name / "c" / str(chunk), self.store.path)
                    self._set(chunk, 0)
            except BaseException:
                self._done = None
                raise

    def reset(self) -> None:
        with self._lock:
            try:
                self.store.delete(self.name)
            finally:
                self._done = None
            self._done = bytearray()


class PassLedger:
    """A tracking pass's done-records, as one ledger over its objects' (`object_stage`):
    chunk k is done when every object of the tracking has it done. The objects are the
    store's tracking's (its `track` attribute); before one is recorded nothing is done.
    Reading, `reserve`, `undo` and `reset` go to every object; a pass's chunks are marked
    done object by object (`RunStore.commit_objects`). A concept tracking (its instances
    appear as it goes: `stages.track.concepts`) has one ledger, slot 0's."""

    def __init__(self, store: RunStore, stage: str):
        self.store, self.stage = store, stage
        self.name = f"ledger/{stage}"
        self._done = None  # (unused: `RunStore.delete` resets the objects' ledgers)

    def objects(self) -> list[Ledger]:
        track = self.store.attrs.get("track") or {}
        n = len(track.get("object_ids", ())) or (1 if track.get("concepts") else 0)
        return [self.store.ledger(f"{self.stage}/{slot}") for slot in range(n)]

    def done(self) -> np.ndarray:
        vectors = [ledger.done() for ledger in self.objects()]
        if not vectors:
            return np.zeros(0, bool)
        n = min(len(v) for v in vectors)
        out = np.ones(n, bool)
        for v in vectors:
            out &= v[:n]
        return out

    def is_done(self, chunk: int) -> bool:
        objects = self.objects()
        return bool(objects) and all(ledger.is_done(chunk) for ledger in objects)

    def todo(self, chunks) -> list[int]:
        done = self.done()
        n = len(done)
        return [k for k in chunks if not (k < n and done[k])]

    def count(self) -> int:
        return int(self.done().sum())

    def commit_times(self, chunks) -> dict[int, float]:
        """When each chunk done for the pass was done for its last object."""
        done = self.done()
        chunks = [k for k in chunks if k < len(done) and done[k]]
        times: dict[int, float] = {}
        for ledger in self.objects():
            for k, t in ledger.commit_times(chunks).items():
                times[k] = max(t, times.get(k, t))
        return times

    def reread(self) -> "PassLedger":
        for ledger in self.objects():
            ledger.reread()
        return self

    def reserve(self, chunks: int) -> None:
        for ledger in self.objects():
            ledger.reserve(chunks)

    def undo(self, chunk: int) -> None:
        for ledger in self.objects():
            ledger.undo(chunk)

    def reset(self) -> None:
        self.store.delete(self.name)  # every object's ledger with it
