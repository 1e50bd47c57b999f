"""`RunStore`: one zarr v3 group per video, its attributes, its arrays read back verified,
and chunk commits (the data made durable, then the done-record in the ledger).

Completion is never inferred from zarr chunk files (an all-fill chunk may write none).
A chunk of a stage is done only when its ledger entry says so, and the entry is written
after the chunk's data has been fsynced (`RunStore.commit`).
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

from segpipe import interrupt
from segpipe.errors import BadInput, DamagedStore, StoreMismatch
from segpipe.fsutil import (
    empty_trash,
    fsync_entry,
    fsync_path,
    fsync_path_dir,
    remove_tree,
    resolved,
    tree_bytes,
)
from segpipe.plan import ChunkPlan
from segpipe.store.ledger import PASS_STAGES, Ledger, PassLedger, pass_stage
from segpipe.store.lock import check_lease
from segpipe.store.migrate import FORMAT_NAME, SCHEMA_VERSION, STEPS

# 1: earlier layouts (masks chunks, missing attrs); 2: one layout; 3: object_areas;
# 4: tracking stored per object (memory, ledgers, scores, areas, tracked): object groups


class LeasedFiles(LocalStore):
    """zarr's local store, every write of which (a chunk, metadata, attributes, a deletion:
    zarr checks each with `_check_writable`) first checks the lease it was opened under
    (`lock.check_lease`): on a Dask worker, a task whose client no longer holds the store's
    lock with the task's token writes nothing, whichever write comes first. Without a
    lease (this process holds the lock) it is zarr's own store."""

    def __init__(self, root, *, read_only: bool = False, lease: str | None = None):
        super().__init__(root, read_only=read_only)
        self.lease = lease

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.root, read_only=read_only, lease=self.lease)

    def _check_writable(self) -> None:
        super()._check_writable()
        if self.lease is not None:
            check_lease(self.root, self.lease)


# The decodes running in this process alongside a run's tracking, by the real path of their
# store (`stages.alongside.Alongside` registers itself): the tracking reads a chunk's frames
# once its decode has committed them, and works to the frame count the source claims.
ALONGSIDE: dict[str, object] = {}
ATTRS_WRITE = threading.Lock()  # one write of a store's attributes at a time in a process


class RunStore:
    """A segpipe store on disk: attributes record the inputs and settings of every stage."""

    def __init__(self, path: Path, group: zarr.Group):
        self.path = path
        self.group = group
        self._ledgers: dict[str, Ledger] = {}  # one per stage, its done-vector cached
        # On a Dask worker: the token of the client's lock this store is written under
        # (`LeasedFiles`). None: this process holds the lock.
        self.lease: str | None = group.store.lease if isinstance(group.store, LeasedFiles) else None

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path, read_only: bool = False, lease: str | None = None) -> "RunStore":
        """The store at `path`; `lease`: the token of the client's lock a Dask task writes
        under (every write checks it). A store of another schema than this segpipe's is
        refused in one line saying how to go on (`segpipe migrate`, where it converts it)."""
        path = Path(path)
        if path.is_file():
            raise BadInput(f"store path {path} is a file, not a segpipe store directory")
        if not (path / "zarr.json").is_file():
            if path.is_dir() and any(path.iterdir()):
                raise BadInput(f"{path} is a folder but not a segpipe store (no zarr.json in it)")
            raise BadInput(
                f"no segpipe store at {path} (`segpipe run` or `segpipe decode` makes one)"
            )
        try:
            files = LeasedFiles(str(path), read_only=read_only, lease=lease)
            group = zarr.open_group(store=files, mode="r" if read_only else "r+")
        except Exception as e:  # noqa: BLE001 - any zarr failure is a damaged store to the user
            raise BadInput(f"store {path} cannot be read: {e}") from None
        if group.attrs.get("format") != FORMAT_NAME:
            raise BadInput(f"{path} is a zarr group but not a segpipe store")
        version = group.attrs.get("schema_version")
        if version != SCHEMA_VERSION:
            how = (
                f"`segpipe migrate --store {path}` converts it in place, keeping its frames, "
                f"features, memory and masks"
                if version in STEPS
                else f"make a new store (a new --store, or delete {path}) and run the command again"
            )
            raise BadInput(
                f"store {path} has schema version {version}; this segpipe reads version "
                f"{SCHEMA_VERSION}: {how}"
            )
        if not read_only and lease is None:  # the writer: what a killed removal left
            empty_trash(cls.trash_of(path))
        return cls(path, group)

    @classmethod
    def create(cls, path, attrs: dict) -> "RunStore":
        """Create a new store; the path must not exist or be an empty directory."""
        path = Path(path)
        if path.is_file():
            raise BadInput(f"store path {path} is a file, not a segpipe store directory")
        if path.exists() and any(path.iterdir()):
            raise BadInput(f"{path} exists and is not a segpipe store; choose another --store")
        empty_trash(cls.trash_of(path))  # what a killed removal (decode --force) left
        all_attrs = {"format": FORMAT_NAME, "schema_version": SCHEMA_VERSION, **attrs}
        # One write of the group's zarr.json: the store exists with all its settings or not at all.
        group = zarr.create_group(str(path), attributes=all_attrs)
        fsync_entry(path / "zarr.json", path.absolute().parent)
        return cls(path, group)

    @property
    def plan(self) -> ChunkPlan:
        """The chunk plan of a decoded store (or one decoding `alongside`): its frame count in
        chunks of its chunk size."""
        T = self.frame_count
        if T is None:
            raise KeyError("frame_count")
        return ChunkPlan(T, self.chunk_size)

    @property
    def chunk_size(self) -> int:
        """C, as decode recorded it (`settings.Decoding`, the store's `decoding` record)."""
        return self.attrs["decoding"]["chunk_size"]

    @property
    def image_size(self) -> int:
        """S, the model's input size, as decode recorded it."""
        return self.attrs["decoding"]["image_size"]

    @property
    def frame_count(self) -> int | None:
        """The frame count decode recorded (it is complete then); while it decodes alongside
        a run's tracking in this process, the count that run works to; else None."""
        T = self.attrs.get("frame_count")
        if T is None and self.alongside is not None:
            return self.alongside.count
        return T

    @property
    def alongside(self):
        """The decode running in this process alongside a run's tracking of this store
        (`stages.alongside.Alongside`, registered in `ALONGSIDE` while it runs), or None."""
        return ALONGSIDE.get(os.path.realpath(self.path)) if ALONGSIDE else None

    @staticmethod
    def exists(path) -> bool:
        return (Path(path) / "zarr.json").is_file()

    def check_lease(self) -> None:
        """On a Dask worker, refuse to go on for a client that no longer holds the store's
        lock with the task's token: what `LeasedFiles` checks before every write to the
        store, for the writes outside it (an export's files). A run that took the lock
        since the task started may have reset the stage and written this chunk already; a
        done-record written now would mark a chunk done without its data (and could send
        the reverse pass, which waits on the forward ledger, early)."""
        if self.lease is not None:
            check_lease(self.path, self.lease)

    # -- attributes ------------------------------------------------------------------------
    @property
    def attrs(self) -> dict:
        return dict(self.group.attrs)

    def set_attrs(self, **values) -> None:
        """All `values` in one write of the group's zarr.json. (`attrs.update` writes it once
        per key: a kill between decode's `frame_count` and `decode_warning` left a store that
        read as decoded but lacked the warning.) Written over the attributes on disk, not
        those this object read when opened: another `RunStore` of the store in this process
        may have written since (a decode alongside the tracking records its frame count)."""
        with ATTRS_WRITE:
            self._reread_attrs()
            self.group.update_attributes(values)
            fsync_entry(self.path / "zarr.json", self.path)

    def drop_attrs(self, *keys) -> None:
        """Remove `keys` (those present), in one write of zarr.json (over those on disk)."""
        with ATTRS_WRITE:
            self._reread_attrs()
            kept = {k: v for k, v in self.group.attrs.items() if k not in keys}
            if len(kept) < len(self.group.attrs):
                self.group.attrs.put(kept)
                fsync_entry(self.path / "zarr.json", self.path)

    def _reread_attrs(self) -> None:
        self.group = zarr.open_group(store=self.group.store, mode="r+")

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

    def create_array(
        self,
        name,
        shape,
        chunks,
        dtype,
        fill_value=0,
        compress=True,
        attributes=None,
        overwrite=False,
    ) -> zarr.Array:
        """Arrays carry a crc32c checksum per chunk; `compress` adds zstd before it."""
        compressors = [ZstdCodec(level=3), Crc32cCodec()] if compress else [Crc32cCodec()]
        arr = self.group.create_array(
            name,
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            fill_value=fill_value,
            compressors=compressors,
            attributes=attributes or {},
            overwrite=overwrite,
            config={"write_empty_chunks": True},
        )
        # the array's zarr.json, and those of the groups zarr made above it (`ledger/`,
        # `memory/`, ...), whose loss would hide the array, each with its directory entries
        for parent in [p for p in Path(name).parents if p != Path(".")]:
            fsync_path(self.path / parent / "zarr.json")
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
        along the other axes, as the array is chunked (`masks`: one per object and band of
        rows). `cols` narrows axis 1 to the zarr chunks it touches."""
        folder = self.path / name / "c" / str(k)
        return [folder.joinpath(*idx) for idx in _chunk_grid(self.array(name), cols)]

    def col_groups(self, name: str) -> list[tuple[int, int]]:
        """[a, b) ranges of axis 1 that one zarr chunk each holds (`masks`: one object each;
        arrays not chunked along axis 1: the whole axis)."""
        arr = self.array(name)
        if arr is None:  # (a reset under way, read from another thread or process)
            raise DamagedStore(self.path, name, 0, "is missing (the whole array)")
        n, step = arr.shape[1], arr.chunks[1]
        return [(a, min(a + step, n)) for a in range(0, n, step)]

    def read(
        self, name: str, lo: int | None = None, hi: int | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """arr[lo:hi] (arr[lo:hi, cols] with `cols`), verified: a missing chunk file (zarr
        would silently return fill) or a chunk failing its crc32c check raises `DamagedStore`
        naming the array and (pipeline) chunk."""
        arr = self.array(name)
        if arr is None:  # (a reset under way, read from another thread or process)
            raise DamagedStore(self.path, name, 0, "is missing (the whole array)")
        lo = 0 if lo is None else lo
        hi = arr.shape[0] if hi is None else hi
        step = arr.chunks[0]
        chunks = range(lo // step, -(-hi // step))
        grid, folder = _chunk_grid(arr, cols), self.path / name / "c"
        for k in chunks:
            for path in (folder.joinpath(str(k), *idx) for idx in grid):
                if not path.is_file():
                    raise DamagedStore(self.path, name, k, "is missing" + self._which(name, path))
        index = (slice(lo, hi),) if cols is None else (slice(lo, hi), cols)
        try:
            return arr[index]
        except Exception:  # noqa: BLE001 - find the chunk that fails, one zarr chunk at a time
            for k in chunks:
                for idx in grid:
                    region = tuple(
                        slice(i * c, (i + 1) * c) for i, c in zip((k, *map(int, idx)), arr.chunks)
                    )
                    try:
                        arr[region]
                    except Exception as e:  # noqa: BLE001 - checksum, codec, truncation
                        raise DamagedStore(
                            self.path,
                            name,
                            k,
                            f"is corrupt ({str(e).split('.')[0]})"
                            + self._which(name, folder.joinpath(str(k), *idx)),
                        ) from None
            raise

    def _which(self, name: str, path: Path) -> str:
        """Which file of a pipeline chunk, where the chunk has several (masks: one per object)."""
        arr = self.array(name)
        if arr is None or all(c >= n for c, n in zip(arr.chunks[1:], arr.shape[1:])):
            return ""
        return f" (zarr chunk {path.relative_to(self.path / name).as_posix()})"

    @staticmethod
    def trash_of(path) -> Path:
        """Where removals go before they are deleted (`fsutil.remove_tree`): beside the
        store, as its lock file is, so zarr never lists it and the store itself can go."""
        path = resolved(path)
        return path.with_name(f".{path.name}.trash")

    @classmethod
    def remove(cls, path) -> None:
        """Remove the whole store at `path` (decode --force), never leaving half a store."""
        remove_tree(resolved(path), cls.trash_of(path))
        empty_trash(cls.trash_of(path))

    def delete(self, name: str) -> None:
        """Remove node `name` (an array or a group) atomically: it is there whole, or gone
        with every file under it, whatever zarr made of it before (a folder without its
        zarr.json goes too). The lease is checked first, as zarr checks it before a write."""
        self.group.store._check_writable()
        trash = self.trash_of(self.path)  # (what a killed removal left: emptied at open)
        remove_tree(self.path / name, trash)
        empty_trash(trash)
        for ledger in list(
            self._ledgers.values()
        ):  # a deleted ledger (or its folder) is read again
            if ledger.name == name or ledger.name.startswith(name.rstrip("/") + "/"):
                ledger._done = None

    def array_bytes(self) -> dict[str, int]:
        """Bytes on disk under each array of the store (one walk; each array's files once)."""
        sizes = {}
        for root, dirs, files in os.walk(self.path):
            rel = Path(root).relative_to(self.path)
            if "zarr.json" in files and rel != Path(".") and self.array(str(rel)) is not None:
                sizes[str(rel)] = tree_bytes(root)
                dirs[:] = []  # counted: an array holds no other node
        return dict(sorted(sizes.items()))

    # -- chunk commits ---------------------------------------------------------------------
    def ledger(self, stage: str) -> "Ledger | PassLedger":
        """The stage's ledger; the same object every time, so its done-vector is read once.
        A tracking pass's is a `PassLedger` over its objects' ledgers."""
        ledger = self._ledgers.get(stage)
        if ledger is None:  # setdefault: one object even where two threads ask at once
            kind = PassLedger if stage in PASS_STAGES else Ledger
            ledger = self._ledgers.setdefault(stage, kind(self, stage))
        return ledger

    def pass_ledger(self, direction: str) -> "PassLedger":
        """The ledger of the tracking pass `direction` ("forward", "reverse")."""
        return self.ledger(pass_stage(direction))

    def commit_array(self, name: str) -> None:
        """Make a whole (small) array durable."""
        fsync_entry(self.path / name, self.path)

    def sync_chunk(self, arrays, chunk: int, cols: slice | None = None) -> None:
        """Make chunk `chunk` (along the first axis) of `arrays` durable, directory entries
        included, first removing the temp files of writes killed in it (zarr writes each
        chunk file as `<file>.<random>.partial`, renamed when complete: a kill mid-write
        leaves one, up to a chunk of features, that nothing else would delete). `cols`: only
        the zarr chunks of those objects (axis 1, chunked one object per zarr chunk: the
        tracking results), which another group of objects may be writing beside them."""
        for name in arrays:
            fsync_path(self.path / name / "zarr.json")
            folder = self.path / name / "c" / str(chunk)
            if cols is None:
                self._remove_partials(name, chunk)
                fsync_entry(folder, self.path)
                continue
            for s in range(*cols.indices(self.array(name).shape[1])):
                self._remove_partials(name, chunk, str(s))
                fsync_entry(folder / str(s), self.path)

    def _remove_partials(self, name: str, chunk: int, col: str | None = None) -> None:
        folder = self.path / name / "c"
        found = list(folder.glob(f"{chunk}.*.partial")) if col is None else []  # 1-d arrays
        top = folder / str(chunk) if col is None else folder / str(chunk) / col
        if col is not None:
            found += list((folder / str(chunk)).glob(f"{col}.*.partial"))  # (C, 1) chunks
        if top.is_dir():
            found += [
                Path(root) / f
                for root, _, files in os.walk(top)
                for f in files
                if f.endswith(".partial")
            ]
        for path in found:
            path.unlink(missing_ok=True)

    def commit(
        self, stage: str, chunk: int, arrays: list[str] = (), files: list[Path] = ()
    ) -> None:
        """Make chunk `chunk` of `arrays` (and any output `files`) durable, then record it done
        for `stage`: the done-record is written last, so a crash loses at most this chunk."""
        self.sync_chunk(arrays, chunk)
        for path in files:
            fsync_path(path)
        for folder in {Path(p).parent for p in files}:
            fsync_path_dir(folder)
        self.ledger(stage).mark_done(chunk)
        interrupt.check()  # a Ctrl-C / SIGTERM stops here, between two committed chunks

    def commit_objects(
        self, direction: str, chunk: int, slots: list[int], shared: list[str], own: list[str]
    ) -> None:
        """`commit` for a group of objects of a tracking pass: chunk `chunk` made durable in
        `shared` arrays (chunked one object per zarr chunk: only objects `slots`, which are
        contiguous) and in `own` arrays (the group's objects' alone: their memory); then
        each object's done-record (`ledger.object_stage`)."""
        from segpipe.store.ledger import object_stage

        self.sync_chunk(shared, chunk, slice(slots[0], slots[-1] + 1))
        self.sync_chunk(own, chunk)
        for s in slots:
            self.ledger(object_stage(direction, s)).mark_done(chunk)
        interrupt.check()


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
