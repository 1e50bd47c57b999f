"""The stored image features: the three levels' arrays, their stored dtypes and memory
layouts, and the exact conversions between SAM 2's tensors and the stored arrays."""

from __future__ import annotations

import numpy as np
import torch
import zarr
from zarr.errors import ContainsArrayError, ContainsGroupError

from segpipe.errors import StoreMismatch
from segpipe.store.runstore import RunStore


def level_kind(store: RunStore, name: str) -> tuple[str, torch.dtype, str]:
    """(stored dtype, dtype SAM 2 computed the level in, memory layout) of a feature level."""
    attrs = store.array(name).attrs
    return (
        attrs["embedding_dtype"],
        getattr(torch, attrs["torch_dtype"]),
        attrs["memory_format"],
    )


LEVELS = ("features/level0", "features/level1", "features/level2")


def stored_levels(store: RunStore) -> list[str]:
    """The level arrays the store holds: SAM 2's three, or one (SAM 3's concept model stores
    its backbone's output, from which both its necks compute)."""
    return [n for n in LEVELS if store.array(n) is not None]


def level_array(
    store: RunStore, name: str, frame_shape: tuple, dtype, kind: tuple[str, str, str]
) -> zarr.Array:
    """The array of level `name` (a frame's `frame_shape`, `dtype`; `kind`: its layout, the
    dtype SAM 2 computed it in and its stored dtype), made where it is missing. Made the same
    way whoever makes it, so any order of encode tasks (Dask workers side by side, a rerun
    after a kill between the levels) ends in the same array: one that exists as this encode
    would make it is used as it is, and a task that loses a race to make it (zarr's
    `ContainsArrayError`: made between this look and the create) uses the winner's. One that
    exists otherwise is refused in one line."""
    plan = store.plan
    shape = (plan.num_frames, *frame_shape)
    chunks = (plan.chunk_size, *frame_shape)
    layout, computed, stored = kind
    attributes = {"embedding_dtype": stored, "torch_dtype": computed, "memory_format": layout}
    arr = store.array(name)
    if arr is None:
        try:
            return store.create_array(
                name, shape, chunks, dtype, compress=False, attributes=attributes
            )
        except ContainsArrayError:  # another task made it meanwhile: the same array
            arr = store.array(name)
        except ContainsGroupError:
            raise StoreMismatch(
                f"store {store.path}: {name} is a group, not the array encode writes; use a "
                f"new --store"
            ) from None
    want = _described(shape, chunks, np.dtype(dtype), attributes)
    have = _described(arr.shape, arr.chunks, arr.dtype, {k: arr.attrs.get(k) for k in attributes})
    if have != want:
        raise StoreMismatch(
            f"store {store.path}: {name} is {have}, not {want} as this encode writes it; "
            f"use a new --store"
        )
    return arr


def _described(shape, chunks, dtype, attributes: dict) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in attributes.items())
    return f"{dtype} {tuple(shape)} in chunks {tuple(chunks)} ({kinds})"


def storage_dtype(computed: torch.dtype, embedding_dtype: str, precision: str) -> str:
    """How a level is stored. Under bfloat16 precision SAM 2 keeps one level (the vision
    features, after the FPN's float32 top-down sum) in float32: `--embedding-dtype bfloat16`
    keeps that level in float32, so the stored embeddings stay exactly what SAM 2 computed
    (the bfloat16 levels lose nothing). Under float32 precision it rounds every level."""
    if embedding_dtype == "bfloat16" and precision == "bfloat16" and computed == torch.float32:
        return "float32"
    return embedding_dtype


def to_storage(x: torch.Tensor, dtype: str) -> np.ndarray:
    """Features as stored: bfloat16 as its raw bit pattern in uint16 (zarr has no bfloat16)."""
    if dtype == "bfloat16":
        return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return x.to(getattr(torch, dtype)).numpy()


def stored_numpy_dtype(dtype: str) -> np.dtype:
    """The array dtype a level stored as `dtype` has (bfloat16: its bits in uint16)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def as_read_back(x: torch.Tensor, dtype: str, computed: torch.dtype) -> torch.Tensor:
    """`x` (a level as held: SAM 2's own where `dtype` is float32, else already cast to
    `dtype`) as storing it as `dtype` and reading it back gives it (`from_storage`, then
    SAM 2's dtype `computed`), on its own device: the same casts in the same order. Float32
    holds every computed dtype exactly: `x` itself then."""
    if dtype == "float32":
        return x
    return x.to(torch.float32).to(computed)


class Batches:
    """A level's frames held as the batches the image encoder gave them, not concatenated
    into one chunk tensor (a copy of the chunk saved): `len()` counts the frames, and
    `[i : i + 1]` (the one slice the trackers take) is frame i, a view into its batch, with
    the batch's strides: the same values and layout as a slice of the concatenated chunk."""

    def __init__(self, parts: list[torch.Tensor]):
        self.parts = parts
        self.ends = np.cumsum([len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.parts else 0

    def __getitem__(self, frames: slice) -> torch.Tensor:
        a, b = frames.start, frames.stop
        j = int(np.searchsorted(self.ends, a, side="right"))  # the batch frame a is in
        if j == len(self.parts) or frames.step not in (None, 1) or not 0 <= a < b <= self.ends[j]:
            raise IndexError(f"frames {a}..{b} are not within one batch")
        start = int(self.ends[j]) - len(self.parts[j])
        return self.parts[j][a - start : b - start]


def from_storage(a: np.ndarray, dtype: str) -> torch.Tensor:
    """Stored features back to a float32 tensor (exact for every stored dtype)."""
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(torch.float32)
    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)


def memory_format(x: torch.Tensor) -> str:
    """The layout `forward_image` gives a level; the tracker restores it, since kernels (and
    so the last bits of the masks) depend on it."""
    return (
        "channels_last"
        if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        else "contiguous"
    )


def restore_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    return x.contiguous(memory_format=fmt)
