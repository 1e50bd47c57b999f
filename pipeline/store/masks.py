"""Masks in and out of the store without holding a whole (C, O, H, W) chunk in RAM.

A store chunks `masks` (T, O, H, W) as (C, 1, R, W): per pipeline chunk one zarr chunk per
object and band of R rows, R the most rows that keep a zarr chunk within `MASK_CHUNK_BYTES`
(all H rows but for large frames: at 3840x2160 and C = 32, 136 rows). Between the tracker
and the store a chunk's masks travel packed to bits, (frames, objects, ceil(H*W/8)) uint8
(`numpy.packbits` order, the flattened frame padded with zeros), an eighth of their bool
size; they are unpacked one zarr chunk (writing) or one bounded batch of frames (reading,
`mask_batches`) at a time.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from segpipe.errors import DamagedStore
from segpipe.store.runstore import RunStore

# Masks an export holds at once, in bytes: at most this much packed (a segment of frames)
# and this much unpacked (a batch of frames, what the writers get).
BATCH_BYTES = 64 << 20


# The most bytes of one zarr chunk of masks: unpacking or decompressing one never holds more.
MASK_CHUNK_BYTES = 16 << 20


def mask_chunks(C: int, height: int, width: int) -> tuple[int, int, int, int]:
    """The zarr chunk shape of a store's masks: (C, 1, R, W)."""
    return C, 1, max(1, min(height, MASK_CHUNK_BYTES // (C * width))), width


def row_bands(store: RunStore) -> list[tuple[int, int]]:
    """[r0, r1) row ranges of the masks that one zarr chunk each holds."""
    arr = store.array("masks")
    H, step = arr.shape[2], arr.chunks[2]
    return [(r, min(r + step, H)) for r in range(0, H, step)]


def packed_size(height: int, width: int) -> int:
    """Bytes of one packed (H, W) mask."""
    return -(-height * width // 8)


def pack(masks: np.ndarray) -> np.ndarray:
    """(..., H, W) bool -> (..., ceil(H*W/8)) uint8."""
    flat = masks.reshape(*masks.shape[:-2], -1)
    return np.packbits(flat, axis=-1)


def unpack(packed: np.ndarray, height: int, width: int) -> np.ndarray:
    """(..., ceil(H*W/8)) uint8 -> (..., H, W) bool."""
    flat = np.unpackbits(packed, axis=-1, count=height * width)
    return flat.view(bool).reshape(*packed.shape[:-1], height, width)


def unpack_rows(packed: np.ndarray, width: int, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1-1 of packed masks: (..., ceil(H*W/8)) uint8 -> (..., r1 - r0, W) bool,
    unpacking only the bytes that hold them."""
    first, last = r0 * width, r1 * width  # the rows' bits in the flattened frame
    start, skip = divmod(first, 8)
    bits = np.unpackbits(packed[..., start : -(-last // 8)], axis=-1)[
        ..., skip : skip + last - first
    ]
    return bits.view(bool).reshape(*packed.shape[:-1], r1 - r0, width)


def write_packed(store: RunStore, a: int, b: int, packed: np.ndarray, first: int = 0) -> None:
    """masks[a:b, first:first + n] = unpack(packed) for packed (b - a, n, bytes), one zarr
    chunk (one object's band of rows) at a time."""
    arr = store.array("masks")
    W = arr.shape[3]
    for s in range(packed.shape[1]):
        for r0, r1 in row_bands(store):
            arr[a:b, first + s : first + s + 1, r0:r1] = unpack_rows(
                packed[:, s : s + 1], W, r0, r1
            )


def write_fill(store: RunStore, a: int, b: int) -> None:
    """masks[a:b] = False, one zarr chunk at a time (zarr would otherwise build every
    chunk's fill at once)."""
    arr = store.array("masks")
    for s0, s1 in store.col_groups("masks"):
        for r0, r1 in row_bands(store):
            arr[a:b, s0:s1, r0:r1] = False


CHANGING = (("changing", 0),)  # `chunk_files` of a chunk written or reset as it looked


def chunk_files(store: RunStore, k: int) -> tuple:
    """Chunk k's mask files with their modification times, sorted (() where none is
    written; `CHANGING` where it was written or reset while listed): what changes when a
    pass rewrites the chunk, for the readers that keep what they made of it."""
    files = []
    try:
        for root, _, names in os.walk(store.path / "masks" / "c" / str(k)):
            files += [(p, os.stat(p).st_mtime_ns) for p in (os.path.join(root, n) for n in names)]
    except FileNotFoundError:
        return CHANGING
    return tuple(sorted(files))


def read_masks(store: RunStore, a: int, b: int, slots: list[int], packed: bool) -> np.ndarray:
    """masks[a:b][:, slots] (packed or not), read (and verified) one zarr chunk at a time."""
    arr = store.array("masks")
    # (a reset under way, read from another thread or process, removes or remakes it)
    if arr is None or any(s >= arr.shape[1] for s in slots):
        raise DamagedStore(store.path, "masks", store.plan.chunk_of(a), "is missing")
    H, W = arr.shape[2:]
    shape = (b - a, len(slots), packed_size(H, W)) if packed else (b - a, len(slots), H, W)
    out = np.empty(shape, np.uint8 if packed else bool)
    for s0, s1 in store.col_groups("masks"):
        mine = [(j, s) for j, s in enumerate(slots) if s0 <= s < s1]
        if not mine:
            continue
        data = store.read("masks", a, b, cols=slice(s0, s1))
        if data.shape[1:] != (s1 - s0, H, W):  # remade since (other objects, other size)
            raise DamagedStore(store.path, "masks", store.plan.chunk_of(a), "changed while read")
        for j, s in mine:
            out[:, j] = pack(data[:, s - s0]) if packed else data[:, s - s0]
        del data
    return out


def mask_batches(
    store: RunStore, lo: int, hi: int, slots: list[int], budget: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(first frame, (n, len(slots), H, W) bool masks) for frames lo..hi-1 in order, in
    batches of at most `budget` bytes (at least one frame). Where the frames fit one batch
    they are read as they are: in one read when the zarr chunks holding them fit the budget
    too (small videos), else one zarr chunk (object) at a time. Otherwise they are read a
    segment at a time, packed, holding at most `budget` bytes packed too, one zarr chunk at a
    time; a segment reads each of its zarr chunks once (a chunk longer than a segment is read
    once per segment)."""
    budget = BATCH_BYTES if budget is None else budget
    arr = store.array("masks")
    H, W = arr.shape[2:]
    step = arr.chunks[0]

    def decoded(a, b, objects):  # bytes of the whole zarr chunks holding frames a..b-1
        return (-(-b // step) - a // step) * step * objects * H * W

    n = max(1, len(slots))
    batch = max(1, budget // (n * H * W))
    span = max(batch, budget // (n * packed_size(H, W)))
    for a in range(lo, hi, span):
        b = min(a + span, hi)
        if b - a <= batch:  # the segment fits one batch: no packing
            c0, c1 = min(slots), max(slots) + 1
            if decoded(a, b, c1 - c0) <= budget:  # one read: zarr decodes the chunks at once
                data = store.read("masks", a, b, cols=slice(c0, c1))
                yield a, data if slots == list(range(c0, c1)) else data[:, [s - c0 for s in slots]]
            else:
                yield a, read_masks(store, a, b, slots, packed=False)
            continue
        packed = read_masks(store, a, b, slots, packed=True)
        for c in range(a, b, batch):
            d = min(c + batch, b)
            yield c, unpack(packed[c - a : d - a], H, W)
        del packed  # before the next segment is read
