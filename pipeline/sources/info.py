"""What a source holds: `VideoInfo` (size, rate, frame count, rotation, kind), as
a source kind's `probe` reads it and as the store records it."""

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
    kind: str = "video"  # the source kind's name: "video", "frames" (a folder), "tiff"...
    coded_size: tuple[int, int] | None = None  # (width, height) before the rotation
    start_time: float = 0.0  # seconds: the stream's first time
    duration: float | None = None  # seconds the container records for the video stream
    container_frames: int | None = None  # the frame count the container records, if any
    intensity: tuple[int, int] | None = None  # 16-bit sources: the window mapped to 0..255
    bits: int = 8  # bits a sample (16: a TIFF's; what the store records is `intensity`)

    def as_attrs(self) -> dict:
        more = {"intensity": list(self.intensity)} if self.intensity else {}
        return more | {
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
