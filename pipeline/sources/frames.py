"""A decoded picture as SAM 2's model input, and the digest a store keeps of each."""

from __future__ import annotations

import hashlib

import numpy as np


def model_input(picture, size: int) -> np.ndarray:
    """RGB, upright, resized to the model's square input with PIL's default filter, as SAM
    2's frame loader does."""
    return np.asarray(picture().resize((size, size)))


DIGEST = 16  # bytes of a frame's digest


def resize_workers() -> int:
    """Threads that resize frames side by side (PIL releases the GIL): two, and up to half
    the cores where there are more (a GPU machine's CPU keeps up with its encoder then)."""
    import os

    return min(8, max(2, (os.cpu_count() or 2) // 2))


def digested_input(picture, S: int) -> tuple[np.ndarray, np.ndarray]:
    """(`model_input`, its digest as `frame_digests` gives it): one frame's work, for a pool
    of threads (PIL's resize and BLAKE2b both release the GIL)."""
    frame = model_input(picture, S)
    return frame, frame_digests(frame[None])[0]


def frame_digests(frames: np.ndarray) -> np.ndarray:
    """(N, DIGEST) uint8: each model input's BLAKE2b digest. A chunk whose frames were
    dropped (see `segpipe.store.retention`) is found again in the source by its pts and these."""
    return np.stack(
        [
            np.frombuffer(hashlib.blake2b(f.tobytes(), digest_size=DIGEST).digest(), np.uint8)
            for f in frames
        ]
    )
