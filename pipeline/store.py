"""The run store: one zarr v3 group per video, plus the chunk ledger that makes stages resumable.

Completion is never inferred from zarr chunk files (an all-fill chunk may write none).
A chunk of a stage is done only when its ledger entry says so, and the entry is written
after the chunk's data has been fsynced (`RunStore.commit`).
"""
from __future__ import annotations

import hashlib
import itertools
import os
import threading
from pathlib import Path

import google_crc32c  # zarr's own crc32c implementation (Crc32cCodec)
import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from . import interrupt
from .errors import BadInput, StoreMismatch, DamagedStore

SCHEMA_VERSION = 1
FORMAT_NAME = "segpipe"


def file_identity(path: Path) -> dict:
    """Size, modification time and sha256 of a file (or a frame folder): how a store
    recognises its source."""
    if Path(path).is_dir():
        from .frame_folder import identity
        return identity(Path(path))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def same_file(recorded: dict, path: Path) -> bool:
    """Whether `path` is still the file `recorded` describes. Hashing hours of video on every
    run costs seconds to minutes, so an unchanged size and modification time are trusted;
    anything else is decided by the sha256."""
    if Path(path).is_dir():
        from .frame_folder import identity, listing
        if listing(Path(path)) == recorded.get("listing"):
            return True
        return identity(Path(path))["sha256"] == recorded["sha256"]
    stat = Path(path).stat()
    size, mtime = stat.st_size, stat.st_mtime_ns
    if size != recorded["size"]:
        return False
    if mtime == recorded.get("mtime_ns"):
        return True
    return file_identity(path)["sha256"] == recorded["sha256"]


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory tree (files first, then each directory)."""
    if path.is_dir():
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                _fsync_one(Path(root) / name, os.O_RDONLY)
            _fsync_one(Path(root), os.O_RDONLY)
    elif path.exists():
        _fsync_one(path, os.O_RDONLY)


def fsync_path_dir(path: Path) -> None:
    """fsync one directory entry list (after a rename into it), not its contents."""
    _fsync_one(Path(path), os.O_RDONLY)


def fsync_entry(path: Path, root: Path) -> None:
    """Make `path` (a file or a tree) durable together with its directory entries: the
    path itself, then every directory from its parent up to `root`. A new file (zarr writes
    a temp file and renames it) survives a power loss only once the directory holding its
    name is fsynced too."""
    fsync_path(path)
    fsync_parents(path, root)


def fsync_parents(path: Path, root: Path) -> None:
    """fsync every directory from `path`'s parent up to `root` (their entry lists only)."""
    path, root = Path(path), Path(root)
    for folder in path.parents:
        fsync_path_dir(folder)
        if folder == root:
            break


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that it exists complete or not at all."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tree_bytes(folder) -> int:
    """Total size of the files under `folder`."""
    total, stack = 0, [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file():
                    total += entry.stat().st_size
    return total


def _fsync_one(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunStore:
    """A segpipe store on disk: attributes record the inputs and settings of every stage."""

    def __init__(self, path: Path, group: zarr.Group):
        self.path = path
        self.group = group
        self._ledgers: dict[str, Ledger] = {}  # one per stage, its done-vector cached
        # On a Dask worker: the token of the client's lock this store is written under
        # (`check_lease`). None: this process holds the lock.
        self.lease: str | None = None

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path, read_only: bool = False) -> "RunStore":
        path = Path(path)
        if path.is_file():
            raise BadInput(f"store path {path} is a file, not a segpipe store directory")
        if not (path / "zarr.json").is_file():
            raise BadInput(f"no segpipe store at {path} (run `segpipe decode` first)")
        try:
            group = zarr.open_group(str(path), mode="r" if read_only else "r+")
        except Exception as e:  # noqa: BLE001 - any zarr failure is a damaged store to the user
            raise BadInput(f"store {path} cannot be read: {e}") from None
        if group.attrs.get("format") != FORMAT_NAME:
            raise BadInput(f"{path} is a zarr group but not a segpipe store")
        if group.attrs.get("schema_version") != SCHEMA_VERSION:
            raise BadInput(
                f"store {path} has schema version {group.attrs.get('schema_version')}, "
                f"this segpipe reads version {SCHEMA_VERSION}"
            )
        return cls(path, group)

    @classmethod
    def create(cls, path, attrs: dict) -> "RunStore":
        """Create a new store; the path must not exist or be an empty directory."""
        path = Path(path)
        if path.is_file():
            raise BadInput(f"store path {path} is a file, not a segpipe store directory")
        if path.exists() and any(path.iterdir()):
            raise BadInput(f"{path} exists and is not a segpipe store; choose another --store")
        all_attrs = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, **attrs}
        # One write of the group's zarr.json: the store exists with all its settings or not at all.
        group = zarr.create_group(str(path), attributes=all_attrs)
        fsync_entry(path / "zarr.json", path.absolute().parent)
        return cls(path, group)

    @staticmethod
    def exists(path) -> bool:
        return (Path(path) / "zarr.json").is_file()

    def check_lease(self) -> None:
        """On a Dask worker, refuse to write for a client that no longer holds the store's
        lock with the task's token (`lock.check_lease`). Every ledger write checks (`Ledger`),
        and each chunk's data before it is written: a run that took the lock since the task
        started may have reset the stage, and may have written this chunk already; a
        done-record written now would mark a chunk done without its data (and could send
        the reverse pass, which waits on the forward ledger, early)."""
        if self.lease is not None:
            from .lock import check_lease
            check_lease(self.path, self.lease)

    # -- attributes ------------------------------------------------------------------------
    @property
    def attrs(self) -> dict:
        return dict(self.group.attrs)

    def set_attrs(self, **values) -> None:
        """All `values` in one write of the group's zarr.json. (`attrs.update` writes it once
        per key: a kill between decode's `frame_count` and `decode_warning` left a store that
        read as decoded but lacked the warning.)"""
        self.group.update_attributes(values)
        fsync_entry(self.path / "zarr.json", self.path)

    def drop_attrs(self, *keys) -> None:
        """Remove `keys` (those present), in one write of zarr.json."""
        kept = {k: v for k, v in self.group.attrs.items() if k not in keys}
        if len(kept) < len(self.group.attrs):
            self.group.attrs.put(kept)
            fsync_entry(self.path / "zarr.json", self.path)

    def require(self, setting: str, have, want) -> None:
        """Refuse to mix settings in one store."""
        if have != want:
            raise StoreMismatch(
                f"store {self.path} was made with {setting}={have}, not {want}; "
                f"use a new --store (or the store's settings)"
            )

    # -- arrays ----------------------------------------------------------------------------
    def array(self, name: str) -> zarr.Array | None:
        """An array of the store, set to write every chunk, all-fill or not: zarr forgets
        `write_empty_chunks` when an array is reopened, and a chunk without a file could not
        be told from a deleted one."""
        try:
            node = self.group[name]
        except KeyError:
            return None
        if not isinstance(node, zarr.Array):
            return None
        return node.with_config({"write_empty_chunks": True})

    def create_array(self, name, shape, chunks, dtype, fill_value=0, compress=True,
                     attributes=None, overwrite=False) -> zarr.Array:
        """Arrays carry a crc32c checksum per chunk; `compress` adds zstd before it."""
        compressors = [ZstdCodec(level=3), Crc32cCodec()] if compress else [Crc32cCodec()]
        arr = self.group.create_array(
            name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value,
            compressors=compressors, attributes=attributes or {}, overwrite=overwrite,
            config={"write_empty_chunks": True},
        )
        fsync_entry(self.path / name / "zarr.json", self.path)
        return arr

    def ensure_array(self, name, shape, chunks, dtype, **kw) -> zarr.Array:
        arr = self.array(name)
        if arr is None or arr.dtype != np.dtype(dtype) or arr.chunks != tuple(chunks):
            arr = self.create_array(name, shape, chunks, dtype, overwrite=arr is not None, **kw)
        elif arr.shape != tuple(shape):
            arr.resize(shape)
        return arr

    def chunk_file(self, name: str, k: int, ndim: int) -> Path:
        """The file of chunk k along the first axis, first zarr chunk along every other axis
        (the only one, for arrays chunked along the first axis alone)."""
        return self.path.joinpath(name, "c", str(k), *["0"] * (ndim - 1))

    def chunk_files(self, name: str, k: int, cols: slice | None = None) -> list[Path]:
        """Every file of pipeline chunk k (chunk k along the first axis): one per zarr chunk
        along the other axes, as the array is chunked (`masks` of new stores: one per object;
        stores made before: one). `cols` narrows axis 1 to the zarr chunks it touches."""
        folder = self.path / name / "c" / str(k)
        return [folder.joinpath(*idx) for idx in _chunk_grid(self.array(name), cols)]

    def col_groups(self, name: str) -> list[tuple[int, int]]:
        """[a, b) ranges of axis 1 that one zarr chunk each holds (new stores' `masks`: one
        object each; arrays not chunked along axis 1: the whole axis)."""
        arr = self.array(name)
        n, step = arr.shape[1], arr.chunks[1]
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def read(self, name: str, lo: int | None = None, hi: int | None = None,
             cols: slice | None = None) -> np.ndarray:
        """arr[lo:hi] (arr[lo:hi, cols] with `cols`), verified: a missing chunk file (zarr
        would silently return fill) or a chunk failing its crc32c check raises `DamagedStore`
        naming the array and (pipeline) chunk."""
        arr = self.array(name)
        lo = 0 if lo is None else lo
        hi = arr.shape[0] if hi is None else hi
        step = arr.chunks[0]
        chunks = range(lo // step, -(-hi // step))
        grid, folder = _chunk_grid(arr, cols), self.path / name / "c"
        for k in chunks:
            for path in (folder.joinpath(str(k), *idx) for idx in grid):
                if not path.is_file():
                    raise DamagedStore(self.path, name, k,
                                       "is missing" + self._which(name, path))
        index = (slice(lo, hi),) if cols is None else (slice(lo, hi), cols)
        try:
            return arr[index]
        except Exception:  # noqa: BLE001 - find the chunk that fails, one zarr chunk at a time
            for k in chunks:
                for idx in grid:
                    region = tuple(slice(i * c, (i + 1) * c)
                                   for i, c in zip((k, *map(int, idx)), arr.chunks))
                    try:
                        arr[region]
                    except Exception as e:  # noqa: BLE001 - checksum, codec, truncation
                        raise DamagedStore(self.path, name, k, f"is corrupt ({str(e).split('.')[0]})"
                                           + self._which(name, folder.joinpath(str(k), *idx))) from None
            raise

    def _which(self, name: str, path: Path) -> str:
        """Which file of a pipeline chunk, where the chunk has several (masks: one per object)."""
        arr = self.array(name)
        if all(c >= n for c, n in zip(arr.chunks[1:], arr.shape[1:])):
            return ""
        return f" (zarr chunk {path.relative_to(self.path / name).as_posix()})"

    def delete(self, name: str) -> None:
        if name in self.group:
            del self.group[name]
            fsync_parents(self.path / name, self.path)  # the removal, durably
        for ledger in self._ledgers.values():  # a deleted ledger (or its folder) is read again
            if ledger.name == name or ledger.name.startswith(name.rstrip("/") + "/"):
                ledger._done = None

    def array_bytes(self) -> dict[str, int]:
        """Bytes on disk under each array of the store (one walk; each array's files once)."""
        sizes = {}
        for root, dirs, files in os.walk(self.path):
            rel = Path(root).relative_to(self.path)
            if "zarr.json" in files and rel != Path(".") and self.array(str(rel)) is not None:
                sizes[str(rel)] = _tree_bytes(root)
                dirs[:] = []  # counted: an array holds no other node
        return dict(sorted(sizes.items()))

    # -- chunk commits ---------------------------------------------------------------------
    def ledger(self, stage: str) -> "Ledger":
        """The stage's ledger; the same object every time, so its done-vector is read once."""
        ledger = self._ledgers.get(stage)
        if ledger is None:  # setdefault: one object even where two threads ask at once
            ledger = self._ledgers.setdefault(stage, Ledger(self, stage))
        return ledger

    def commit_array(self, name: str) -> None:
        """Make a whole (small) array durable."""
        fsync_entry(self.path / name, self.path)

    def sync_chunk(self, arrays, chunk: int) -> None:
        """Make chunk `chunk` (along the first axis) of `arrays` durable, directory entries
        included."""
        for name in arrays:
            fsync_path(self.path / name / "zarr.json")
            fsync_entry(self.path / name / "c" / str(chunk), self.path)

    def commit(self, stage: str, chunk: int, arrays: list[str] = (), files: list[Path] = ()) -> None:
        """Make chunk `chunk` of `arrays` (and any output `files`) durable, then record it done
        for `stage`: the done-record is written last, so a crash loses at most this chunk."""
        self.sync_chunk(arrays, chunk)
        for path in files:
            fsync_path(path)
        for folder in {Path(p).parent for p in files}:
            fsync_path_dir(folder)
        self.ledger(stage).mark_done(chunk)
        interrupt.check()  # a Ctrl-C / SIGTERM stops here, between two committed chunks


def _chunk_grid(arr: zarr.Array, cols: slice | None = None) -> list[tuple[str, ...]]:
    """The zarr chunk indices along axes 1.. (as key parts) of one pipeline chunk; `cols`
    narrows axis 1. An axis of length 0 counts one chunk, as segpipe always has."""
    grid = []
    for axis in range(1, arr.ndim):
        step = arr.chunks[axis]
        if axis == 1 and cols is not None:
            a, b, _ = cols.indices(arr.shape[1])
            grid.append(range(a // step, -(-b // step)))
        else:
            grid.append(range(max(1, -(-arr.shape[axis] // step))))
    return [tuple(map(str, idx)) for idx in itertools.product(*grid)]


def _record(value: int) -> bytes:
    """A ledger chunk file as zarr writes it: the uint8 value, then its crc32c checksum,
    exactly as `Crc32cCodec` appends it (the uint32 in native byte order)."""
    data = np.array([value], dtype=np.uint8).tobytes()
    return data + np.uint32(google_crc32c.value(data)).tobytes()


DONE_RECORD = _record(1)  # the only chunk file that reads back as 1 (done)


def _plain_layout(arr: zarr.Array) -> bool:
    """Whether the ledger array is laid out as segpipe writes it (1-D uint8, chunks of 1 under
    `c/<k>`, bytes + crc32c codecs, fill 0), so its chunk files can be read directly."""
    meta = arr.metadata
    try:
        return (meta.zarr_format == 3 and arr.ndim == 1 and arr.dtype == np.uint8
                and arr.chunks == (1,) and int(meta.fill_value) == 0
                and meta.to_dict()["chunk_key_encoding"] == {"name": "default",
                                                             "configuration": {"separator": "/"}}
                and [c["name"] for c in meta.to_dict()["codecs"]] == ["bytes", "crc32c"]
                and not meta.storage_transformers)
    except Exception:  # noqa: BLE001 - any other layout: read through zarr
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
        if _plain_layout(arr):
            done = self._read_files(arr.shape[0])
            if done is not None:
                return done
        return self._read_zarr(arr)

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
                    fd = (os.open(name, os.O_RDONLY, dir_fd=dir_fd) if use_dir_fd
                          else os.open(folder / name, os.O_RDONLY))
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
        self.store.check_lease()
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
            self.store.check_lease()
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
            self.store.check_lease()
            try:
                self.store.delete(self.name)
            finally:
                self._done = None
            self._done = bytearray()


# What each stage owns in the store: resetting a stage resets every later one too.
# (decode owns the whole store: starting it over means a new store.)
# The tracking results, one chunk per pipeline chunk (written with the memory snapshots).
TRACK_ARRAYS = ("masks", "object_scores", "tracked")

STAGE_OUTPUTS = {
    "encode": {"arrays": ["features"], "ledgers": ["encode", "dropped_features"],
               "attrs": ["model"]},
    "track": {"arrays": ["masks", "object_scores", "tracked", "memory", "prompt_masks"],
              "ledgers": ["track_forward", "track_reverse"], "attrs": ["track"]},
    "export": {"arrays": [], "ledgers": ["export_davis", "export_vis-json", "export_overlay",
                           "export_frames", "export_vos"],
               "attrs": ["exports"]},
}


def reset_from(store: RunStore, stage: str) -> None:
    """Start `stage` and every later stage over. Crash-safe order: done-records go first,
    then the data, then the settings that say what the data was made with."""
    stages = list(STAGE_OUTPUTS)[list(STAGE_OUTPUTS).index(stage):]
    for s in stages:
        for ledger in STAGE_OUTPUTS[s]["ledgers"]:
            store.ledger(ledger).reset()
    for s in stages:
        for name in STAGE_OUTPUTS[s]["arrays"]:
            store.delete(name)
    store.drop_attrs(*(key for s in stages for key in STAGE_OUTPUTS[s]["attrs"]))
