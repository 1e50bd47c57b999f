"""The chunk plan: chunk k holds frames [k*C, min((k+1)*C, T))."""

from __future__ import annotations

from dataclasses import dataclass

from segpipe.errors import BadInput


@dataclass(frozen=True)
class ChunkPlan:
    num_frames: int
    chunk_size: int

    def __post_init__(self):
        if self.chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {self.chunk_size}")
        if self.num_frames < 0:
            raise ValueError(f"frame count must be >= 0, got {self.num_frames}")

    @property
    def num_chunks(self) -> int:
        return -(-self.num_frames // self.chunk_size)

    def bounds(self, k: int) -> tuple[int, int]:
        if not 0 <= k < self.num_chunks:
            raise IndexError(f"chunk {k} outside 0..{self.num_chunks - 1}")
        start = k * self.chunk_size
        return start, min(start + self.chunk_size, self.num_frames)

    def chunk_of(self, frame: int) -> int:
        if not 0 <= frame < self.num_frames:
            raise IndexError(f"frame {frame} outside 0..{self.num_frames - 1}")
        return frame // self.chunk_size

    def __iter__(self):
        return iter(range(self.num_chunks))


@dataclass(frozen=True)
class Span:
    """The frames a tracking's passes cover, in SAM 2's `propagate_in_video` order: from the
    earliest prompted frame `start`, inside the window [lo, hi) (`track --frames`; the whole
    video without one). Pass d is `propagate_in_video(start_frame_idx=first(d),
    max_frame_num_to_track=...)` with the arguments `sam2_arguments(d)` gives."""

    start: int
    lo: int
    hi: int

    @classmethod
    def whole(cls, start: int, num_frames: int) -> "Span":
        return cls(start, 0, num_frames)

    @classmethod
    def of(cls, settings: dict, num_frames: int) -> "Span":
        """The span of a stored tracking (its `track` attribute)."""
        lo, hi = settings.get("frames") or (0, num_frames)
        return cls(settings["start_frame"], lo, hi)

    def first(self, direction: str) -> int:
        """The frame pass `direction` starts on."""
        if direction == "reverse":
            return min(self.start, self.hi - 1)
        return max(self.start, self.lo)

    def sam2_arguments(self, direction: str) -> dict:
        """The keyword arguments of SAM 2's `propagate_in_video` for this pass."""
        first = self.first(direction)
        count = first - self.lo if direction == "reverse" else self.hi - 1 - first
        return {
            "start_frame_idx": first,
            "max_frame_num_to_track": count,
            "reverse": direction == "reverse",
        }

    def frames(self, direction: str) -> list[int]:
        """The pass's frames in processing order."""
        return self.frames_in(direction, self.lo, self.hi)

    def frames_in(self, direction: str, lo: int, hi: int) -> list[int]:
        """The pass's frames inside [lo, hi), in its order, without listing the whole pass
        (chunks are visited one by one on long videos)."""
        first = self.first(direction)
        if direction == "reverse":  # SAM 2 skips reverse tracking when starting from frame 0
            if first <= 0:
                return []
            return list(range(min(first, hi - 1), max(self.lo, lo) - 1, -1))
        return list(range(max(first, lo), min(self.hi, hi)))

    def count_in(self, direction: str, lo: int, hi: int) -> int:
        """len(frames_in(direction, lo, hi)), without listing the frames."""
        first = self.first(direction)
        if direction == "reverse":
            return max(0, min(first, hi - 1) - max(self.lo, lo) + 1) if first > 0 else 0
        return max(0, min(self.hi, hi) - max(first, lo))

    def chunks(self, plan: ChunkPlan, direction: str) -> list[int]:
        """The chunks the pass visits, in its order, computed from the chunk bounds."""
        first = self.first(direction)
        if direction == "reverse":
            if first <= 0 or first < self.lo:
                return []
            return list(range(plan.chunk_of(first), plan.chunk_of(self.lo) - 1, -1))
        if first >= min(self.hi, plan.num_frames):
            return []
        return list(range(plan.chunk_of(first), plan.chunk_of(self.hi - 1) + 1))


def passes(direction: str) -> list[str]:
    """The tracking passes a direction setting runs, in the order they run."""
    return ["forward", "reverse"] if direction == "both" else [direction]


def untracked_chunks(plan: ChunkPlan, direction: str, span: Span) -> list[int]:
    """The chunks no pass of `direction` visits (before the start of a forward-only run,
    after it in a reverse-only one, outside the window): their frames are untracked."""
    reached = {k for d in passes(direction) for k in span.chunks(plan, d)}
    return [k for k in plan if k not in reached]


def frame_window(spec, T: int) -> tuple[int, int]:
    """The frames [lo, hi) a `--frames` asks for, inside a video of T frames: "A:B" (frames
    A..B-1, as Python's range), "A:" (to the end), ":B", a slice, or (A, B) (B None: to the
    end). A window reaching outside the video's frames, or holding none, is refused: the
    one reading of a frame window (track, export, the API and the studio)."""
    if isinstance(spec, slice):
        if spec.step not in (None, 1):
            raise BadInput(f"a window of frames is frames A..B-1 in order, not {spec!r}")
        spec = (spec.start or 0, spec.stop)
    if isinstance(spec, str):
        a, sep, b = spec.partition(":")
        try:
            if not sep:
                raise ValueError
            spec = (int(a) if a.strip() else 0, int(b) if b.strip() else None)
        except ValueError:
            raise BadInput(
                f"--frames must be A:B, A: or :B (frame numbers), got {spec!r}"
            ) from None
    lo, hi = spec
    lo, hi = int(lo), T if hi is None else int(hi)
    if not 0 <= lo < T:
        raise BadInput(f"--frames starts at frame {lo}, outside the video's frames 0..{T - 1}")
    if hi <= lo:
        raise BadInput(f"--frames {lo}:{hi} holds no frame (B must be greater than A)")
    if hi > T:
        raise BadInput(
            f"--frames {lo}:{hi} ends past the video's frames 0..{T - 1} ({lo}: runs to the end)"
        )
    return lo, hi
