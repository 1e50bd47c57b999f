"""The source kinds segpipe reads, and which one a path is: the one place the rest of
segpipe asks about a source (probe it, read its frames from any frame on, sample it,
recognise it again).

The kinds are asked in order and the first that claims a path reads it: a TIFF folder, a
frame folder, a TIFF file, then a video file (what FFmpeg reads: anything else). A kind
registered later (`register`) is asked before the video file. A store records its
source's kind by name (`named`), so a source is read back as the kind it was decoded as.
"""

from __future__ import annotations

from pathlib import Path

from segpipe.errors import BadInput
from segpipe.fsutil import resolved
from segpipe.sources.base import SourceKind
from segpipe.sources.folder import FrameFolder
from segpipe.sources.info import VideoInfo
from segpipe.sources.tiff import TiffFolder, TiffStack
from segpipe.sources.video import VideoFile

_KINDS: list[SourceKind] = []


def register(kind: SourceKind) -> SourceKind:
    """Add a kind, asked before the fallback (the video file); a name taken is refused."""
    if any(k.name == kind.name for k in _KINDS):
        raise ValueError(f"a source kind named {kind.name!r} is registered already")
    at = next((i for i, k in enumerate(_KINDS) if k.fallback), len(_KINDS))
    _KINDS.insert(at, kind)
    return kind


for _kind in (TiffFolder(), FrameFolder(), TiffStack(), VideoFile()):
    register(_kind)


def kinds() -> list[SourceKind]:
    return list(_KINDS)


def kind_of(path: Path) -> SourceKind:
    """The kind that reads `path` (the video file where nothing else claims it)."""
    path = resolved(Path(path))
    return next(k for k in _KINDS if k.claims(path))


def named(name: str | None) -> SourceKind:
    """The kind a store recorded (a store made before kinds were named: a video file)."""
    for k in _KINDS:
        if k.name == (name or "video"):
            return k
    raise BadInput(f"the store's source is a {name!r}, a kind this segpipe does not read")


def probe(path: Path, stream: int | None = None, fps: float | None = None) -> VideoInfo:
    """What the source at `path` holds; `--stream` and `--fps` refused where they mean
    nothing."""
    kind = kind_of(path)
    if not Path(path).exists():
        return kind.probe(Path(path), stream, fps)  # the kind's own message for what is not there
    if stream is not None and not kind.streams:
        raise BadInput(f"--stream is for video files; {kind.what} has one sequence")
    if fps is not None and kind.timed:
        raise BadInput(
            f"--fps is for frame folders and TIFF stacks; {kind.what} has its own timing"
        )
    return kind.probe(Path(path), stream, fps)


def iter_frames(
    path: Path, start: int = 0, video: dict | None = None, before_pts=None, is_before=None
):
    """(pts, seconds, picture) from frame `start` on, read as the kind `video` (a store's
    record, or a probe's `as_attrs()`) names, else as the path's kind."""
    kind = named(video.get("kind")) if video else kind_of(path)
    return kind.frames(Path(path), start, video, before_pts, is_before)


def sample(path: Path, info: VideoInfo, start: int, n: int) -> list:
    return named(info.kind).sample(Path(path), info, start, n)


def identity(path: Path) -> dict:
    """How a store recognises the source at `path`."""
    return kind_of(path).identity(Path(path))


def same_source(recorded: dict, path: Path) -> bool:
    """Whether `path` is still the source `recorded` describes."""
    return kind_of(path).same(recorded, Path(path))
