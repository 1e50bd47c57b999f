"""What a kind of source provides: `SourceKind`, the one interface that a video file, a
frame folder and a TIFF stack implement, with what each can do as flags (as zarr's `Store`
declares its capabilities). `segpipe.sources.registry` tells which kind a path is.

A frame comes as a *picture*: a zero-argument callable giving it as an upright RGB
`PIL.Image` at the source's own size, made wherever the caller calls it (in decode's resize
pool, for instance). Frames come as (pts, seconds, picture): pts an integer that orders the
frames and that the store keeps to find a frame again (a folder's or a stack's is the
frame's index), seconds its time (NaN where the source has no clock: the store's fps says
it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator

if TYPE_CHECKING:
    from segpipe.sources.info import VideoInfo

Frames = Iterator[tuple[int | None, float, Callable]]


class SourceKind:
    """A kind of source. Subclasses set the flags and implement the methods; one instance
    of each is registered (`registry.register`)."""

    name: ClassVar[str]  # recorded in the store (the video record's "kind")
    what: ClassVar[str]  # in messages: "a video file", "a frame folder"
    folder: ClassVar[bool] = False  # a folder of files (else one file)
    timed: ClassVar[bool] = False  # frames carry the source's own times (else t / --fps)
    streams: ClassVar[bool] = False  # may hold several video streams (--stream chooses)
    counted: ClassVar[bool] = True  # the frame count is exact before decoding
    named_frames: ClassVar[bool] = False  # frames are files: outputs keep their names
    fallback: ClassVar[bool] = False  # asked last: what no other kind claims

    def claims(self, path: Path) -> bool:
        """Whether `path` is a source of this kind (cheap: a suffix, a listing, a header)."""
        raise NotImplementedError

    def probe(self, path: Path, stream: int | None, fps: float | None) -> "VideoInfo":
        """What the source holds; refuses (`BadInput`) one whose first frame cannot be read."""
        raise NotImplementedError

    def for_store(self, path: Path, info: "VideoInfo") -> "VideoInfo":
        """What the store records of the source, from the probe's `info`: anything costly
        that reading the frames back needs is computed here, once (a TIFF's 16-bit window)."""
        return info

    def frames(
        self,
        path: Path,
        start: int,
        video: dict | None = None,
        before_pts: int | None = None,
        is_before: Callable | None = None,
    ) -> Frames:
        """(pts, seconds, picture) from frame `start` on. `video` is the store's record of
        the source (or a probe's `as_attrs()`; None: probed here); `before_pts` and
        `is_before` identify frame start-1 as stored, for kinds that seek."""
        raise NotImplementedError

    def sample(self, path: Path, info: "VideoInfo", start: int, n: int) -> list:
        """`n` pictures from about frame `start`, loaded (a hint for estimates)."""
        import itertools

        frames = self.frames(path, start, info.as_attrs())
        return [Loaded(p()) for _, _, p in itertools.islice(frames, n)]

    def identity(self, path: Path) -> dict:
        """How a store recognises this source (size, times, sha256; a folder's listing)."""
        from segpipe.sources.identity import file_identity

        return file_identity(path)

    def same(self, recorded: dict, path: Path) -> bool:
        """Whether `path` is still the source `recorded` (an `identity`) describes."""
        from segpipe.sources.identity import same_file

        return same_file(recorded, path)

    def frame_names(self, path: Path) -> list[str] | None:
        """The frames' own names (a folder's file stems), for outputs; None: numbered."""
        return None


class Loaded:
    """A picture already made an image."""

    def __init__(self, image):
        self.image = image

    def __call__(self):
        return self.image
