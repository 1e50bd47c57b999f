"""The run store: one zarr v3 group per video, plus the chunk ledger that makes stages resumable.

Completion is never inferred from zarr chunk files (an all-fill chunk may write none).
A chunk of a stage is done only when its ledger entry says so, and the entry is written
after the chunk's data has been fsynced (`RunStore.commit`).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from . import interrupt
from .errors import UserError

SCHEMA_VERSION = 1
FORMAT_NAME = "segpipe"


def file_identity(path: Path) -> dict:
    """Size, modification time and sha256 of a file: how a store recognises its source."""
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
    stat = Path(path).stat()
    if stat.st_size != recorded["size"]:
        return False
    if stat.st_mtime_ns == recorded.get("mtime_ns"):
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


def _fsync_one(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DamagedStore(UserError):
    """A chunk that the ledger says is done cannot be read back intact."""

    def __init__(self, store: Path, name: str, chunk: int, reason: str):
        super().__init__(f"store {store} is damaged: array {name!r} chunk {chunk} {reason}; "
                         f"run `segpipe repair --store {store}`")
        self.name, self.chunk, self.reason = name, chunk, reason


class RunStore:
    """A segpipe store on disk: attributes record the inputs and settings of every stage."""

    def __init__(self, path: Path, group: zarr.Group):
        self.path = path
        self.group = group

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path) -> "RunStore":
        path = Path(path)
        if path.is_file():
            raise UserError(f"store path {path} is a file, not a segpipe store directory")
        if not (path / "zarr.json").is_file():
            raise UserError(f"no segpipe store at {path} (run `segpipe decode` first)")
        try:
            group = zarr.open_group(str(path), mode="r+")
        except Exception as e:  # noqa: BLE001 - any zarr failure is a damaged store to the user
            raise UserError(f"store {path} cannot be read: {e}") from None
        if group.attrs.get("format") != FORMAT_NAME:
            raise UserError(f"{path} is a zarr group but not a segpipe store")
        if group.attrs.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"store {path} has schema version {group.attrs.get('schema_version')}, "
                f"this segpipe reads version {SCHEMA_VERSION}"
            )
        return cls(path, group)

    @classmethod
    def create(cls, path, attrs: dict) -> "RunStore":
        """Create a new store; the path must not exist or be an empty directory."""
        path = Path(path)
        if path.is_file():
            raise UserError(f"store path {path} is a file, not a segpipe store directory")
        if path.exists() and any(path.iterdir()):
            raise UserError(f"{path} exists and is not a segpipe store; choose another --store")
        all_attrs = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, **attrs}
        # One write of the group's zarr.json: the store exists with all its settings or not at all.
        group = zarr.create_group(str(path), attributes=all_attrs)
        fsync_entry(path / "zarr.json", path.absolute().parent)
        return cls(path, group)

    @staticmethod
    def exists(path) -> bool:
        return (Path(path) / "zarr.json").is_file()

    # -- attributes ------------------------------------------------------------------------
    @property
    def attrs(self) -> dict:
        return dict(self.group.attrs)

    def set_attrs(self, **values) -> None:
        self.group.attrs.update(values)
        fsync_entry(self.path / "zarr.json", self.path)

    def require(self, setting: str, have, want) -> None:
        """Refuse to mix settings in one store."""
        if have != want:
            raise UserError(
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
        """The file of chunk k along the first axis (every other axis is one chunk)."""
        return self.path.joinpath(name, "c", str(k), *["0"] * (ndim - 1))

    def read(self, name: str, lo: int | None = None, hi: int | None = None) -> np.ndarray:
        """arr[lo:hi], verified: a missing chunk file (zarr would silently return fill) or a
        chunk failing its crc32c check raises `DamagedStore` naming the array and chunk."""
        arr = self.array(name)
        lo = 0 if lo is None else lo
        hi = arr.shape[0] if hi is None else hi
        step = arr.chunks[0]
        chunks = range(lo // step, -(-hi // step))
        for k in chunks:
            if not self.chunk_file(name, k, arr.ndim).is_file():
                raise DamagedStore(self.path, name, k, "is missing")
        try:
            return arr[lo:hi]
        except Exception:  # noqa: BLE001 - find the chunk that fails
            for k in chunks:
                try:
                    arr[k * step:(k + 1) * step]
                except Exception as e:  # noqa: BLE001 - checksum, codec, truncation
                    raise DamagedStore(self.path, name, k, f"is corrupt ({str(e).split('.')[0]})") from None
            raise

    def delete(self, name: str) -> None:
        if name in self.group:
            del self.group[name]
            fsync_parents(self.path / name, self.path)  # the removal, durably

    def array_bytes(self) -> dict[str, int]:
        """Bytes on disk under each array of the store."""
        sizes = {}
        for root, _dirs, files in os.walk(self.path):
            rel = Path(root).relative_to(self.path)
            if "zarr.json" in files and rel != Path("."):
                node = self.array(str(rel))
                if node is not None:
                    sizes[str(rel)] = sum(
                        f.stat().st_size for f in Path(root).rglob("*") if f.is_file()
                    )
        return dict(sorted(sizes.items()))

    # -- chunk commits ---------------------------------------------------------------------
    def ledger(self, stage: str) -> "Ledger":
        return Ledger(self, stage)

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


class Ledger:
    """Per-stage done-records: uint8 array `ledger/<stage>`, one zarr chunk per pipeline chunk."""

    def __init__(self, store: RunStore, stage: str):
        self.store = store
        self.name = f"ledger/{stage}"

    def _array(self, create: bool = False) -> zarr.Array | None:
        arr = self.store.array(self.name)
        if arr is None and create:
            arr = self.store.create_array(self.name, (0,), (1,), "uint8", compress=False)
        return arr

    def done(self) -> np.ndarray:
        """Boolean vector over chunk indices recorded so far; an unreadable record counts as
        not done (the chunk is simply redone)."""
        arr = self._array()
        if arr is None or arr.shape[0] == 0:
            return np.zeros(0, dtype=bool)
        try:
            return arr[:] == 1
        except Exception:  # noqa: BLE001 - a damaged record
            done = np.zeros(arr.shape[0], dtype=bool)
            for k in range(arr.shape[0]):
                try:
                    done[k] = arr[k] == 1
                except Exception:  # noqa: BLE001
                    pass
            return done

    def todo(self, chunks) -> list[int]:
        """The chunks of `chunks` (in their order) not recorded done."""
        done = self.done()
        return [k for k in chunks if not (k < len(done) and done[k])]

    def count(self) -> int:
        return int(self.done().sum())

    def mark_done(self, chunk: int) -> None:
        arr = self._array(create=True)
        if chunk >= arr.shape[0]:
            arr.resize((chunk + 1,))
            fsync_entry(self.store.path / self.name / "zarr.json", self.store.path)
        arr[chunk] = 1
        fsync_entry(self.store.path / self.name / "c" / str(chunk), self.store.path)

    def undo(self, chunk: int) -> None:
        """Mark one chunk not done (repair), durably."""
        arr = self._array()
        if arr is not None and chunk < arr.shape[0]:
            arr[chunk] = 0
            fsync_entry(self.store.path / self.name / "c" / str(chunk), self.store.path)

    def reset(self) -> None:
        self.store.delete(self.name)


# What each stage owns in the store: resetting a stage resets every later one too.
# (decode owns the whole store: starting it over means a new store.)
STAGE_OUTPUTS = {
    "encode": {"arrays": ["features"], "ledgers": ["encode"], "attrs": ["model"]},
    "track": {"arrays": ["masks", "object_scores", "tracked", "memory", "prompt_masks"],
              "ledgers": ["track_forward", "track_reverse"], "attrs": ["track"]},
    "export": {"arrays": [], "ledgers": ["export_davis", "export_vis-json", "export_overlay"],
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
    for s in stages:
        for key in STAGE_OUTPUTS[s]["attrs"]:
            if key in store.group.attrs:
                del store.group.attrs[key]
    fsync_entry(store.path / "zarr.json", store.path)
