"""Decoding alongside the tracking (`segpipe run`): the passes start once their first chunk
is decoded, not once the whole video is.

Tracking needs the frame count before it starts (the chunk plan, the arrays, where the
forward pass ends). A source that claims its count before decoding (a folder's or TIFF's
frames, exactly; the count a video's container records) is decoded on a thread of its own
while the run tracks to that count: a chunk's frames are read only once decode has
committed them (`Alongside.wait`, which the tracker's frame reader asks), so the frames
tracked are those decoded, and a crash costs what it costs either way (each side commits
its own chunks; a rerun resumes both). `start` makes the store and checks what decode
checks; the thread starts at `begin`, once the run has checked the prompts' frames and
the model, so a run refused there leaves the store as it was (a refusal later, by the
tracking's own checks, can leave chunks decoded, as a decode before it always did). The
thread records the frame count (decode is complete only with it) where it is the count
claimed; another count is recorded by `finish`, once the tracking to the claim has
stopped, and only after what was made for the claim (features on, `reset_from`) is
gone: a store whose frame count is recorded holds nothing made for another.

A claim can be wrong (an edit list cuts frames the container still counts; a truncated
file). A chunk that decodes to another length than the claim gives it, or a chunk past
the video's end, stops the tracking (`CountChanged`); a video that decodes past its claim
shows at `finish`. The run then tracks again on the count decoded (`track --force`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from segpipe import log
from segpipe.plan import ChunkPlan
from segpipe.settings import Decoding
from segpipe.sources.registry import named, probe
from segpipe.stages.decode import Stopped, decode_rest, open_or_create_store, say_decoded
from segpipe.store.layout import reset_from
from segpipe.store.lock import holds_store_lock
from segpipe.store.runstore import ALONGSIDE, RunStore


class CountChanged(Exception):
    """The source decodes to another frame count than the one the tracking worked to."""


class Alongside:
    """A decode on its own thread (`start`); `count`: the frame count the tracking works to;
    `kept`: whether the frames are written (else counted, timed and digested only: `run
    --keep masks`). Registered in `ALONGSIDE` from `register` to `close`, so every
    `RunStore` of the store in this process sees it (`RunStore.alongside`, `.frame_count`);
    decoding from `begin`."""

    def __init__(
        self,
        store_path: Path,
        video: Path,
        count: int,
        kept: bool,
        chunk_size: int,
        quiet: bool,
        claimant: str = "the source counts",
    ):
        self.path, self.video, self.count, self.kept = Path(store_path), Path(video), count, kept
        self.quiet = quiet
        self.claimed = count
        self.claimant = claimant  # who claims the count: "the container records", ...
        self.plan = ChunkPlan(count, chunk_size)
        self.ready = threading.Condition()
        self.next: int | None = None  # the first chunk not committed yet (None: not started)
        self.sizes: dict[int, int] = {}  # the frames of each chunk this thread committed
        self.ended, self.error = False, None
        self.record = None  # what decode records once complete (`decode_rest`)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._decode, name="segpipe-decode", daemon=True)
        self.key = os.path.realpath(self.path)

    def register(self) -> "Alongside":
        ALONGSIDE[self.key] = self
        return self

    def begin(self) -> None:
        """Start decoding."""
        self.thread.start()

    def _decode(self) -> None:
        try:
            store = RunStore.open(self.path)
            self.record = decode_rest(
                store,
                self.video,
                self.kept,
                self.quiet,
                resumed=lambda k: self._committed(k, None),
                committed=lambda k, n: self._committed(k + 1, (k, n)),
                stop=self.stop,
            )
            if self.record["frame_count"] == self.count:  # (another: by `finish`)
                store.set_attrs(**self.record)
            say_decoded(store, self.record, self.quiet)
        except BaseException as e:  # noqa: BLE001 - the tracking's to raise (`wait`, `finish`)
            self.error = e
        finally:
            with self.ready:
                self.ended = True
                self.ready.notify_all()

    def _committed(self, next_chunk: int, sized) -> None:
        with self.ready:
            self.next = next_chunk
            if sized is not None:
                self.sizes[sized[0]] = sized[1]
            self.ready.notify_all()

    def wait(self, k: int) -> None:
        """Return once chunk k is committed (decode's error raised here); `CountChanged` where
        it decoded to another length than the count worked to gives it, or not at all."""
        lo, hi = self.plan.bounds(k)
        with self.ready:
            self.ready.wait_for(lambda: self.ended or (self.next is not None and k < self.next))
            if self.error is not None and not isinstance(self.error, Stopped):
                raise self.error
            if self.next is None or k >= self.next:
                raise CountChanged(f"the video ends before frame {lo}")
            size = self.sizes.get(k, self.plan.chunk_size)  # (committed before: a whole chunk)
            if size != hi - lo:
                raise CountChanged(f"chunk {k} decodes to {size} frames, not {hi - lo}")

    def finish(self) -> int:
        """Wait for the decode to end, record its frame count (decode is complete then), and
        return it: the count worked to from then on (`claimed` keeps the first)."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        store = RunStore.open(self.path)
        if "frame_count" not in store.attrs:
            if self.record["frame_count"] != self.claimed:  # made for the claim: started over
                reset_from(store, "encode")
            store.set_attrs(**self.record)
        self.count = store.attrs["frame_count"]
        self.plan = ChunkPlan(self.count, self.plan.chunk_size)
        return self.count

    def close(self) -> None:
        """Stop the decode (after the chunk it is writing) and wait for it; unregistered."""
        self.stop.set()
        try:
            if self.thread.ident is not None:
                self.thread.join()
        finally:
            ALONGSIDE.pop(self.key, None)


@holds_store_lock
def start(
    video: Path,
    store_path: Path,
    decoding: Decoding,
    *,
    force: bool,
    space,
    write_frames,
    quiet: bool,
) -> Alongside | None:
    """decode's checks and store (as `stages.decode.decode`), then, where frames are left to
    decode and the source claims its count before decoding, the decode to run alongside,
    registered, to `begin` (`write_frames(store)`: as decode's). None: nothing left to
    decode, or no count claimed (decode the source first)."""
    store = open_or_create_store(Path(video), Path(store_path), decoding, force, space)
    if "frame_count" in store.attrs:
        return None
    video_attrs = store.attrs["video"]
    kind = named(video_attrs.get("kind") or "video")
    count = (
        video_attrs["claimed_frames"]
        if kind.counted
        else probe(Path(video), video_attrs["stream"], None, kind.name).container_frames
    )
    if not count:
        return None
    kept = write_frames is None or write_frames(store)
    claimant = "the source counts" if kind.counted else "the container records"
    C = store.chunk_size
    alongside = Alongside(store_path, video, count, kept, C, quiet, claimant)
    log.info(f"decode: alongside the tracking ({count} frames, as {claimant})", quiet)
    return alongside.register()
