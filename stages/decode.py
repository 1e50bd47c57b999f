"""Decode stage: stream the video with PyAV into `frames` (T, S, S, 3) uint8, chunk by chunk.

Frames are resized to the model's square input as SAM 2's own frame loader does
(`PIL.Image.resize((S, S))`, PIL's default filter). At most two chunks of resized frames
are held (the one being filled and the one being written).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from segpipe import log
from segpipe.behind import Behind
from segpipe.errors import BadInput, DamagedStore, StoreMismatch
from segpipe.fsutil import fsync_path, resolved
from segpipe.settings import Decoding, record
from segpipe.sources.frames import DIGEST, digested_input, resize_workers
from segpipe.sources.registry import for_store, identity, named, probe, same_source
from segpipe.sources.video import DecodeError, is_damage, video_streams
from segpipe.store.lock import holds_store_lock
from segpipe.store.retention import drop, restored
from segpipe.store.runstore import RunStore
from segpipe.store.source import SourceReader, source_from

STAGE = "decode"


class Stopped(Exception):
    """A decode alongside the tracking was asked to stop (`stages.alongside`)."""


def open_or_create_store(
    video: Path, store_path: Path, decoding: Decoding, force: bool = False, space=None
) -> RunStore:
    """Check the video and the settings against the store before anything is written.
    With `force`, a store made from another video or with other settings is started over
    (everything in it is recomputed) instead of refused. `space` (an
    `space.SpaceGuard`) is asked before the first write, when decoding is left to do."""
    video = Path(video)
    stream, fps = decoding.check().stream, decoding.fps
    info = probe(video, stream, fps, recorded_kind(store_path))
    C, S = decoding.sizes()
    if RunStore.exists(store_path):
        store = RunStore.open(store_path)
        try:
            check_store(store, video, decoding)
        except StoreMismatch as mismatch:
            if not force:
                raise
            info = probe(video, stream, fps)  # started over: read as what the path is now
            if space is not None:
                space.before_decode(None, video, info, C, S)
            log.info(f"decode: starting over ({mismatch.message})")
            RunStore.remove(store_path)
        else:
            if store.attrs["video"].get("intensity"):  # the recorded window, not computed again
                info = replace(info, intensity=tuple(store.attrs["video"]["intensity"]))
            if space is not None and "frame_count" not in store.attrs:
                space.before_decode(store, video, info, store.chunk_size, store.image_size)
            return store
    elif space is not None:
        space.before_decode(None, video, info, C, S)
    say_which_stream(video, info, stream is not None)
    info = for_store(video, info)  # what reading it back needs, computed once (a window)
    return RunStore.create(
        store_path,
        {
            "source": {"path": str(resolved(video)), **identity(video, info.kind)},
            "video": info.as_attrs(),
            **record(Decoding(C, S)),
        },
    )


def recorded_kind(store_path: Path) -> str | None:
    """The source kind a store recorded (None: no store yet): its source is read as that."""
    if not RunStore.exists(store_path):
        return None
    return RunStore.open(store_path, read_only=True).attrs["video"].get("kind") or "video"


def say_which_stream(video: Path, info, chosen: bool) -> None:
    """With several video streams, name the one used and how to choose another (a warning:
    it decides what is segmented)."""
    if named(info.kind).streams:
        streams = video_streams(video)
        if len(streams) > 1:
            how = "as asked" if chosen else "the default; --stream N chooses another"
            log.warn(
                f"decode: {video} has {len(streams)} video streams ({'; '.join(streams)}); "
                f"using #{info.stream} ({how})"
            )
    if info.rotation:
        log.info(
            f"decode: frames are rotated {info.rotation} degrees counter-clockwise to "
            f"stand upright, as players show them ({info.width}x{info.height})"
        )


def check_store(store: RunStore, video: Path, decoding: Decoding) -> None:
    """The store was made from this source, with these settings (those given)."""
    source = store.attrs["source"]
    if not same_source(source, video, store.attrs["video"].get("kind")):
        raise StoreMismatch(
            f"store {store.path} was made from another video ({source['path']}, "
            f"sha256 {source['sha256'][:12]}), not {video}"
        )
    decoding.against(store)


@holds_store_lock
def check(video: Path, store_path: Path, decoding: Decoding, space=None) -> RunStore:
    """decode's checks, and the store made, with nothing decoded yet: bad input is refused
    before any work (segpipe studio checks here, then decodes in its page)."""
    return open_or_create_store(video, store_path, decoding, False, space)


@holds_store_lock
def decode(
    video: Path,
    store_path: Path,
    decoding: Decoding | None = None,
    *,
    quiet: bool = False,
    force: bool = False,
    write_frames=None,
    space=None,
) -> RunStore:
    """Decode `video` into the store, resuming an unfinished decode, with `decoding`'s
    settings (None: the store's, else the defaults). `write_frames(store)`
    False: the frames are not written, only counted, timed and digested, each chunk
    recorded dropped (`run --keep masks`: its passes decode again the chunks they encode,
    and keep those frames in memory only). `space` (an `space.SpaceGuard`) is asked before
    the first write."""
    store = open_or_create_store(video, store_path, decoding or Decoding(), force, space)
    if "frame_count" in store.attrs:
        _redecode_or_done(store, video, quiet)
        return store
    record = decode_rest(store, video, write_frames is None or write_frames(store), quiet)
    store.set_attrs(**record)  # (decode is complete then)
    say_decoded(store, record, quiet)
    return store


def decode_rest(
    store: RunStore, video: Path, kept: bool, quiet: bool, resumed=None, committed=None, stop=None
) -> dict:
    """Decode what is left of the video (from `_resume_from`), each chunk written and
    committed behind (its frames recorded dropped instead, not `kept`); what a complete
    decode records (`frame_count`, `decode_warning`), not recorded yet. `resumed(k)`: told
    the chunk it resumes from; `committed(k, n)`: chunk k's n frames committed; `stop`: as
    `_decode_chunks`."""
    resume_chunk = _resume_from(store, store.chunk_size)
    if resumed is not None:
        resumed(resume_chunk)
    frames, write = _chunk_writer(store, resume_chunk, kept)

    def write_and_say(k: int, chunk, *rest) -> None:
        write(k, chunk, *rest)
        if committed is not None:
            committed(k, len(chunk))

    broke_off = _decode_chunks(store, video, resume_chunk, write_and_say, quiet, stop)
    return _decoded_record(store, video, frames.shape[0], broke_off)


def _redecode_or_done(store: RunStore, video: Path, quiet: bool) -> None:
    """On a completely decoded store, decode again the chunks its ledger lacks (if any)."""
    plan = store.plan
    redo = store.ledger(STAGE).todo(plan)
    if redo:
        redecode_chunks(store, video, redo, quiet)
    else:
        log.info(f"decode: already complete ({store.attrs['frame_count']} frames)", quiet)


def _chunk_writer(store: RunStore, resume_chunk: int, kept: bool):
    """(frames array, write): the arrays cut to `resume_chunk`; write(k, ...) commits chunk k
    (its frames recorded dropped instead of written, not `kept`)."""
    C, S = store.chunk_size, store.image_size
    start = resume_chunk * C
    frames = store.ensure_array("frames", (start, S, S, 3), (C, S, S, 3), "uint8")
    pts_arr = store.ensure_array("pts", (start,), (C,), "int64", fill_value=-1)
    times = store.ensure_array("timestamps", (start,), (C,), "float64", fill_value=np.nan)
    digests = store.ensure_array("frame_digests", (start, DIGEST), (C, DIGEST), "uint8")

    arrays = [frames, pts_arr, times, digests]
    names = ["frames", "pts", "timestamps", "frame_digests"]

    def write(k: int, chunk: np.ndarray, chunk_digests, chunk_pts: list, chunk_times: list):
        lo, n = k * C, len(chunk)
        for arr in arrays:
            arr.resize((lo + n, *arr.shape[1:]))
        if kept:
            frames[lo : lo + n] = chunk
        else:  # recorded dropped before it counts as decoded: no byte of it written
            drop(store, "frames", k)
        pts_arr[lo : lo + n] = chunk_pts
        times[lo : lo + n] = chunk_times
        digests[lo : lo + n] = chunk_digests
        if not kept:  # its new length, durable with the chunks it counts
            fsync_path(store.path / "frames" / "zarr.json")
        store.commit(STAGE, k, names if kept else names[1:])
        if kept:  # (a drop recorded before a crash, now written after all)
            restored(store, "frames", k)

    return frames, write


def _decode_chunks(
    store: RunStore, video: Path, resume_chunk: int, write, quiet: bool, stop=None
) -> str | None:
    """Decode from chunk `resume_chunk` to the end, writing chunks behind; why it broke off.
    `stop` (a `threading.Event`; `Alongside`): once set, the decoding ends after the chunk
    being written (raising `Stopped`)."""
    C, S = store.chunk_size, store.image_size
    start = resume_chunk * C
    claimed = store.attrs["video"]["claimed_frames"]
    broke_off = None

    # Decoding stays in this thread; resizing (PIL releases the GIL) runs in a pool and
    # each finished chunk is compressed and written behind, so at most two chunks are held
    # (each frame's digest is taken in the pool too).
    k, batch, batch_pts, batch_times = resume_chunk, [], [], []
    with (
        log.progress("decode", claimed or None, quiet, initial=start) as bar,
        ThreadPoolExecutor(resize_workers()) as resizer,
        Behind("segpipe-decode-writes") as writer,
    ):

        def flush():
            nonlocal k, batch, batch_pts, batch_times
            try:
                done = [f.result() for f in batch]
            except Exception as e:  # noqa: BLE001 - sorted by is_damage below
                if not is_damage(e):
                    raise
                raise DecodeError(f"frame {k * C} onwards cannot be converted ({e})") from None
            chunk, digested = np.stack([f for f, _ in done]), np.stack([d for _, d in done])
            writer.submit(write, k, chunk, digested, batch_pts, batch_times)
            k, batch, batch_pts, batch_times = k + 1, [], [], []

        try:
            for pts, seconds, picture in source_from(store, video, start):
                if stop is not None and stop.is_set():
                    raise Stopped
                batch.append(resizer.submit(digested_input, picture, S))
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
    return broke_off


def _decoded_record(store: RunStore, video: Path, total: int, broke_off: str | None) -> dict:
    """What a complete decode records: its frame count and any truncation warning."""
    if total == 0:
        raise BadInput(f"video has no decodable frames: {video}")
    last_time = float(store.read("timestamps", total - 1, total)[0])
    return dict(
        frame_count=total,
        decode_warning=_truncation_note(total, last_time, store.attrs["video"], broke_off),
    )


def say_decoded(store: RunStore, record: dict, quiet: bool) -> None:
    """decode's result line (and its truncation warning)."""
    if record["decode_warning"]:
        log.warn(f"decode: {record['decode_warning']}")
    log.result(f"decode: {record['frame_count']} frames into {store.path}", quiet)


def _resume_from(store: RunStore, C: int) -> int:
    """The chunk an unfinished decode continues from: the first chunk not done, and never
    after a short chunk. A short chunk is the end of the video only together with the frame
    count (recorded after it), so without the count it is decoded again."""
    done = store.ledger(STAGE).done()
    first_undone = int(np.argmin(done)) if not done.all() else len(done)
    frames = store.array("frames")
    return min(first_undone, frames.shape[0] // C) if frames is not None else 0


class Redecoder:
    """Decodes chunks of a completely decoded store again (repair; chunks whose frames were
    dropped), reading on from one open decoder while the chunks asked for are consecutive."""

    def __init__(self, store: RunStore, video: Path):
        self.store, self.video = store, video
        self.S = store.image_size
        self.plan = store.plan
        self.reader = SourceReader(store, video)

    def frames(self, k: int) -> tuple[np.ndarray, list, list, np.ndarray]:
        """Chunk k's frames decoded again (resized side by side, as decode does), proven
        those first decoded by their digests, not written: (frames, pts, times, digests)."""
        lo, hi = self.plan.bounds(k)
        resized, pts, times = [], [], []
        with ThreadPoolExecutor(resize_workers()) as resizer:
            for p, seconds, picture in self.reader.frames(lo, hi - lo):
                resized.append(resizer.submit(digested_input, picture, self.S))
                pts.append(-1 if p is None else p)
                times.append(seconds)
            done = [f.result() for f in resized]
        frames, digests = np.stack([f for f, _ in done]), np.stack([d for _, d in done])
        self._same_as_first(k, digests)
        return frames, pts, times, digests

    def chunk(self, k: int, quiet: bool = True) -> None:
        """Decode chunk k again into the store (repair; a dropped chunk restored)."""
        lo, hi = self.plan.bounds(k)
        frames, pts, times, digests = self.frames(k)
        self.store.array("frames")[lo:hi] = frames
        self.store.array("pts")[lo:hi] = pts
        self.store.array("timestamps")[lo:hi] = times
        self.store.array("frame_digests")[lo:hi] = digests
        self.store.commit(STAGE, k, ["frames", "pts", "timestamps", "frame_digests"])
        restored(self.store, "frames", k)
        log.info(f"decode: chunk {k} (frames {lo}..{hi - 1}) decoded again", quiet)

    def _same_as_first(self, k: int, digests: np.ndarray) -> None:
        """Refuse frames that differ from those first decoded (by their stored digests):
        features and masks made from them would silently differ. (A damaged digest chunk
        is being repaired: nothing to compare with.)"""
        lo, hi = self.plan.bounds(k)
        try:
            stored = self.store.read("frame_digests", lo, hi)
        except DamagedStore:
            return
        differ = np.nonzero((stored != digests).any(axis=1))[0]
        if len(differ):
            raise BadInput(
                f"{self.video} decodes differently now: frame {lo + differ[0]} is not "
                f"the frame first decoded into the store (another decoder or "
                f"version?); its chunk cannot be restored exactly"
            )


def redecode_chunks(store: RunStore, video: Path, chunks: list[int], quiet: bool) -> None:
    """Decode again exactly these chunks of a completely decoded store (repair)."""
    redecoder = Redecoder(store, video)
    for k in chunks:
        redecoder.chunk(k, quiet)


def _truncation_note(
    total: int, last_time: float, video: dict, broke_off: str | None
) -> str | None:
    """Judged by time, as a player shows the video: frames are missing when the last decoded
    frame ends more than a frame and a half before the end the container records for the
    video stream (variable frame rates and edit lists included)."""
    if broke_off:
        return f"video is damaged or truncated: decoding stopped after {total} frames ({broke_off})"
    duration, fps = video.get("duration"), video.get("fps")
    if duration and fps and last_time == last_time:  # not NaN
        end = video["start_time"] + duration
        if end - (last_time + 1 / fps) > 1.5 / fps:
            return (
                f"video looks truncated: decoded {total} frames, up to {last_time:.3f} s of "
                f"the {end:.3f} s its container records"
            )
    return None
