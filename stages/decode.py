"""Decode stage: stream the video with PyAV into `frames` (T, S, S, 3) uint8, chunk by chunk.

Frames are resized to the model's square input as SAM 2's own frame loader does
(`PIL.Image.resize((S, S))`, PIL's default filter). Never more than one chunk is held.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from pipeline.errors import UserError
from pipeline.store import RunStore, file_identity
from pipeline.video import DecodeError, iter_frames, probe
from pipeline import log

STAGE = "decode"
DEFAULT_CHUNK_SIZE = 32
DEFAULT_IMAGE_SIZE = 1024


def open_or_create_store(video: Path, store_path: Path, chunk_size: int | None,
                         image_size: int | None) -> RunStore:
    """Check the video and the settings against the store before anything is written."""
    video = Path(video)
    for name, value in (("--chunk-size", chunk_size), ("--image-size", image_size)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive integer, got {value}")
    if image_size is not None and image_size % 32:
        raise UserError(f"--image-size must be a multiple of 32 (SAM 2's stride), got {image_size}")
    info = probe(video)
    identity = file_identity(video)
    if RunStore.exists(store_path):
        store = RunStore.open(store_path)
        source = store.attrs["source"]
        if (source["size"], source["sha256"]) != (identity["size"], identity["sha256"]):
            raise UserError(
                f"store {store_path} was made from another video ({source['path']}, "
                f"sha256 {source['sha256'][:12]}), not {video} (sha256 {identity['sha256'][:12]})"
            )
        if chunk_size is not None:
            store.require("chunk_size", store.attrs["chunk_size"], chunk_size)
        if image_size is not None:
            store.require("image_size", store.attrs["image_size"], image_size)
        return store
    return RunStore.create(store_path, {
        "source": {"path": str(video.resolve()), **identity},
        "video": info.as_attrs(),
        "chunk_size": chunk_size or DEFAULT_CHUNK_SIZE,
        "image_size": image_size or DEFAULT_IMAGE_SIZE,
    })


def decode(video: Path, store_path: Path, chunk_size: int | None = None,
           image_size: int | None = None, quiet: bool = False) -> RunStore:
    store = open_or_create_store(video, store_path, chunk_size, image_size)
    if "frame_count" in store.attrs:
        log.info(f"decode: already complete ({store.attrs['frame_count']} frames)", quiet)
        return store
    C, S = store.attrs["chunk_size"], store.attrs["image_size"]
    ledger = store.ledger(STAGE)
    done = ledger.done()
    resume_chunk = int(np.argmin(done)) if not done.all() else len(done)  # first undone chunk
    start = resume_chunk * C
    frames = store.ensure_array("frames", (start, S, S, 3), (C, S, S, 3), "uint8")
    pts_arr = store.ensure_array("pts", (start,), (C,), "int64", fill_value=-1)
    times = store.ensure_array("timestamps", (start,), (C,), "float64", fill_value=np.nan)
    after_pts = int(pts_arr[start - 1]) if start and pts_arr[start - 1] >= 0 else None
    skip = start if start and after_pts is None else 0

    buf = np.empty((C, S, S, 3), dtype=np.uint8)
    buf_pts = np.full(C, -1, dtype=np.int64)
    buf_time = np.full(C, np.nan)
    n, k = 0, resume_chunk
    claimed = store.attrs["video"]["claimed_frames"]
    bar = tqdm(total=claimed or None, initial=start, unit="frame", desc="decode",
               disable=quiet, dynamic_ncols=True)
    broke_off = None

    def flush():
        lo = k * C
        for arr in (frames, pts_arr, times):
            arr.resize((lo + n, *arr.shape[1:]))
        frames[lo:lo + n] = buf[:n]
        pts_arr[lo:lo + n] = buf_pts[:n]
        times[lo:lo + n] = buf_time[:n]
        store.commit(STAGE, k, ["frames", "pts", "timestamps"])

    try:
        for pts, seconds, frame in iter_frames(video, after_pts=after_pts, skip=skip):
            buf[n] = np.asarray(frame.to_image().resize((S, S)))
            buf_pts[n] = -1 if pts is None else pts
            buf_time[n] = seconds
            n += 1
            bar.update(1)
            if n == C:
                flush()
                n, k = 0, k + 1
    except DecodeError as e:
        broke_off = str(e)
    if n:
        flush()
        k += 1
    bar.close()
    total = frames.shape[0]
    if total == 0:
        raise UserError(f"video has no decodable frames: {video}")
    store.set_attrs(frame_count=total, decode_warning=_truncation_note(total, claimed, broke_off))
    if store.attrs["decode_warning"]:
        log.warn(f"decode: {store.attrs['decode_warning']}")
    log.info(f"decode: {total} frames into {store.path}", quiet)
    return store


def _truncation_note(total: int, claimed: int, broke_off: str | None) -> str | None:
    if broke_off:
        return f"video is damaged or truncated: decoding stopped after {total} frames ({broke_off})"
    if claimed and total < claimed:
        return f"video looks truncated: decoded {total} of the {claimed} frames the container claims"
    return None
