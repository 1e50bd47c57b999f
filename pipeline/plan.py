"""The chunk plan: chunk k holds frames [k*C, min((k+1)*C, T))."""

from __future__ import annotations

from dataclasses import dataclass


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


def pass_frames(direction: str, start: int, num_frames: int) -> list[int]:
    """A tracking pass's frames in processing order, as SAM 2's `propagate_in_video` orders
    them from the earliest prompted frame `start`."""
    if direction == "reverse":  # SAM 2 skips reverse tracking when starting from frame 0
        return list(range(start, -1, -1)) if start > 0 else []
    return list(range(start, num_frames))


def pass_frames_in(direction: str, start: int, lo: int, hi: int) -> list[int]:
    """The frames of `pass_frames` inside [lo, hi), in the same order, without listing the
    whole pass (chunks are visited one by one on long videos)."""
    if direction == "reverse":
        return list(range(min(start, hi - 1), lo - 1, -1)) if start > 0 else []
    return list(range(max(start, lo), hi))


def passes(direction: str) -> list[str]:
    """The tracking passes a direction setting runs, in the order they run."""
    return ["forward", "reverse"] if direction == "both" else [direction]


def untracked_chunks(plan: ChunkPlan, direction: str, start: int) -> list[int]:
    """The chunks no pass of `direction` visits (before the start of a forward-only run,
    after it in a reverse-only one): their frames are untracked."""
    reached = {k for d in passes(direction) for k in pass_chunks(plan, d, start)}
    return [k for k in plan if k not in reached]


def pass_frame_count_in(direction: str, start: int, lo: int, hi: int) -> int:
    """len(pass_frames_in(direction, start, lo, hi)), without listing the frames."""
    if direction == "reverse":
        return max(0, min(start, hi - 1) - lo + 1) if start > 0 else 0
    return max(0, hi - max(start, lo))


def pass_chunks(plan: ChunkPlan, direction: str, start: int) -> list[int]:
    """The chunks a tracking pass visits, in its order: the chunks of `pass_frames`, computed
    from the chunk bounds (forward: the start's chunk to the last; reverse: the start's chunk
    down to 0, none from frame 0)."""
    if direction == "reverse":
        return list(range(plan.chunk_of(start), -1, -1)) if start > 0 else []
    if start >= plan.num_frames:
        return []
    return list(range(plan.chunk_of(start), plan.num_chunks))
