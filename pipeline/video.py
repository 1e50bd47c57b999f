"""Reading source videos with PyAV: probing, and streaming frames from a given point."""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import av

from .errors import BadInput


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: float
    frame_rate: str  # exact, as a fraction ("30000/1001")
    time_base: str
    claimed_frames: int  # what the container says; the truth is what decodes

    def as_attrs(self) -> dict:
        return {"width": self.width, "height": self.height, "fps": self.fps,
                "frame_rate": self.frame_rate, "time_base": self.time_base,
                "claimed_frames": self.claimed_frames}


def open_video(path: Path):
    path = Path(path)
    if not path.exists():
        raise BadInput(f"video not found: {path}")
    if path.is_dir():
        raise BadInput(f"video path is a directory, not a video file: {path}")
    try:
        container = av.open(str(path))
    except Exception as e:  # noqa: BLE001 - FFmpeg errors, and PyAV's own on damaged metadata
        raise BadInput(f"not a readable video: {path} ({_reason(e)})") from None
    if not container.streams.video:
        container.close()
        raise BadInput(f"no video stream in {path}")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def probe(path: Path) -> VideoInfo:
    """Open the video and decode its first frame: a file that cannot give one is refused."""
    container, stream = open_video(path)
    try:
        try:
            first = next(_decode(container, stream), None)
            if first is not None:
                first.to_image()  # a frame that cannot become RGB is damage too
        except (DecodeError, ValueError) as e:
            raise BadInput(f"not a readable video: {path} (no frame decodes: {e})") from None
        if first is None:
            raise BadInput(f"video has no decodable frames: {path}")
        rate = stream.average_rate or stream.guessed_rate or Fraction(0)
        claimed = stream.frames or (
            int(round(float(stream.duration * stream.time_base) * float(rate)))
            if stream.duration and rate else 0
        )
        return VideoInfo(first.width, first.height, float(rate), str(rate), str(stream.time_base),
                         claimed)
    finally:
        container.close()


# How far before the resume point a seek is retried when it lands late (MPEG-TS lands a
# GOP late, AVI with B-frames a few frames late), in seconds; then decoding starts over.
SEEK_BACKOFF_S = (0.0, 2.0, 10.0, 60.0)


def iter_frames(path: Path, start: int = 0, before_pts: int | None = None
                ) -> Iterator[tuple[int | None, float, "av.VideoFrame"]]:
    """Yield (pts, seconds, frame) from frame index `start` on: the one way segpipe picks a
    source up again (resumed decode, repair, overlay export).

    `before_pts` is the stored pts of frame start-1. A seek is used only when it is proven
    to have landed at or before that frame: the decoder must output the frame with exactly
    that pts before anything is yielded. Seeks that land late are retried further back, and
    as a last resort (or without pts) the stream is decoded from the start, skipping
    `start` frames by count and checking frame start-1's pts. Frames already stored are
    never shifted."""
    if start > 0 and before_pts is not None and before_pts >= 0:
        for back in SEEK_BACKOFF_S:
            frames = _seek_frames(path, before_pts, back)
            if frames is not None:
                yield from frames
                return
    yield from _counted_frames(path, start, before_pts)


def _seek_frames(path: Path, before_pts: int, back_s: float):
    """A generator positioned just after the frame with pts `before_pts`, or None when a
    seek `back_s` seconds before it does not provably land at or before that frame."""
    container, stream = open_video(path)
    found = False
    try:
        try:
            target = max(0, before_pts - int(back_s / stream.time_base))
            container.seek(target, stream=stream, backward=True, any_frame=False)
        except av.FFmpegError:
            return None  # not seekable: decode from the start
        frames = _decode(container, stream)
        for frame in frames:
            if frame.pts is None or frame.pts > before_pts:
                return None  # landed late, or no pts to prove the position with
            if frame.pts == before_pts:
                found = True
                return _rest(container, stream, frames)
        return None
    except DecodeError:
        return None  # damage near the seek point: decode from the start instead
    finally:
        if not found:
            container.close()


def _rest(container, stream, frames):
    try:
        for frame in frames:
            yield frame.pts, _seconds(frame, stream), frame
    finally:
        container.close()


def _counted_frames(path: Path, start: int, before_pts: int | None):
    container, stream = open_video(path)
    try:
        for i, frame in enumerate(_decode(container, stream)):
            if i == start - 1 and before_pts is not None and before_pts >= 0 \
                    and frame.pts != before_pts:
                raise BadInput(f"frame {i} of {path} no longer has the timestamp it was stored "
                                f"with ({frame.pts}, not {before_pts}): the file changed")
            if i >= start:
                yield frame.pts, _seconds(frame, stream), frame
    finally:
        container.close()


def _seconds(frame, stream) -> float:
    return float(frame.pts * stream.time_base) if frame.pts is not None else float("nan")


class DecodeError(Exception):
    """The stream broke off mid-way: the frames before it are good."""


def _decode(container, stream):
    """Decoded frames; a damaged stream ends in `DecodeError`. Anything that is not damage
    in the data (an I/O error, memory, a signal) propagates: it must never be mistaken for
    the end of the video."""
    try:
        for frame in container.decode(stream):
            yield frame
    except av.EOFError:
        return
    except av.FFmpegError as e:
        if is_damage(e):
            raise DecodeError(_reason(e)) from None
        raise


def is_damage(e: BaseException) -> bool:
    """An error that says the data is broken, as opposed to reading it failing."""
    return isinstance(e, (av.FFmpegError, ValueError)) and not isinstance(e, (OSError, MemoryError))


def _reason(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e)
    return text.splitlines()[0] if text.strip() else type(e).__name__
