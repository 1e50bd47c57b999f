"""A video file as a source, read with PyAV: probed, and streamed from a given frame (by a
proven seek, else by counting) as upright RGB pictures.

A picture is a zero-argument callable giving the frame as an upright RGB `PIL.Image`: the
conversion (and the rotation a phone's display matrix asks for) runs wherever the caller
calls it, in decode's resize pool for instance.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator

import av
from PIL import Image

from segpipe.errors import BadInput
from segpipe.fsutil import regular_file
from segpipe.sources.base import Loaded, SourceKind
from segpipe.sources.info import VideoInfo

# PIL transposes that show a frame upright, by the display matrix's counter-clockwise
# rotation (PyAV's `VideoFrame.rotation`), as players and the ffmpeg CLI show it.
UPRIGHT = {
    90: Image.Transpose.ROTATE_90,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_270,
}


def open_video(path: Path, stream_index: int | None = None):
    """The container and its video stream: `stream_index` (the container's stream number),
    or the one FFmpeg ranks best (the default stream)."""
    path = Path(path)
    # a FIFO or a device would be read for ever: refused before it is opened
    regular_file(path, "video", "a video file or a folder of numbered frames")
    try:
        container = av.open(str(path))
    except Exception as e:  # noqa: BLE001 - FFmpeg errors, and PyAV's own on damaged metadata
        raise BadInput(f"not a readable video: {path} ({_reason(e)})") from None
    videos = list(container.streams.video)
    if not videos:
        container.close()
        raise BadInput(f"no video stream in {path}")
    if stream_index is None:
        stream = container.streams.best("video") or videos[0]
    else:
        stream = next((s for s in videos if s.index == stream_index), None)
        if stream is None:
            have = ", ".join(str(s.index) for s in videos)  # (before the close: PyAV 18.1.1
            container.close()  # refuses a closed container's streams)
            raise BadInput(f"--stream {stream_index}: {path} has video streams {have}")
    stream.thread_type = "AUTO"
    return container, stream


def video_streams(path: Path) -> list[str]:
    """One line per video stream of the file, as the user chooses among them."""
    container, _ = open_video(path)
    try:
        return [
            f"#{s.index} {s.codec_context.name} {s.width}x{s.height}"
            for s in container.streams.video
        ]
    finally:
        container.close()


def probe(path: Path, stream_index: int | None = None, fps: float | None = None) -> VideoInfo:
    """Open the video and decode its first frame: a video that cannot give one is refused."""
    path = Path(path)
    container, stream = open_video(path, stream_index)
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
        rotation = first.rotation % 360 if first.rotation % 90 == 0 else 0
        width, height = (
            (first.height, first.width) if rotation in (90, 270) else (first.width, first.height)
        )
        start = (
            float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        )
        duration = stream_duration(container, stream)
        claimed = int(round(duration * float(rate))) if duration and rate else stream.frames or 0
        return VideoInfo(
            width,
            height,
            float(rate),
            str(rate),
            str(stream.time_base),
            claimed,
            rotation,
            stream.index,
            coded_size=(first.width, first.height),
            start_time=start,
            duration=duration,
            container_frames=stream.frames or None,
        )
    finally:
        container.close()


def stream_duration(container, stream) -> float | None:
    """Seconds the container records for the video stream itself: its duration (an MP4 edit
    list trims it; a stream-copy cut keeps the cut frames' packets, so the packet count
    overstates the video), or an MKV / WebM track's DURATION tag (written at the file's
    end), or the container's duration when the video is its only stream (an audio track
    may run longer)."""
    if stream.duration:
        return float(stream.duration * stream.time_base)
    tag = stream.metadata.get("DURATION")
    try:
        h, m, sec = tag.split(":")
        return int(h) * 3600 + int(m) * 60 + float(sec)
    except (AttributeError, ValueError):
        pass
    if container.duration and len(container.streams) == 1:
        return container.duration / av.time_base
    return None


# How far before the resume point a seek is retried when it lands late (MPEG-TS lands a
# GOP late, AVI with B-frames a few frames late), in seconds; then decoding starts over.
SEEK_BACKOFF_S = (0.0, 2.0, 10.0, 60.0)


def iter_frames(
    path: Path,
    start: int = 0,
    before_pts: int | None = None,
    stream_index: int | None = None,
    rotation: int | None = None,
    is_before: Callable[["Picture"], bool] | None = None,
) -> Iterator[tuple[int | None, float, "Picture"]]:
    """Yield (pts, seconds, picture) from frame index `start` on: the one way segpipe picks a
    source up again (resumed decode, repair, overlay export).

    `before_pts` is the stored pts of frame start-1 and `is_before` tells whether a decoded
    picture is that stored frame. A seek is used only when it is proven to have landed on a
    keyframe at or before that frame: the decoder's first frame must be a keyframe (what
    follows it then decodes as in a straight decode), and it must output a frame with
    exactly that pts which `is_before` recognises (pts can repeat: MPEG-TS pieces joined
    together) before anything is yielded. Seeks that land late (MPEG-TS, AVI with B-frames,
    open GOPs) are retried further back, and as a last resort (or without pts) the stream is
    decoded from the start, skipping `start` frames by count and checking frame start-1's
    pts. Frames already stored are never shifted.

    `rotation` is the rotation recorded for the source: a frame that reports another one
    is refused rather than stored sideways."""
    if start > 0 and before_pts is not None and before_pts >= 0:
        for back in SEEK_BACKOFF_S:
            frames = _seek_frames(path, before_pts, back, stream_index, rotation, is_before)
            if frames is not None:
                yield from frames
                return
    yield from _counted_frames(path, start, before_pts, stream_index, rotation)


def sample(path: Path, info: VideoInfo, start: int, n: int) -> list:
    """`n` pictures from about frame `start`, loaded (a hint for estimates: a video file is
    sought to that frame's time, so the position need not be exact)."""
    container, stream = open_video(path, info.stream)
    try:
        if start and info.fps:
            target = (info.start_time + start / info.fps) / stream.time_base
            container.seek(int(target), stream=stream, backward=True, any_frame=False)
        frames = list(itertools.islice(_decode(container, stream), n))
        return [Loaded(Picture(f)()) for f in frames]  # converted while the container is open
    finally:
        container.close()


class Picture:
    """A decoded frame, made an upright RGB image on demand."""

    def __init__(self, frame: "av.VideoFrame", rotation: int | None = None):
        self.frame = frame
        self.rotation = frame.rotation % 360
        if rotation is not None and self.rotation != rotation:
            raise BadInput(
                f"a frame of the source reports a rotation of {self.rotation} degrees, "
                f"the store recorded {rotation}"
            )

    def __call__(self) -> Image.Image:
        image = self.frame.to_image()
        return image.transpose(UPRIGHT[self.rotation]) if self.rotation in UPRIGHT else image


def _seek_frames(
    path: Path,
    before_pts: int,
    back_s: float,
    stream_index: int | None,
    rotation: int | None,
    is_before,
):
    """A generator positioned just after the frame with pts `before_pts`, or None when a
    seek `back_s` seconds before it does not provably land on a keyframe at or before that
    frame."""
    container, stream = open_video(path, stream_index)
    found = False
    try:
        try:
            target = max(0, before_pts - int(back_s / stream.time_base))
            container.seek(target, stream=stream, backward=True, any_frame=False)
        except av.FFmpegError:
            return None  # not seekable: decode from the start
        frames = _decode(container, stream)
        for n, frame in enumerate(frames):
            if n == 0 and not frame.key_frame:
                return None  # not on a keyframe: the frames after may lack their references
            if frame.pts is None or frame.pts > before_pts:
                return None  # landed late, or no pts to prove the position with
            if frame.pts == before_pts:
                if is_before is not None and not is_before(Picture(frame, rotation)):
                    return None  # the same pts on another frame: count instead
                found = True
                return _rest(container, stream, frames, rotation)
        return None
    except DecodeError:
        return None  # damage near the seek point: decode from the start instead
    finally:
        if not found:
            container.close()


def _rest(container, stream, frames, rotation):
    try:
        for frame in frames:
            yield frame.pts, _seconds(frame, stream), Picture(frame, rotation)
    finally:
        container.close()


def _counted_frames(
    path: Path, start: int, before_pts: int | None, stream_index: int | None, rotation: int | None
):
    container, stream = open_video(path, stream_index)
    try:
        for i, frame in enumerate(_decode(container, stream)):
            if (
                i == start - 1
                and before_pts is not None
                and before_pts >= 0
                and frame.pts != before_pts
            ):
                raise BadInput(
                    f"frame {i} of {path} no longer has the timestamp it was stored "
                    f"with ({frame.pts}, not {before_pts}): the file changed"
                )
            if i >= start:
                yield frame.pts, _seconds(frame, stream), Picture(frame, rotation)
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


class VideoFile(SourceKind):
    """A video file, as FFmpeg reads it: what no other kind claims."""

    name, what = "video", "a video file"
    timed = streams = fallback = True
    counted = False  # the container's count is a claim: the truth is what decodes

    def claims(self, path: Path) -> bool:
        return True

    def probe(self, path, stream, fps):
        return probe(path, stream)

    def frames(self, path, start, video=None, before_pts=None, is_before=None):
        video = video or {}
        return iter_frames(
            path, start, before_pts, video.get("stream"), video.get("rotation"), is_before
        )

    def sample(self, path, info, start, n):
        return sample(path, info, start, n)
