"""Encode stage: SAM 2 image embeddings for every frame, chunk by chunk.

Stored per frame: the three backbone levels SAM 2 tracking consumes, as `forward_image`
returns them (levels 0 and 1 already through the mask decoder's conv_s0 / conv_s1):
`features/level0` (T, 32, S/4, S/4), `features/level1` (T, 64, S/8, S/8) and
`features/level2` (T, 256, S/16, S/16), the vision features. Positional encodings depend only
on the shape and are recomputed by the tracker.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from segpipe import environment, log
from segpipe.behind import Behind
from segpipe.errors import BadInput, StoreMismatch
from segpipe.model import (
    autocast,
    check_model,
    family_of_predictor,
    for_workers,
    model_spec,
    pick_device,
    precision_of,
    predictor_for,
    resolve_weights,
    trained_size,
)
from segpipe.models.registry import family_of
from segpipe.plan import ChunkPlan
from segpipe.settings import Encoding, Execution
from segpipe.store.features import (
    LEVELS,
    Batches,
    as_read_back,
    level_array,
    memory_format,
    restore_layout,
    storage_dtype,
    stored_numpy_dtype,
    to_storage,
)
from segpipe.store.layout import require_decoded, reset_from
from segpipe.store.lock import holds_store_lock
from segpipe.store.retention import drop, has, keep_setting, restored
from segpipe.store.runstore import RunStore

if TYPE_CHECKING:
    from segpipe.stages.executor import Executor

STAGE = "encode"


@holds_store_lock
def encode(
    store_path,
    encoding: Encoding = Encoding(),
    execution: Execution = Execution(),
    *,
    predictor=None,
    chunks: list[int] | None = None,
    space=None,
    cluster: Executor | None = None,
) -> RunStore:
    """Encode every decoded chunk not yet encoded (or only `chunks`) with `encoding` (its
    model and dtype None: `DEFAULTS`; its precision None: the store's, else the device's),
    where `execution` says (its device, progress, `force`: start over a store encoded
    otherwise). Under `--keep masks` a chunk's frames are dropped once it is encoded
    (`write_features`). `space` (an `space.SpaceGuard`) is asked before the first write,
    when there is work to do. With `cluster` (`segpipe.dask.client`), the chunks are encoded
    on Dask workers (`segpipe.dask.tasks`). The store is computed in one environment
    (`segpipe.environment`; `execution.allow_env_change`: in another too)."""
    store = RunStore.open(store_path)
    T = require_decoded(store)
    e, device, quiet = encoding.check().filled(), execution.device, execution.quiet
    model, checkpoint, batch_size, embedding_dtype = (
        e.model,
        e.checkpoint,
        e.batch_size,
        e.embedding_dtype,
    )
    weights = _weights(store, model, checkpoint, e.random_weights)
    precision = precision_of(e.precision, store, _device_type(device, predictor, cluster), model)
    spec = model_spec(store, model, weights, embedding_dtype, precision)
    plan = ChunkPlan(T, store.chunk_size)
    work = environment.of_work(device, predictor, cluster)
    force = execution.force
    todo = _start(
        store, spec, plan, chunks, force, space, (embedding_dtype, precision), quiet, work
    )
    if todo:
        environment.check(store, work, execution.allow_env_change, quiet)
    _warn_about_weights(weights, spec)
    if not todo:
        if chunks is None:
            log.info("encode: already complete", quiet)
        return store
    if cluster is not None:
        cluster.encode(
            store,
            todo,
            cluster.work(store_path, for_workers(checkpoint, weights), device, batch_size),
            quiet,
        )
        log.result(f"encode: {T} frames embedded in {store.path}", quiet)
        return store
    if predictor is None:
        predictor = predictor_for({"name": model, "image_size": store.image_size}, weights, device)
    _encode_chunks(store, predictor, plan, todo, batch_size, embedding_dtype, precision, quiet)
    log.result(f"encode: {T} frames embedded in {store.path}", quiet)
    return store


def _weights(store: RunStore, model: str, checkpoint, random_weights):
    """`model`'s weights, its input size checked against the store's first (before any
    download or record), and a transformers checkpoint's own size after."""
    family = family_of(model)
    family.check_size(model, store.image_size)
    weights = resolve_weights(model, checkpoint, random_weights)
    made_at = trained_size(weights) if family.session_tracker else None
    if made_at not in (None, store.image_size):
        raise BadInput(
            f"{model}'s checkpoint is made for --image-size {made_at}, not the store's "
            f"{store.image_size}"
        )
    return weights


def _device_type(device: str, predictor, cluster) -> str:
    """The device type the model runs on: the cluster's workers', the predictor's, else the
    one `device` picks here."""
    if cluster is not None:
        return cluster.device
    return predictor.device.type if predictor is not None else pick_device(device)


def _start(
    store: RunStore,
    spec: dict,
    plan: ChunkPlan,
    chunks: list[int] | None,
    force: bool,
    space,
    dtypes: tuple[str, str],
    quiet: bool,
    work: environment.Work,
) -> list[int]:
    """Check the model (`force`: start over), ask `space`, record it (computed as `work`
    computes); the chunks to encode."""
    restart = None
    try:
        check_model(store, spec)
    except StoreMismatch as mismatch:
        if not force:
            raise
        restart = mismatch
    if space is not None and (restart or store.ledger(STAGE).todo(plan)):
        space.before_encode(store, *dtypes)
    if restart is not None:
        log.info(f"encode: starting over ({restart.message})", quiet)
        reset_from(store, "encode")
    todo = store.ledger(STAGE).todo(plan if chunks is None else chunks)
    if "model" not in store.attrs:
        record = {**spec, "environment": work.env}
        if work.others:  # Dask workers allowed to differ from the first
            record["environment_changes"] = list(work.others)
        store.set_attrs(model=record)
    return todo


def _warn_about_weights(weights, spec: dict) -> None:
    """Warn of random weights, and of weights trained at another image size than the store's."""
    if weights.random_seed is not None:
        log.warn("random weights: embeddings and masks from them mean nothing")
    trained = trained_size(weights)
    if trained and spec["image_size"] != trained:
        log.warn(
            f"these weights were trained at image size {trained} and this store is at "
            f"{spec['image_size']}: decode with --image-size {trained} for their masks"
        )


def _encode_chunks(
    store: RunStore,
    predictor,
    plan: ChunkPlan,
    todo: list[int],
    batch_size: int,
    embedding_dtype: str,
    precision: str,
    quiet: bool,
) -> None:
    """Encode the chunks `todo` in this process, one read ahead and one written behind."""
    T = plan.num_frames
    frames_of = FramesOnDisk(store)
    todo_frames = sum(hi - lo for lo, hi in map(plan.bounds, todo))
    # One chunk read ahead and one written behind while the current one is encoded.
    try:
        with (
            log.progress("encode", T, quiet, initial=T - todo_frames) as bar,
            Behind("segpipe-features") as writer,
        ):
            for i, k in enumerate(todo):
                chunk_frames = frames_of(k)
                if i + 1 < len(todo):
                    frames_of.ahead(todo[i + 1])
                encoded = encode_frames(
                    predictor, chunk_frames, batch_size, embedding_dtype, precision
                )
                writer.submit(write_features, store, k, encoded)
                bar.update(len(chunk_frames))
    finally:
        frames_of.close()


class FramesOnDisk:
    """Chunk k's model-input frames: read from the store, or decoded again from the source
    where they were dropped (`segpipe.store.retention`). Under `--keep masks` those are
    held in memory only (nothing reads a chunk's frames once it is encoded); otherwise
    they are written back, as a repair restores them. `ahead(k)` gets chunk k's on a
    thread of its own while the caller works (one chunk ahead at most; never a write)."""

    def __init__(self, store: RunStore):
        self.store, self.redecoder = store, None
        self.plan = store.plan
        self.in_memory = keep_setting(store) == "masks"
        self.reader: ThreadPoolExecutor | None = None
        self.coming = None  # (k, future of its frames)

    def __call__(self, k: int) -> np.ndarray:
        coming, self.coming = self.coming, None
        if coming is not None:
            if coming[0] == k:
                return coming[1].result()
            coming[1].exception()  # another chunk's: the source is free once it ends
        return self._get(k)

    def ahead(self, k: int) -> None:
        """Start getting chunk k's frames behind (where that writes nothing)."""
        if self.coming is not None or not (self.in_memory or self._kept(k)):
            return
        if self.reader is None:
            self.reader = ThreadPoolExecutor(1, "segpipe-frames")
        self.coming = (k, self.reader.submit(self._get, k))

    def close(self) -> None:
        """Wait for a read ahead in flight (its error is its caller's no longer)."""
        if self.reader is not None:
            self.reader.shutdown(cancel_futures=True)

    def _kept(self, k: int) -> bool:
        """Whether chunk k's frames are on disk, or will be once the decode running
        alongside commits them (`stages.alongside`)."""
        alongside = self.store.alongside
        return alongside.kept if alongside is not None else has(self.store, "frames", k)

    def _get(self, k: int) -> np.ndarray:
        alongside = self.store.alongside
        if alongside is not None:  # decoding alongside: once it has committed chunk k
            alongside.wait(k)
            if alongside.kept:
                return self.store.read("frames", *self.plan.bounds(k))
        if not has(self.store, "frames", k):
            if self.redecoder is None:
                from segpipe.stages.decode import Redecoder
                from segpipe.store.source import stored_source

                self.redecoder = Redecoder(self.store, stored_source(self.store))
            if self.in_memory:
                return self.redecoder.frames(k)[0]
            self.redecoder.chunk(k)
        return self.store.read("frames", *self.plan.bounds(k))


class Encoded:
    """A chunk's three levels as SAM 2's image encoder made them, batch by batch (each level a
    list of the batches' tensors: a chunk is never copied into one tensor where it is only
    tracked), each held in the dtype it is stored in where that is not float32 (float32
    holds every computed dtype exactly: the level itself then), with their kinds ((layout,
    dtype SAM 2 computed it in, stored dtype) per level); on the device (`run`'s passes) or
    on the host (the encode stage). `frame_shapes`: a frame's shape per level. `stored()`:
    as the store holds them (host arrays: what a write writes). `read(a, b)`: frames
    a..b-1 as a read of them back gives them to the tracker (`as_read_back`: the stored
    dtype's rounding applied, in the computed dtype and layout), per level `Batches` on the
    levels' device: features kept in memory track exactly as features read back."""

    def __init__(self, levels: list[list[torch.Tensor]], kinds: list[tuple[str, str, str]]):
        self.levels, self.kinds = levels, kinds

    @property
    def frame_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(parts[0].shape[1:]) for parts in self.levels]

    def stored(self) -> list[np.ndarray]:
        return [
            np.concatenate([to_storage(t.cpu(), kind[2]) for t in parts])
            for parts, kind in zip(self.levels, self.kinds)
        ]

    def read(self, a: int, b: int) -> list[Batches]:
        """Frames a..b-1 of the chunk, per level (views into the batches that hold them)."""
        out = []
        for parts, kind in zip(self.levels, self.kinds):
            taken, start = [], 0
            for t in parts:
                lo, hi = max(a, start), min(b, start + len(t))
                if lo < hi:  # (the layout a read back restores: a no-op where it is)
                    frames = as_read_back(
                        t[lo - start : hi - start], kind[2], getattr(torch, kind[1])
                    )
                    taken.append(restore_layout(frames, kind[0]))
                start += len(t)
            out.append(Batches(taken))
        return out


def write_features(store: RunStore, k: int, encoded: Encoded, write: bool = True) -> None:
    """Write chunk k's levels (`encoded`) and commit it. A level's array is made by the
    first chunk written that finds it missing (its shape, dtype and layout are known once the
    model has produced them), the same whoever makes it (`level_array`): a kill between the
    levels leaves some made, and the next chunk makes the others.

    `write` False (under `--keep masks`, levels that only the pass at hand reads, which has
    them in memory): the level arrays are made all the same, and the chunk is recorded
    encoded and dropped at once, as if written and dropped after its tracking; no byte of
    it is written. A crash before the pass commits it costs its encoding again, as for a
    dropped chunk."""
    lo, hi = store.plan.bounds(k)
    host = encoded.stored() if write else [None] * len(LEVELS)
    for name, shape, kind, data in zip(LEVELS, encoded.frame_shapes, encoded.kinds, host):
        arr = level_array(store, name, shape, stored_numpy_dtype(kind[2]), kind)
        if write:
            arr[lo:hi] = data
    if write:
        store.commit(STAGE, k, list(LEVELS[: len(encoded.levels)]))
        restored(store, "features", k)
    else:
        drop(store, "features", k)  # recorded dropped before it counts as encoded
        store.commit(STAGE, k)
    if keep_setting(store) == "masks":
        drop(store, "frames", k)  # encoded: nothing reads them again


def encode_chunk(
    store: RunStore,
    predictor,
    k: int,
    frames_of: FramesOnDisk,
    batch_size: int = 1,
    write: bool = True,
) -> Encoded:
    """Encode chunk k (again, where its features were dropped) as the stage encodes it: the
    store's embedding dtype and precision, and write it (`write`: see `write_features`)."""
    encoded = chunk_levels(store, predictor, k, frames_of, batch_size)
    write_features(store, k, encoded, write)
    return encoded


def chunk_levels(
    store: RunStore,
    predictor,
    k: int,
    frames_of: FramesOnDisk,
    batch_size: int = 1,
    on_device: bool = False,
) -> Encoded:
    """Chunk k's levels (`encode_frames`), in the store's embedding dtype and precision, not
    written; kept on the predictor's device (`on_device`: a pass reads them next)."""
    spec = store.attrs["model"]
    return encode_frames(
        predictor,
        frames_of(k),
        batch_size,
        spec["embedding_dtype"],
        spec["precision"],
        on_device,
    )


@torch.inference_mode()
def encode_frames(
    predictor,
    frames: np.ndarray,
    batch_size: int,
    dtype: str,
    precision: str = "float32",
    on_device: bool = False,
) -> Encoded:
    """Backbone levels of `frames`, batch by batch, and per level its (layout, dtype SAM 2
    computed it in, stored dtype); each batch's levels go to the host as they are made
    unless `on_device`."""
    device, family = predictor.device, family_of_predictor(predictor)
    outs: list[list[torch.Tensor]] = [[], [], []]
    kinds: list[tuple[str, str, str]] = []
    for lo in range(0, len(frames), batch_size):
        images = family.preprocess(frames[lo : lo + batch_size], device)
        with autocast(device.type, precision):
            backbone = family.encode(predictor, images)
        kinds = []
        for level, feats in enumerate(backbone):
            stored = storage_dtype(feats.dtype, dtype, precision)
            kinds.append((memory_format(feats), str(feats.dtype).removeprefix("torch."), stored))
            held = feats if stored == "float32" else feats.to(getattr(torch, stored))
            outs[level].append(held if on_device else held.cpu())
    return Encoded([level for level in outs if level], kinds)
