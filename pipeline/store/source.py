"""The store's source video: read from any frame on, picked up where the stored frames end
and checked against them, and found unchanged before it is read again."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from segpipe.errors import BadInput, DamagedStore, StoreMismatch
from segpipe.sources.frames import frame_digests, model_input
from segpipe.sources.registry import iter_frames, named, same_source
from segpipe.store.retention import has
from segpipe.store.runstore import RunStore


def source_from(store: RunStore, video: Path, start: int):
    """The store's source from frame `start` on, picked up where the stored frames end: by
    the stored pts of frame start-1, a seek proven by that frame's model input being the
    stored one (pts can repeat), else by counting (also where the stored pts go back)."""
    attrs = store.attrs["video"]
    before = check = None
    if start > 0:
        pts = store.read("pts", max(0, start - 2), start)
        if len(pts) < 2 or pts[0] < pts[1]:
            before = int(pts[-1])
            S = store.image_size
            if has(store, "frames", (start - 1) // store.chunk_size):
                stored = store.read("frames", start - 1, start)[0]
                check = lambda picture: np.array_equal(model_input(picture, S), stored)  # noqa: E731
            else:  # the frames were dropped: their digests stay
                digest = store.read("frame_digests", start - 1, start)[0]
                check = lambda picture: np.array_equal(  # noqa: E731
                    frame_digests(model_input(picture, S)[None])[0], digest
                )
    frames = iter_frames(video, start, attrs, before, check)
    if not named(attrs.get("kind")).timed:  # frame t is at t / fps, the store's setting
        return ((t, t / attrs["fps"], picture) for t, _, picture in frames)
    return frames


def stored_source(store: RunStore) -> Path:
    """The video the store was made from, which must still be there, unchanged: decoding
    dropped or damaged chunks again reads it."""
    source = Path(store.attrs["source"]["path"])
    if not source.exists():
        raise BadInput(
            f"the source video {source} is gone: chunks whose frames are not in "
            f"the store cannot be decoded again"
        )
    if not same_source(store.attrs["source"], source, store.attrs["video"].get("kind")):
        raise BadInput(
            f"the source video {source} changed since it was decoded: chunks "
            f"whose frames are not in the store cannot be decoded again"
        )
    return source


class SourceReader:
    """The store's source, a range of frames at a time, each frame checked against the pts
    stored for it: whichever ranges were read before and in whatever order, a range gives
    the frames a straight decode gives. One that starts where the last one ended reads on
    from the open decoder (the source is decoded once, however long the video); any other
    is picked up again by `source_from` (a proven seek to a keyframe before it, or counting
    from the start). The one way the stages read a source again (decode's redecoding, the
    overlay export)."""

    def __init__(self, store: RunStore, video: Path):
        self.store, self.video = store, Path(video)
        self._frames, self._next = None, None

    def frames(self, lo: int, n: int):
        """(pts, seconds, picture) of frames lo..lo+n-1; `BadInput` if the source ends
        before them, `StoreMismatch` if a frame comes with another pts than the stored one
        (the source no longer decodes as it did, or a seek landed wrong)."""
        stored = self._stored_pts(lo, lo + n)
        if self._next != lo:
            self._frames = source_from(self.store, self.video, lo)
        self._next = None  # until this range is read whole
        for t in range(lo, lo + n):
            frame = next(self._frames, None)
            if frame is None:
                raise BadInput(f"the source video {self.video} ends before frame {t}")
            pts = -1 if frame[0] is None else frame[0]  # as decode stores it
            if stored is not None and t - lo < len(stored) and pts != stored[t - lo]:
                self._frames = None
                raise StoreMismatch(
                    f"frame {t} of {self.video} comes with pts {pts}, but store "
                    f"{self.store.path} has {stored[t - lo]} for it: the source does not "
                    f"decode as it did when it was decoded into the store"
                )
            if t == lo + n - 1:
                self._next = lo + n  # the decoder stands at the next range
            yield frame

    def _stored_pts(self, lo: int, hi: int):
        """The stored pts of frames lo..hi-1; None where a chunk of them does not read back
        (a repair is decoding it again: there is nothing to check against)."""
        try:
            return self.store.read("pts", lo, hi)
        except DamagedStore:
            return None
