"""Decode stage: stream the video with PyAV into `frames` (T, S, S, 3) uint8, chunk by chunk.

Frames are resized to the model's square input as SAM 2's own frame loader does
(`PIL.Image.resize((S, S))`, PIL's default filter). Never more than one chunk is held.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pipeline.chunks import ChunkPlan
from pipeline.errors import UserError
from pipeline.store import RunStore, file_identity, same_file
from pipeline.video import DecodeError, iter_frames, probe
from pipeline import log

STAGE = "decode"
DEFAULT_CHUNK_SIZE = 32
DEFAULT_IMAGE_SIZE = 1024


def open_or_create_store(video: Path, store_path: Path, chunk_size: int | None,
                         image_size: int | None, force: bool = False) -> RunStore:
    """Check the video and the settings against the store before anything is written.
    With `force`, a store made from another video or with other settings is started over
    (everything in it is recomputed) instead of refused."""
    video = Path(video)
    for name, value in (("--chunk-size", chunk_size), ("--image-size", image_size)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive integer, got {value}")
    if image_size is not None and image_size % 32:
        raise UserError(f"--image-size must be a multiple of 32 (SAM 2's stride), got {image_size}")
    info = probe(video)
    if RunStore.exists(store_path):
        store = RunStore.open(store_path)
        try:
            check_store(store, video, chunk_size, image_size)
            return store
        except UserError as mismatch:
            if not force:
                raise
            log.info(f"decode: starting over ({mismatch.message})")
            shutil.rmtree(store_path)
    return RunStore.create(store_path, {
        "source": {"path": str(video.resolve()), **file_identity(video)},
        "video": info.as_attrs(),
        "chunk_size": chunk_size or DEFAULT_CHUNK_SIZE,
        "image_size": image_size or DEFAULT_IMAGE_SIZE,
    })


def check_store(store: RunStore, video: Path, chunk_size, image_size) -> None:
    source = store.attrs["source"]
    if not same_file(source, video):
        raise UserError(f"store {store.path} was made from another video ({source['path']}, "
                        f"sha256 {source['sha256'][:12]}), not {video}")
    if chunk_size is not None:
        store.require("chunk_size", store.attrs["chunk_size"], chunk_size)
    if image_size is not None:
        store.require("image_size", store.attrs["image_size"], image_size)


def decode(video: Path, store_path: Path, chunk_size: int | None = None,
           image_size: int | None = None, quiet: bool = False, force: bool = False) -> RunStore:
    store = open_or_create_store(video, store_path, chunk_size, image_size, force)
    if "frame_count" in store.attrs:
        plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
        redo = store.ledger(STAGE).todo(plan)
        if redo:
            redecode_chunks(store, video, redo, quiet)
        else:
            log.info(f"decode: already complete ({store.attrs['frame_count']} frames)", quiet)
        return store
    C, S = store.attrs["chunk_size"], store.attrs["image_size"]
    ledger = store.ledger(STAGE)
    done = ledger.done()
    resume_chunk = int(np.argmin(done)) if not done.all() else len(done)  # first undone chunk
    start = resume_chunk * C
    if done.all() and store.array("frames") is not None and store.array("frames").shape[0] < start:
        start = store.array("frames").shape[0]  # the last chunk was short: the video had ended
    frames = store.ensure_array("frames", (start, S, S, 3), (C, S, S, 3), "uint8")
    pts_arr = store.ensure_array("pts", (start,), (C,), "int64", fill_value=-1)
    times = store.ensure_array("timestamps", (start,), (C,), "float64", fill_value=np.nan)
    after_pts, skip = resume_point(store, start)

    claimed = store.attrs["video"]["claimed_frames"]
    broke_off = None

    def write(k: int, chunk: np.ndarray, chunk_pts: list, chunk_times: list) -> None:
        lo, n = k * C, len(chunk)
        for arr in (frames, pts_arr, times):
            arr.resize((lo + n, *arr.shape[1:]))
        frames[lo:lo + n] = chunk
        pts_arr[lo:lo + n] = chunk_pts
        times[lo:lo + n] = chunk_times
        store.commit(STAGE, k, ["frames", "pts", "timestamps"])

    # Decoding stays in this thread; resizing (PIL releases the GIL) runs in a small pool and
    # each finished chunk is compressed and written behind, so at most two chunks are held.
    k, pending, batch, batch_pts, batch_times = resume_chunk, None, [], [], []
    with log.progress("decode", claimed or None, quiet, initial=start) as bar, \
            ThreadPoolExecutor(2) as resizer, ThreadPoolExecutor(1) as writer:
        def flush():
            nonlocal k, pending, batch, batch_pts, batch_times
            try:
                chunk = np.stack([f.result() for f in batch])
            except Exception as e:  # noqa: BLE001 - a frame that cannot become RGB
                raise DecodeError(f"frame {k * C} onwards cannot be converted ({e})") from None
            if pending is not None:
                pending.result()
            pending = writer.submit(write, k, chunk, batch_pts, batch_times)
            k, batch, batch_pts, batch_times = k + 1, [], [], []

        try:
            for pts, seconds, frame in iter_frames(video, after_pts=after_pts, skip=skip):
                batch.append(resizer.submit(model_input, frame, S))
                batch_pts.append(-1 if pts is None else pts)
                batch_times.append(seconds)
                bar.update(1)
                if len(batch) == C:
                    flush()
            if batch:
                flush()
        except DecodeError as e:
            broke_off = str(e)
            if batch and all(f.exception() is None for f in batch):
                flush()
        if pending is not None:
            pending.result()
    total = frames.shape[0]
    if total == 0:
        raise UserError(f"video has no decodable frames: {video}")
    store.set_attrs(frame_count=total, decode_warning=_truncation_note(total, claimed, broke_off))
    if store.attrs["decode_warning"]:
        log.warn(f"decode: {store.attrs['decode_warning']}")
    log.info(f"decode: {total} frames into {store.path}", quiet)
    return store


def model_input(frame, size: int) -> np.ndarray:
    """RGB, resized to the model's square input with PIL's default filter, as SAM 2 does."""
    return np.asarray(frame.to_image().resize((size, size)))


def resume_point(store: RunStore, start: int) -> tuple[int | None, int]:
    """Where to pick the source up for frame `start`: after the pts of frame start-1 (a
    frame-exact seek), or by skipping `start` frames when the stream has no pts."""
    if start == 0:
        return None, 0
    before = int(store.read("pts", start - 1, start)[0])
    return (before, 0) if before >= 0 else (None, start)


def redecode_chunks(store: RunStore, video: Path, chunks: list[int], quiet: bool) -> None:
    """Decode again exactly these chunks of a completely decoded store (repair)."""
    S = store.attrs["image_size"]
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    for k in chunks:
        lo, hi = plan.bounds(k)
        after_pts, skip = resume_point(store, lo)
        frames, pts, times = [], [], []
        for p, seconds, frame in iter_frames(video, after_pts=after_pts, skip=skip):
            frames.append(model_input(frame, S))
            pts.append(-1 if p is None else p)
            times.append(seconds)
            if len(frames) == hi - lo:
                break
        if len(frames) != hi - lo:
            raise UserError(f"cannot decode frames {lo}..{hi - 1} of {video} again")
        store.array("frames")[lo:hi] = np.stack(frames)
        store.array("pts")[lo:hi] = pts
        store.array("timestamps")[lo:hi] = times
        store.commit(STAGE, k, ["frames", "pts", "timestamps"])
        log.info(f"decode: chunk {k} (frames {lo}..{hi - 1}) decoded again", quiet)


def _truncation_note(total: int, claimed: int, broke_off: str | None) -> str | None:
    if broke_off:
        return f"video is damaged or truncated: decoding stopped after {total} frames ({broke_off})"
    if claimed and total < claimed:
        return f"video looks truncated: decoded {total} of the {claimed} frames the container claims"
    return None
