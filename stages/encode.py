"""Encode stage: SAM 2 image embeddings for every frame, chunk by chunk.

Stored per frame: the three backbone levels SAM 2 tracking consumes, as `forward_image`
returns them (levels 0 and 1 already through the mask decoder's conv_s0 / conv_s1):
`features/level0` (T, 32, S/4, S/4), `features/level1` (T, 64, S/8, S/8) and
`features/level2` (T, 256, S/16, S/16), the vision features. Positional encodings depend only
on the shape and are recomputed by the tracker.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from segpipe import log
from segpipe.chunks import ChunkPlan
from segpipe.errors import BadInput, StoreNotReady, StoreMismatch
from segpipe.model import (DEFAULT_MODEL, autocast, build_model, for_workers, pick_device,
                           pick_precision, resolve_weights, trained_size)
from segpipe.lock import holds_store_lock
from segpipe.retention import drop, has, keep_setting, restored
from segpipe.store import RunStore, reset_from

STAGE = "encode"
LEVELS = ("features/level0", "features/level1", "features/level2")
DTYPES = ("float32", "float16", "bfloat16")
# SAM 2's frame loader normalisation (sam2.utils.misc.load_video_frames)
IMG_MEAN = torch.tensor((0.485, 0.456, 0.406), dtype=torch.float32)[:, None, None]
IMG_STD = torch.tensor((0.229, 0.224, 0.225), dtype=torch.float32)[:, None, None]


def preprocess(frames: np.ndarray) -> torch.Tensor:
    """uint8 (N, S, S, 3) -> normalised float32 (N, 3, S, S), in SAM 2's arithmetic order:
    /255 in float64 (numpy), cast to float32, subtract the mean, divide by the std.
    The result is contiguous NCHW like SAM 2's frame tensor: with a channels-last layout the
    convolutions take another kernel and the features change in the last bits."""
    images = torch.from_numpy(frames / 255.0).permute(0, 3, 1, 2).to(torch.float32,
                                                                   memory_format=torch.contiguous_format)
    images -= IMG_MEAN
    images /= IMG_STD
    return images


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


def from_storage(a: np.ndarray, dtype: str) -> torch.Tensor:
    """Stored features back to a float32 tensor (exact for every stored dtype)."""
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(torch.float32)
    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)


def model_spec(store: RunStore, model: str, weights, embedding_dtype: str,
               precision: str = "float32") -> dict:
    return {"name": model, "image_size": store.attrs["image_size"],
            "weights": weights.describe(), "embedding_dtype": embedding_dtype,
            "precision": precision}


def check_model(store: RunStore, spec: dict) -> None:
    """Encode and track refuse to mix embeddings of different models in one store."""
    existing = store.attrs.get("model")
    if existing is None:
        return
    for key in ("name", "image_size", "weights", "embedding_dtype", "precision"):
        store.require(f"model {key}", existing.get(key, "float32"), spec[key])


def require_decoded(store: RunStore) -> int:
    if "frame_count" not in store.attrs:
        raise StoreNotReady(f"store {store.path} is not fully decoded yet (run `segpipe decode`)")
    return store.attrs["frame_count"]


@holds_store_lock
def encode(store_path, model: str = DEFAULT_MODEL, checkpoint: str | None = None,
           random_seed: int | None = None, device: str = "auto", batch_size: int = 1,
           embedding_dtype: str = "float32", quiet: bool = False, predictor=None,
           force: bool = False, precision: str | None = None,
           chunks: list[int] | None = None, space=None, cluster=None) -> RunStore:
    """Encode every decoded chunk not yet encoded (or only `chunks`). Under `--keep masks` a
    chunk's frames are dropped once it is encoded (`write_features`). `space` (an
    `estimate.SpaceGuard`) is asked before the first write, when there is work to do. With
    `cluster` (`segpipe.cluster`), the chunks are encoded on Dask workers (`segpipe.units`)."""
    store = RunStore.open(store_path)
    T = require_decoded(store)
    if batch_size < 1:
        raise BadInput(f"--batch-size must be a positive integer, got {batch_size}")
    if embedding_dtype not in DTYPES:
        raise BadInput(f"--embedding-dtype must be one of {', '.join(DTYPES)}")
    weights = resolve_weights(model, checkpoint, random_seed)
    if precision is None:  # the store's, else the default of the device the model runs on
        stored = (store.attrs.get("model") or {}).get("precision")
        precision = stored or pick_precision(
            None, cluster.device if cluster is not None
            else predictor.device.type if predictor is not None else pick_device(device))
    precision = pick_precision(precision, "cpu")  # validated
    spec = model_spec(store, model, weights, embedding_dtype, precision)
    restart = None
    try:
        check_model(store, spec)
    except StoreMismatch as mismatch:
        if not force:
            raise
        restart = mismatch
    plan = ChunkPlan(T, store.attrs["chunk_size"])
    if space is not None and (restart or store.ledger(STAGE).todo(plan)):
        space.before_encode(store, embedding_dtype, precision)
    if restart is not None:
        log.info(f"encode: starting over ({restart.message})", quiet)
        reset_from(store, "encode")
    todo = store.ledger(STAGE).todo(plan if chunks is None else chunks)
    if "model" not in store.attrs:
        store.set_attrs(model=spec)
    if weights.random_seed is not None:
        log.warn("random weights: embeddings and masks from them mean nothing")
    trained = trained_size(weights)
    if trained and spec["image_size"] != trained:
        log.warn(f"these weights were trained at image size {trained} and this store is at "
                 f"{spec['image_size']}: decode with --image-size {trained} for their masks")
    if not todo:
        if chunks is None:
            log.info("encode: already complete", quiet)
        return store
    if cluster is not None:
        from segpipe.units import encode as encode_on
        encode_on(cluster, store, todo,
                  cluster.work(store_path, for_workers(checkpoint, weights), device, batch_size),
                  quiet)
        log.info(f"encode: {T} frames embedded in {store.path}", quiet)
        return store
    if predictor is None:
        predictor = build_model(model, store.attrs["image_size"], weights, pick_device(device))
    frames_of = FramesOnDisk(store)

    def read(k):
        return k, frames_of(k)

    def write(k, levels, kinds):
        write_features(store, k, levels, kinds)

    todo_frames = sum(hi - lo for lo, hi in map(plan.bounds, todo))
    # One chunk read ahead and one written behind while the current one is encoded.
    with log.progress("encode", T, quiet, initial=T - todo_frames) as bar, \
            ThreadPoolExecutor(1) as reader, ThreadPoolExecutor(1) as writer:
        next_read = reader.submit(read, todo[0])
        pending_write = None
        for i in range(len(todo)):
            k, chunk_frames = next_read.result()
            if i + 1 < len(todo):
                next_read = reader.submit(read, todo[i + 1])
            levels, kinds = encode_frames(predictor, chunk_frames, batch_size, embedding_dtype,
                                          precision)
            if pending_write is not None:
                pending_write.result()
            pending_write = writer.submit(write, k, levels, kinds)
            bar.update(len(chunk_frames))
        pending_write.result()
    log.info(f"encode: {T} frames embedded in {store.path}", quiet)
    return store


class FramesOnDisk:
    """Chunk k's model-input frames, decoded again from the source first where they were
    dropped (`retention`)."""

    def __init__(self, store: RunStore):
        self.store, self.redecoder = store, None
        self.plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])

    def __call__(self, k: int) -> np.ndarray:
        if not has(self.store, "frames", k):
            if self.redecoder is None:
                from segpipe.stages.decode import Redecoder, stored_source
                self.redecoder = Redecoder(self.store, stored_source(self.store))
            self.redecoder.chunk(k)
        return self.store.read("frames", *self.plan.bounds(k))


def write_features(store: RunStore, k: int, levels, kinds) -> None:
    """Write chunk k's levels and commit it (the arrays are made with the first chunk:
    shapes are known once the model has produced them)."""
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    lo, hi = plan.bounds(k)
    store.check_lease()  # a Dask task of a run taken over writes nothing
    for name, feats, (layout, computed, stored) in zip(LEVELS, levels, kinds):
        arr = store.array(name)
        if arr is None:
            arr = store.create_array(name, (plan.num_frames, *feats.shape[1:]),
                                     (plan.chunk_size, *feats.shape[1:]), feats.dtype,
                                     compress=False,
                                     attributes={"embedding_dtype": stored,
                                                 "torch_dtype": computed,
                                                 "memory_format": layout})
        arr[lo:hi] = feats
    store.commit(STAGE, k, list(LEVELS))
    restored(store, "features", k)
    if keep_setting(store) == "masks":
        drop(store, "frames", k)  # encoded: nothing reads them again


def encode_chunk(store: RunStore, predictor, k: int, frames_of: FramesOnDisk,
                 batch_size: int = 1) -> None:
    """Encode chunk k (again, where its features were dropped) as the stage encodes it: the
    store's embedding dtype and precision."""
    spec = store.attrs["model"]
    frames = frames_of(k)
    levels, kinds = encode_frames(predictor, frames, batch_size, spec["embedding_dtype"],
                                  spec.get("precision", "float32"))
    write_features(store, k, levels, kinds)


def memory_format(x: torch.Tensor) -> str:
    """The layout `forward_image` gives a level; the tracker restores it, since kernels (and
    so the last bits of the masks) depend on it."""
    return "channels_last" if not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last) else "contiguous"


def restore_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    return x.contiguous(memory_format=fmt)


@torch.inference_mode()
def encode_frames(predictor, frames: np.ndarray, batch_size: int, dtype: str,
                  precision: str = "float32") -> tuple[list[np.ndarray], list[tuple[str, str, str]]]:
    """Backbone levels of `frames` as stored arrays, batch by batch, and per level its
    (layout, dtype SAM 2 computed it in, stored dtype)."""
    device = predictor.device
    outs: list[list[np.ndarray]] = [[], [], []]
    kinds: list[tuple[str, str, str]] = []
    for lo in range(0, len(frames), batch_size):
        images = preprocess(frames[lo:lo + batch_size])
        if device.type == "cuda":
            images = images.pin_memory().to(device, non_blocking=True)
        with autocast(device.type, precision):
            backbone = predictor.forward_image(images.to(device))
        kinds = []
        for level, feats in enumerate(backbone["backbone_fpn"]):
            stored = storage_dtype(feats.dtype, dtype, precision)
            kinds.append((memory_format(feats), str(feats.dtype).removeprefix("torch."), stored))
            outs[level].append(to_storage(feats.cpu(), stored))
    return [np.concatenate(level) for level in outs], kinds
