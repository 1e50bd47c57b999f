"""Reading source videos with PyAV: probing, and streaming frames from a given point."""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import av

from .errors import UserError


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
        raise UserError(f"video not found: {path}")
    if path.is_dir():
        raise UserError(f"video path is a directory, not a video file: {path}")
    try:
        container = av.open(str(path))
    except Exception as e:  # noqa: BLE001 - FFmpeg errors, and PyAV's own on damaged metadata
        raise UserError(f"not a readable video: {path} ({_reason(e)})") from None
    if not container.streams.video:
        container.close()
        raise UserError(f"no video stream in {path}")
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
            raise UserError(f"not a readable video: {path} (no frame decodes: {e})") from None
        if first is None:
            raise UserError(f"video has no decodable frames: {path}")
        rate = stream.average_rate or stream.guessed_rate or Fraction(0)
        claimed = stream.frames or (
            int(round(float(stream.duration * stream.time_base) * float(rate)))
            if stream.duration and rate else 0
        )
        return VideoInfo(first.width, first.height, float(rate), str(rate), str(stream.time_base),
                         claimed)
    finally:
        container.close()


def iter_frames(path: Path, after_pts: int | None = None, skip: int = 0
                ) -> Iterator[tuple[int | None, float, "av.VideoFrame"]]:
    """Yield (pts, seconds, frame). Resume either after a known pts (seek, frame-exact) or by
    skipping `skip` frames from the start when the container has no usable pts."""
    container, stream = open_video(path)
    try:
        if after_pts is not None:
            container.seek(after_pts, stream=stream, backward=True, any_frame=False)
        for frame in _decode(container, stream):
            if after_pts is not None and frame.pts is not None and frame.pts <= after_pts:
                continue
            if skip:
                skip -= 1
                continue
            seconds = float(frame.pts * stream.time_base) if frame.pts is not None else float("nan")
            yield frame.pts, seconds, frame
    finally:
        container.close()


class DecodeError(Exception):
    """The stream broke off mid-way: the frames before it are good."""


def _decode(container, stream):
    """Decoded frames; a damaged stream ends in `DecodeError`."""
    try:
        for frame in container.decode(stream):
            yield frame
    except av.EOFError:
        return
    except Exception as e:  # noqa: BLE001 - FFmpeg errors, and PyAV's own on damaged data
        raise DecodeError(_reason(e)) from None


def _reason(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e)
    return text.splitlines()[0] if text.strip() else type(e).__name__
