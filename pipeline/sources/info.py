"""What a source holds: `VideoInfo` (size, rate, frame count, rotation, kind), as
`probe` reads it from a video file or a frame folder and as the store records it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: float
    frame_rate: str  # exact, as a fraction ("30000/1001")
    time_base: str
    claimed_frames: int  # about what a player shows (for progress); the truth is what decodes
    rotation: int = 0  # degrees counter-clockwise applied to make frames upright
    stream: int | None = None  # the container's stream index (None: a frame folder)
    kind: str = "video"  # "video" or "frames" (a folder)
    coded_size: tuple[int, int] | None = None  # (width, height) before the rotation
    start_time: float = 0.0  # seconds: the stream's first time
    duration: float | None = None  # seconds the container records for the video stream
    container_frames: int | None = None  # the frame count the container records, if any

    def as_attrs(self) -> dict:
        return {
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "frame_rate": self.frame_rate,
            "time_base": self.time_base,
            "claimed_frames": self.claimed_frames,
            "rotation": self.rotation,
            "stream": self.stream,
            "kind": self.kind,
            "start_time": self.start_time,
            "duration": self.duration,
        }
