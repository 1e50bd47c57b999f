"""Decode stage: stream the video with PyAV into `frames` (T, S, S, 3) uint8, chunk by chunk.

Frames are resized to the model's square input as SAM 2's own frame loader does
(`PIL.Image.resize((S, S))`, PIL's default filter). At most two chunks of resized frames
are held (the one being filled and the one being written).
"""
from __future__ import annotations

import hashlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from segpipe.chunks import ChunkPlan
from segpipe.errors import BadInput, DamagedStore, StoreMismatch
from segpipe.lock import holds_store_lock
from segpipe.retention import has, restored
from segpipe.store import RunStore, file_identity, same_file
from segpipe.video import DecodeError, is_damage, iter_frames, probe, video_streams
from segpipe import log

STAGE = "decode"
DEFAULT_CHUNK_SIZE = 32
DEFAULT_IMAGE_SIZE = 1024


def open_or_create_store(video: Path, store_path: Path, chunk_size: int | None,
                         image_size: int | None, force: bool = False,
                         stream: int | None = None, fps: float | None = None,
                         space=None) -> RunStore:
    """Check the video and the settings against the store before anything is written.
    With `force`, a store made from another video or with other settings is started over
    (everything in it is recomputed) instead of refused. `space` (an
    `estimate.SpaceGuard`) is asked before the first write, when decoding is left to do."""
    video = Path(video)
    for name, value in (("--chunk-size", chunk_size), ("--image-size", image_size)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be a positive integer, got {value}")
    if image_size is not None and image_size % 32:
        raise BadInput(f"--image-size must be a multiple of 32 (SAM 2's stride), got {image_size}")
    if Path(video).is_dir() and stream is not None:
        raise BadInput("--stream is for video files; a frame folder has one sequence")
    if Path(video).is_file() and fps is not None:
        raise BadInput("--fps is for frame folders; a video file has its own timing")
    info = probe(video, stream, fps)
    C, S = chunk_size or DEFAULT_CHUNK_SIZE, image_size or DEFAULT_IMAGE_SIZE
    if RunStore.exists(store_path):
        store = RunStore.open(store_path)
        try:
            check_store(store, video, chunk_size, image_size, stream, fps)
        except StoreMismatch as mismatch:
            if not force:
                raise
            if space is not None:
                space.before_decode(None, video, info, C, S)
            log.info(f"decode: starting over ({mismatch.message})")
            shutil.rmtree(store_path)
        else:
            if space is not None and "frame_count" not in store.attrs:
                space.before_decode(store, video, info, store.attrs["chunk_size"],
                                    store.attrs["image_size"])
            return store
    elif space is not None:
        space.before_decode(None, video, info, C, S)
    say_which_stream(video, info, stream is not None)
    return RunStore.create(store_path, {
        "source": {"path": str(video.resolve()), **file_identity(video)},
        "video": info.as_attrs(),
        "chunk_size": C,
        "image_size": S,
    })


def say_which_stream(video: Path, info, chosen: bool) -> None:
    """With several video streams, name the one used and how to choose another (a warning:
    it decides what is segmented)."""
    if info.kind == "video":
        streams = video_streams(video)
        if len(streams) > 1:
            how = "as asked" if chosen else "the default; --stream N chooses another"
            log.warn(f"decode: {video} has {len(streams)} video streams ({'; '.join(streams)}); "
                     f"using #{info.stream} ({how})")
    if info.rotation:
        log.info(f"decode: frames are rotated {info.rotation} degrees counter-clockwise to "
                 f"stand upright, as players show them ({info.width}x{info.height})")


def check_store(store: RunStore, video: Path, chunk_size, image_size, stream=None, fps=None) -> None:
    source = store.attrs["source"]
    if not same_file(source, video):
        raise StoreMismatch(f"store {store.path} was made from another video ({source['path']}, "
                        f"sha256 {source['sha256'][:12]}), not {video}")
    if chunk_size is not None:
        store.require("chunk_size", store.attrs["chunk_size"], chunk_size)
    if image_size is not None:
        store.require("image_size", store.attrs["image_size"], image_size)
    if stream is not None:
        store.require("--stream", store.attrs["video"].get("stream"), stream)
    if fps is not None:
        store.require("--fps", store.attrs["video"]["fps"], float(fps))


@holds_store_lock
def decode(video: Path, store_path: Path, chunk_size: int | None = None,
           image_size: int | None = None, quiet: bool = False, force: bool = False,
           stream: int | None = None, fps: float | None = None, on_commit=None,
           space=None) -> RunStore:
    """Decode `video` into the store, resuming an unfinished decode; `on_commit(store, k)` is
    called after each chunk is committed (`run --keep masks` drops its frames then).
    `space` (an `estimate.SpaceGuard`) is asked before the first write."""
    store = open_or_create_store(video, store_path, chunk_size, image_size, force, stream, fps,
                                 space)
    if "frame_count" in store.attrs:
        plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
        redo = store.ledger(STAGE).todo(plan)
        if redo:
            redecode_chunks(store, video, redo, quiet)
        else:
            log.info(f"decode: already complete ({store.attrs['frame_count']} frames)", quiet)
        return store
    C, S = store.attrs["chunk_size"], store.attrs["image_size"]
    resume_chunk = resume_from(store, C)
    start = resume_chunk * C
    frames = store.ensure_array("frames", (start, S, S, 3), (C, S, S, 3), "uint8")
    pts_arr = store.ensure_array("pts", (start,), (C,), "int64", fill_value=-1)
    times = store.ensure_array("timestamps", (start,), (C,), "float64", fill_value=np.nan)
    digests = (store.ensure_array("frame_digests", (start, DIGEST), (C, DIGEST), "uint8")
               if start == 0 or store.array("frame_digests") is not None else None)

    claimed = store.attrs["video"]["claimed_frames"]
    broke_off = None

    arrays = [a for a in (frames, pts_arr, times, digests) if a is not None]
    names = ["frames", "pts", "timestamps"] + (["frame_digests"] if digests is not None else [])

    def write(k: int, chunk: np.ndarray, chunk_pts: list, chunk_times: list) -> None:
        lo, n = k * C, len(chunk)
        for arr in arrays:
            arr.resize((lo + n, *arr.shape[1:]))
        frames[lo:lo + n] = chunk
        pts_arr[lo:lo + n] = chunk_pts
        times[lo:lo + n] = chunk_times
        if digests is not None:
            digests[lo:lo + n] = frame_digests(chunk)
        store.commit(STAGE, k, names)
        if on_commit is not None:
            on_commit(store, k)

    # Decoding stays in this thread; resizing (PIL releases the GIL) runs in a small pool and
    # each finished chunk is compressed and written behind, so at most two chunks are held.
    k, pending, batch, batch_pts, batch_times = resume_chunk, None, [], [], []
    with log.progress("decode", claimed or None, quiet, initial=start) as bar, \
            ThreadPoolExecutor(2) as resizer, ThreadPoolExecutor(1) as writer:
        def flush():
            nonlocal k, pending, batch, batch_pts, batch_times
            try:
                chunk = np.stack([f.result() for f in batch])
            except Exception as e:  # noqa: BLE001 - sorted by is_damage below
                if not is_damage(e):
                    raise
                raise DecodeError(f"frame {k * C} onwards cannot be converted ({e})") from None
            if pending is not None:
                pending.result()
            pending = writer.submit(write, k, chunk, batch_pts, batch_times)
            k, batch, batch_pts, batch_times = k + 1, [], [], []

        try:
            for pts, seconds, picture in source_from(store, video, start):
                batch.append(resizer.submit(model_input, picture, S))
                batch_pts.append(-1 if pts is None else pts)
                batch_times.append(seconds)
                bar.update(1)
                if len(batch) == C:
                    flush()
            if batch:
                flush()
        except DecodeError as e:
            broke_off = str(e)
            failed = [f.exception() for f in batch if f.exception() is not None]
            for error in failed:
                if not is_damage(error):
                    raise error  # out of memory, say: not the end of the video
            if batch and not failed:
                flush()  # the good frames before the damage: the video ends there
        if pending is not None:
            pending.result()
    total = frames.shape[0]
    if total == 0:
        raise BadInput(f"video has no decodable frames: {video}")
    last_time = float(store.read("timestamps", total - 1, total)[0])
    store.set_attrs(frame_count=total,
                    decode_warning=_truncation_note(total, last_time, store.attrs["video"], broke_off))
    if store.attrs["decode_warning"]:
        log.warn(f"decode: {store.attrs['decode_warning']}")
    log.info(f"decode: {total} frames into {store.path}", quiet)
    return store


DIGEST = 16  # bytes of a frame's digest


def frame_digests(frames: np.ndarray) -> np.ndarray:
    """(N, DIGEST) uint8: each model input's BLAKE2b digest. A chunk whose frames were
    dropped (see `retention`) is found again in the source by its pts and these."""
    return np.stack([np.frombuffer(hashlib.blake2b(f.tobytes(), digest_size=DIGEST).digest(),
                                   np.uint8) for f in frames])


def model_input(picture, size: int) -> np.ndarray:
    """RGB, upright, resized to the model's square input with PIL's default filter, as SAM
    2's frame loader does."""
    return np.asarray(picture().resize((size, size)))


def resume_from(store: RunStore, C: int) -> int:
    """The chunk an unfinished decode continues from: the first chunk not done, and never
    after a short chunk. A short chunk is the end of the video only together with the frame
    count (recorded after it), so without the count it is decoded again."""
    done = store.ledger(STAGE).done()
    first_undone = int(np.argmin(done)) if not done.all() else len(done)
    frames = store.array("frames")
    return min(first_undone, frames.shape[0] // C) if frames is not None else 0


def source_from(store: RunStore, video: Path, start: int):
    """The store's source from frame `start` on, picked up where the stored frames end: by
    the stored pts of frame start-1, a seek proven by that frame's model input being the
    stored one (pts can repeat), else by counting (also where the stored pts go back)."""
    attrs = store.attrs["video"]
    before = check = None
    if start > 0:
        pts = store.read("pts", max(0, start - 2), start)
        if len(pts) < 2 or pts[0] < pts[1]:
            before = int(pts[-1])
            S = store.attrs["image_size"]
            if has(store, "frames", (start - 1) // store.attrs["chunk_size"]):
                stored = store.read("frames", start - 1, start)[0]
                check = lambda picture: np.array_equal(model_input(picture, S), stored)  # noqa: E731
            else:  # the frames were dropped: their digests stay
                digest = store.read("frame_digests", start - 1, start)[0]
                check = lambda picture: np.array_equal(  # noqa: E731
                    frame_digests(model_input(picture, S)[None])[0], digest)
    frames = iter_frames(video, start, before, attrs.get("stream"), attrs.get("rotation"), check)
    if attrs.get("kind") == "frames":  # a folder's frame t is at t / fps, the store's setting
        return ((t, t / attrs["fps"], picture) for t, _, picture in frames)
    return frames


def stored_source(store: RunStore) -> Path:
    """The video the store was made from, which must still be there, unchanged: decoding
    dropped or damaged chunks again reads it."""
    source = Path(store.attrs["source"]["path"])
    if not source.exists():
        raise BadInput(f"the source video {source} is gone: chunks whose frames are not in "
                       f"the store cannot be decoded again")
    if not same_file(store.attrs["source"], source):
        raise BadInput(f"the source video {source} changed since it was decoded: chunks "
                       f"whose frames are not in the store cannot be decoded again")
    return source


class Redecoder:
    """Decodes chunks of a completely decoded store again (repair; chunks whose frames were
    dropped), reading on from one open decoder while the chunks asked for are consecutive."""

    def __init__(self, store: RunStore, video: Path):
        self.store, self.video = store, video
        self.S = store.attrs["image_size"]
        self.plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
        self.stream, self.next_frame = None, None

    def chunk(self, k: int, quiet: bool = True) -> None:
        lo, hi = self.plan.bounds(k)
        if self.next_frame != lo:
            self.stream = source_from(self.store, self.video, lo)
        self.next_frame = None  # until this chunk is read whole
        frames, pts, times = [], [], []
        for p, seconds, picture in self.stream:
            frames.append(model_input(picture, self.S))
            pts.append(-1 if p is None else p)
            times.append(seconds)
            if len(frames) == hi - lo:
                break
        if len(frames) != hi - lo:
            raise BadInput(f"cannot decode frames {lo}..{hi - 1} of {self.video} again")
        self.next_frame = hi
        frames = np.stack(frames)
        digests = frame_digests(frames)
        self._same_as_first(k, digests)
        self.store.array("frames")[lo:hi] = frames
        self.store.array("pts")[lo:hi] = pts
        self.store.array("timestamps")[lo:hi] = times
        written = ["frames", "pts", "timestamps"]
        if self.store.array("frame_digests") is not None:
            self.store.array("frame_digests")[lo:hi] = digests
            written.append("frame_digests")
        self.store.commit(STAGE, k, written)
        restored(self.store, "frames", k)
        log.info(f"decode: chunk {k} (frames {lo}..{hi - 1}) decoded again", quiet)


    def _same_as_first(self, k: int, digests: np.ndarray) -> None:
        """Refuse frames that differ from those first decoded (by their stored digests):
        features and masks made from them would silently differ. (A damaged digest chunk
        is being repaired: nothing to compare with.)"""
        if self.store.array("frame_digests") is None:
            return
        lo, hi = self.plan.bounds(k)
        try:
            stored = self.store.read("frame_digests", lo, hi)
        except DamagedStore:
            return
        differ = np.nonzero((stored != digests).any(axis=1))[0]
        if len(differ):
            raise BadInput(f"{self.video} decodes differently now: frame {lo + differ[0]} is not "
                           f"the frame first decoded into the store (another decoder or "
                           f"version?); its chunk cannot be restored exactly")


def redecode_chunks(store: RunStore, video: Path, chunks: list[int], quiet: bool) -> None:
    """Decode again exactly these chunks of a completely decoded store (repair)."""
    redecoder = Redecoder(store, video)
    for k in chunks:
        redecoder.chunk(k, quiet)


def _truncation_note(total: int, last_time: float, video: dict, broke_off: str | None) -> str | None:
    """Judged by time, as a player shows the video: frames are missing when the last decoded
    frame ends more than a frame and a half before the end the container records for the
    video stream (variable frame rates and edit lists included)."""
    if broke_off:
        return f"video is damaged or truncated: decoding stopped after {total} frames ({broke_off})"
    duration, fps = video.get("duration"), video.get("fps")
    if duration and fps and last_time == last_time:  # not NaN
        end = video.get("start_time", 0.0) + duration
        if end - (last_time + 1 / fps) > 1.5 / fps:
            return (f"video looks truncated: decoded {total} frames, up to {last_time:.3f} s of "
                    f"the {end:.3f} s its container records")
    return None
