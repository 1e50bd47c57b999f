"""Reading results back: `segpipe.open(store)` gives a read-only `Run`."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from segpipe.errors import BadInput, StoreNotReady
from segpipe.store.runstore import RunStore


class Run:
    """A read-only view of a segpipe store: the video's frames and times, and the tracked
    masks and object scores, read (and checksum-verified) chunk by chunk.

    Example:
        >>> run = segpipe.open("clip.zarr")
        >>> run.frame_count, run.fps, run.object_ids
        (1800, 29.97, [1, 2])
        >>> run.masks(frames=slice(0, 100), objects=[2]).shape   # (frames, objects, H, W)
        (100, 1, 1080, 1920)
        >>> run.mask(42, 1)                                       # (H, W) bool
    """

    def __init__(self, store):
        self.path = RunStore.open(store, read_only=True).path

    def __repr__(self) -> str:
        return f"segpipe.Run({str(self.path)!r})"

    @property
    def _store(self) -> RunStore:
        """The store as it is now: each read opens it afresh, so a `Run` kept across a
        retrack (or a run still going in another process) never mixes old attributes with
        new arrays."""
        return RunStore.open(self.path, read_only=True)

    @property
    def frame_count(self) -> int:
        """Frames that decoded (the video's true length)."""
        T = self._store.attrs.get("frame_count")
        if T is None:
            raise StoreNotReady(f"store {self.path} is not fully decoded yet (run decode)")
        return T

    @property
    def fps(self) -> float:
        return self._store.attrs["video"]["fps"]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the video, as PIL and the prompts' (x, y) give sizes; the
        masks are numpy arrays of (height, width): `run.masks().shape[-2:] == run.size[::-1]`."""
        video = self._store.attrs["video"]
        return video["width"], video["height"]

    @property
    def timestamps(self) -> np.ndarray:
        """Each frame's presentation time in seconds (NaN where the video has none)."""
        return self._store.read("timestamps", 0, self.frame_count)

    @property
    def object_ids(self) -> list[int]:
        """The tracked objects' ids, in the order of the masks' object axis."""
        from segpipe.store.tracking import tracked_ids

        return tracked_ids(self._store, self._tracking())

    def flags(self) -> list:
        """Where each object may be lost (`segpipe.flags.Flag`: object, frame, kind, reason),
        by frame, as `segpipe status --flags` and the studio show them; reads every mask
        once."""
        from segpipe.flags import of_store

        return of_store(self._store)

    @property
    def labels(self) -> dict:
        """The objects' names and classes (`segpipe.Label`), by object id: those named, and
        those segpipe studio added before their first prompt (`segpipe.label`)."""
        from segpipe.store.labels import stored

        return stored(self._store)

    @property
    def scores(self) -> np.ndarray:
        """(frames, objects) float32: SAM 2's object score logit, NaN where untracked."""
        self._tracking()
        return self._store.read("object_scores")

    @property
    def areas(self) -> np.ndarray:
        """(frames, objects) int64: each mask's area in pixels at the video's size, 0 where
        untracked."""
        self._tracking()
        return self._store.read("object_areas")

    @property
    def tracked(self) -> np.ndarray:
        """(frames,) bool: the frames some tracking pass reached."""
        self._tracking()
        return self._store.read("tracked").any(axis=1)

    def masks(self, frames: slice | None = None, objects: list[int] | None = None) -> np.ndarray:
        """(frames, objects, H, W) bool masks of `frames` (a slice; default all) and `objects`
        (ids; default all), assembled chunk by chunk."""
        store = self._store
        indices, slots = self._frames(frames, store), self._slots(objects, store)
        video = store.attrs["video"]
        out = np.zeros((len(indices), len(slots), video["height"], video["width"]), bool)
        done = 0
        for _, chunk in self._chunks(store, indices, slots):
            out[done : done + len(chunk)] = chunk
            done += len(chunk)
        return out

    def iter_masks(
        self, frames: slice | None = None, objects: list[int] | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(frame indices, masks) one store chunk at a time: for ranges too large to hold."""
        store = self._store  # one opening for the whole read: its attributes fit its arrays
        yield from self._chunks(store, self._frames(frames, store), self._slots(objects, store))

    @staticmethod
    def _chunks(store: RunStore, indices: np.ndarray, slots: list[int]):
        """Per store chunk, its frames of `indices` and their masks of `slots`: only the
        frames asked for, read object by object (a zarr chunk holds one object), so a
        read holds at most one zarr chunk beyond what it returns."""
        plan, video = store.plan, store.attrs["video"]
        chunk_of = indices // plan.chunk_size
        for k in dict.fromkeys(chunk_of.tolist()):
            wanted = indices[chunk_of == k]
            a, b = int(wanted.min()), int(wanted.max()) + 1
            data = np.empty((b - a, len(slots), video["height"], video["width"]), bool)
            for i, s in enumerate(slots):
                data[:, i : i + 1] = store.read("masks", a, b, slice(s, s + 1))
            in_order = len(wanted) == b - a and wanted[0] == a  # a..b-1, ascending
            yield wanted, data if in_order else data[wanted - a]

    def mask(self, frame: int, object: int) -> np.ndarray:  # noqa: A002 - the API's word
        """(H, W) bool mask of one object on one frame."""
        T = self.frame_count
        if not -T <= frame < T:
            raise BadInput(f"frame {frame} is out of range: the video has frames 0..{T - 1}")
        frame %= T
        return self.masks(slice(frame, frame + 1), [object])[0, 0]

    def status(self) -> dict:
        """Per stage chunks done / total, bytes per array, warnings (as `segpipe status --json`)."""
        from segpipe.status import describe

        return describe(self.path)

    # -- helpers ---------------------------------------------------------------------------
    def _tracking(self, store: RunStore | None = None) -> dict:
        from segpipe.store.tracking import require_tracked

        return require_tracked(store or self._store)

    def _frames(self, frames, store: RunStore) -> np.ndarray:
        T = store.attrs.get("frame_count")
        if T is None:
            raise StoreNotReady(f"store {self.path} is not fully decoded yet (run decode)")
        if frames is None:
            frames = slice(None)
        if not isinstance(frames, slice):
            raise BadInput(f"frames must be a slice (e.g. slice(0, 100)), got {frames!r}")
        return np.arange(T)[frames]

    def _slots(self, objects, store: RunStore) -> list[int]:
        from segpipe.store.tracking import tracked_ids

        ids = tracked_ids(store, self._tracking(store))
        if objects is None:
            return list(range(len(ids)))
        if isinstance(objects, (int, np.integer)):
            objects = [objects]
        unknown = [o for o in objects if o not in ids]
        if unknown or not len(objects):
            raise BadInput(
                f"unknown object id {unknown[0] if unknown else objects!r}; "
                f"the store tracks {', '.join(map(str, ids))}"
            )
        return [ids.index(o) for o in objects]
