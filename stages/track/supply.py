"""Features for the tracker, made when a pass reaches them.

A chunk whose features are not on disk (never encoded yet: `run` encodes just before the
tracker needs a chunk; or dropped: `--keep masks`) is encoded just before a pass tracks it,
its frames decoded again from the source first where they were dropped. The tracker gets
what was encoded from memory (`held`), never reading back what it was just handed: each
chunk encoded here is held until no pass still to run needs it, at most `HOLD` chunks
(beyond that the oldest on disk goes; a later read of it reads the store).

Every chunk encoded here is written (or recorded) and committed behind the tracking: a
writer thread does it while the pass tracks the chunk, one write in flight at most (handing
over the next chunk's waits for it); a failed write is raised at the next look at the
supply.
Under `--keep all` each chunk is written and committed as the encode stage does. A crash
costs the features not yet committed: a rerun of `run` encodes them again (its closing
encode); after `track` they are missing until a pass reads them or `segpipe encode` runs
(`status` shows encode unfinished).
Under `--keep masks` the chunks of the prompted frames are written (a pass encodes them all
before it applies the prompts, and the passes read them again), and a chunk that a pass
tracks only where another read of it is still to come: the others never reach the disk
(recorded encoded and dropped), so memory holds only the chunk in work beyond what is on
disk. A pass's commit of a chunk waits for the chunk's own encode commit (`tracked`: by then
the write has had the chunk's tracking to finish in), so no chunk is left tracked but not
encoded, which under `--keep masks` nothing would encode again. A chunk's frames go once it
is encoded, and its features once no pass still to run needs them (see
`segpipe.store.retention`).
"""

from __future__ import annotations

from segpipe import interrupt, log
from segpipe.behind import Behind
from segpipe.plan import ChunkPlan, Span
from segpipe.store.retention import drop, has, keep_setting, on_disk
from segpipe.store.runstore import RunStore

HOLD = 3  # chunks of features held in memory at most (the chunk in work, prompted ones)


class ChunkSupply:
    """Used as a context manager: leaving it waits for the write in flight (and raises its
    error, unless an error is already on its way)."""

    def __init__(
        self,
        store: RunStore,
        predictor,
        todo: dict,
        prompts: dict,
        batch_size: int = 1,
        bar=None,
    ):
        """`todo`: per unit still to run (a pass's group of objects), the chunks it will
        track; `prompts`: per unit, the chunks of its prompted frames, whose features it
        reads when it starts from the prompts (empty where it starts from a stored memory
        snapshot). `bar` (a progress bar) counts the frames encoded."""
        self.store, self.predictor, self.batch_size, self.bar = store, predictor, batch_size, bar
        self.keep = keep_setting(store)
        self.remaining = {u: set(chunks) for u, chunks in todo.items()}
        self.prompts = {u: set(prompts.get(u, ())) for u in todo}
        self.prompt_chunks = sorted(set().union(set(), *self.prompts.values()))
        from segpipe.stages.encode import FramesOnDisk  # torch: only once there is work

        self.frames_of = FramesOnDisk(store)
        self.held: dict = {}  # chunk -> its `Encoded` levels (on the device), encoded here
        self.writer = Behind("segpipe-features")
        self.writing: int | None = None  # the chunk whose write may be in flight

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        try:
            self.writer.__exit__(kind, error, tb)
        finally:
            self.frames_of.close()

    def written(self) -> None:
        """The write in flight committed; its error raised here."""
        self.writer.wait()
        self.writing = None

    def _written(self, k: int) -> None:
        """Chunk k's write committed, where it is the one in flight (not waiting for another
        chunk's: the one the pass has just encoded)."""
        if self.writing == k:
            self.written()

    def _write_behind(self, k: int, encoded, write: bool) -> None:
        from segpipe.stages.encode import write_features

        try:
            write_features(self.store, k, encoded, write)
        except interrupt.Interrupted:  # raised once the chunk is committed: the pass stops
            pass  # at its own next commit or look (the chunk it encoded meanwhile is kept)

    def _failed(self) -> None:
        """Raise the error of a write behind that has failed (disk full...), not waiting for
        one still in flight: the pass stops at once, not at the next chunk it encodes."""
        self.writer.failed()

    @staticmethod
    def missing(store: RunStore, todo: dict[str, list[int]], prompt_chunks=()) -> list[int]:
        """The chunks of `todo` (and `prompt_chunks`, read where a pass starts from the
        prompts) whose features are not on disk."""
        here = on_disk(store, "features")
        wanted = {k for chunks in todo.values() for k in chunks} | set(prompt_chunks)
        return sorted(k for k in wanted if k not in here)

    def ensure(self, k: int) -> None:
        """Chunk k's features held or on disk, encoded now if they are neither (its frames
        decoded again first where they were dropped)."""
        self._failed()
        if k in self.held or has(self.store, "features", k):
            return
        interrupt.check()  # a signal during the write behind: stop before encoding more
        from segpipe.stages.encode import chunk_levels

        encoded = chunk_levels(
            self.store, self.predictor, k, self.frames_of, self.batch_size, on_device=True
        )
        self.held[k] = encoded
        # (--keep masks: written only where it is read again; see the module's docstring)
        write = self.keep == "all" or k in self.prompt_chunks or self._reads(k) > 1
        self.writer.submit(self._write_behind, k, encoded, write)
        self.writing = k
        self._bound()
        if self.bar is not None:
            lo, hi = self.store.plan.bounds(k)
            self.bar.update(hi - lo)

    def _reads(self, k: int) -> int:
        """The reads of chunk k still to come: each pass that tracks it, each that applies
        prompts from it."""
        return sum(k in r for r in self.remaining.values()) + sum(
            k in p for p in self.prompts.values()
        )

    def _bound(self) -> None:
        """At most `HOLD` chunks held: the oldest of those on disk go (never one that only
        memory holds: the chunk in work, tracked once, or one whose write is in flight)."""
        for k in [k for k in self.held if has(self.store, "features", k)]:
            if len(self.held) <= HOLD:
                break
            del self.held[k]

    def ahead(self, k: int) -> None:
        """Chunk k will be asked for next: where it has to be encoded, its frames are got
        (read, or decoded again) behind the work at hand."""
        if not self.has(k):
            self.frames_of.ahead(k)

    def has(self, k: int) -> bool:
        """Whether chunk k's features are held or on disk (ready to read)."""
        return k in self.held or has(self.store, "features", k)

    def prompts_of(self, unit) -> list[int]:
        """The chunks of `unit`'s prompted frames (it reads them applying the prompts)."""
        return sorted(self.prompts[unit])

    def prompted(self, unit) -> None:
        """`unit` has applied the prompts (read their frames' features)."""
        chunks, self.prompts[unit] = self.prompts[unit], set()
        for k in chunks:
            self._drop_unneeded(k)

    def finished(self, unit) -> None:
        """`unit` has tracked all it had to."""
        left = self.remaining[unit] | self.prompts[unit]
        self.remaining[unit], self.prompts[unit] = set(), set()
        for k in left:
            self._drop_unneeded(k)

    def tracked(self, unit, k: int) -> None:
        """`unit` has tracked chunk k (its commit may still be on its way): the features
        held for it go from memory if no read of them is left. Under `--keep masks` the
        chunk's encode commit is waited for here, before the pass's commit of it."""
        if self.keep == "masks":
            self._written(k)
        self._failed()
        self.remaining[unit].discard(k)
        if not self._reads(k):
            self.held.pop(k, None)

    def committed(self, k: int) -> None:
        """A unit's chunk k is committed: under `--keep masks` its features go from the
        disk too if no read of them is left (not before the commit: a crash in between
        would cost the chunk's encoding again)."""
        self._drop_unneeded(k)

    def _drop_unneeded(self, k: int) -> None:
        if self._reads(k):
            return
        self.held.pop(k, None)
        if self.keep == "masks":
            self._written(k)  # (a write of chunk k in flight would land after a look now)
            if has(self.store, "features", k):
                drop(self.store, "features", k)


def prompt_reads(plan: ChunkPlan, span: Span, todo: dict, frames) -> tuple[dict, list[int]]:
    """(per pass of `todo`, whether it starts from the prompts: its first chunk is still to
    do; the chunks of the prompted `frames`, which such a pass reads, none if no pass does)."""
    starts = {d: bool(todo[d]) and todo[d][0] == span.chunks(plan, d)[0] for d in todo}
    chunks = sorted({plan.chunk_of(f) for f in frames}) if any(starts.values()) else []
    return starts, chunks


def pass_todo(store: RunStore, plan: ChunkPlan, pending: list[str], span: Span) -> dict:
    return {d: store.pass_ledger(d).todo(span.chunks(plan, d)) for d in pending}


def say_cost(store: RunStore, plan: ChunkPlan, chunks: list[int], quiet: bool) -> None:
    if not chunks:
        return
    frames = sum(hi - lo for lo, hi in map(plan.bounds, chunks))
    alongside = store.alongside  # (its frames on disk once committed, where it keeps them)
    decoded = set(chunks) if alongside is not None and alongside.kept else on_disk(store, "frames")
    redecode = [k for k in chunks if k not in decoded]
    again = (
        f", {len(redecode)} of them decoded again from {store.attrs['source']['path']}"
        if redecode
        else ""
    )
    log.info(
        f"track: {log.count(len(chunks), 'chunk')} ({frames} frames) "
        f"{'has' if len(chunks) == 1 else 'have'} no features on disk: "
        f"encoding them as the passes reach them{again}",
        quiet,
    )
