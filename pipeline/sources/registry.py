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


def kind_of(path: Path, name: str | None = None) -> SourceKind:
    """The kind that reads `path` (the video file where nothing else claims it), or the kind
    `name`d (a store's record: its source is read back as the kind it was decoded as)."""
    if name is not None:
        return named(name)
    path = resolved(Path(path))
    for kind in _KINDS:
        try:
            if kind.claims(path):
                return kind
        except OSError:  # not readable here: the fallback's open says why, in one line
            continue
    return _KINDS[-1]


def named(name: str | None) -> SourceKind:
    """The kind a store recorded (a store made before kinds were named: a video file)."""
    for k in _KINDS:
        if k.name == (name or "video"):
            return k
    raise BadInput(f"the store's source is a {name!r}, a kind this segpipe does not read")


def probe(
    path: Path, stream: int | None = None, fps: float | None = None, kind: str | None = None
) -> VideoInfo:
    """What the source at `path` holds (read as the kind named `kind`, a store's, if
    given); `--stream` and `--fps` refused where they mean nothing."""
    reader = kind_of(path, kind)
    if Path(path).is_file() or Path(path).is_dir():  # else the kind's own message: not there
        if stream is not None and not reader.streams:
            raise BadInput(f"--stream is for video files; {reader.what} has one sequence")
        if fps is not None and reader.timed:
            raise BadInput(
                f"--fps is for frame folders and TIFF stacks; {reader.what} has its own timing"
            )
    return reader.probe(Path(path), stream, fps)


def for_store(path: Path, info: VideoInfo) -> VideoInfo:
    """The probe's `info` with what the store records beyond it (`SourceKind.for_store`)."""
    return named(info.kind).for_store(Path(path), info)


def iter_frames(
    path: Path, start: int = 0, video: dict | None = None, before_pts=None, is_before=None
):
    """(pts, seconds, picture) from frame `start` on, read as the kind `video` (a store's
    record, or a probe's `as_attrs()`) names, else as the path's kind."""
    kind = named(video.get("kind")) if video else kind_of(path)
    return kind.frames(Path(path), start, video, before_pts, is_before)


def sample(path: Path, info: VideoInfo, start: int, n: int) -> list:
    return named(info.kind).sample(Path(path), info, start, n)


def identity(path: Path, kind: str | None = None) -> dict:
    """How a store recognises the source at `path` (as the kind named `kind`, if given)."""
    return kind_of(path, kind).identity(Path(path))


def same_source(recorded: dict, path: Path, kind: str | None = None) -> bool:
    """Whether `path` is still the source `recorded` describes, read as the kind the store
    recorded (`kind`): a file added to a TIFF folder does not make it another kind."""
    return kind_of(path, kind).same(recorded, Path(path))
