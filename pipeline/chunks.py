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
