"""One tracking pass over the chunks, whatever steps the model: the chunks left to do, each
started from the memory of the chunk before it, its features loaded (the next read ahead),
and its results written and committed behind the tracking. A tracker (`tracker.Tracker`:
SAM 2's predictor; `session.SessionTracker`: a transformers session) brings how the memory
is restored and how a chunk is tracked."""

from __future__ import annotations

import numpy as np

from segpipe import log
from segpipe.behind import Behind
from segpipe.stages.track.groups import object_todo
from segpipe.store.layout import TRACK_ARRAYS
from segpipe.store.masks import write_packed


class Pass:
    """The loop of a pass (forward or reverse) of one group of objects (`slots`). A subclass
    sets `store`, `plan`, `direction`, `slots`, `span`, `supply`, `unit`, `features`,
    `memstore` and `on_commit`, and provides `restore(before)` (the memory after chunk
    `before`, None: the pass's start) and `track_chunk(k, restored, owned, bar)`."""

    def chunks(self) -> list[int]:
        return self.span.chunks(self.plan, self.direction)

    def run(self, owned, quiet: bool) -> None:
        """Track every chunk of the pass not yet done; write masks for the frames
        `owned(frame)` gives to this pass. Chunks left to do need not be contiguous (a
        repair): each starts from the memory snapshot of the chunk before it."""
        chunks = self.chunks()
        todo = object_todo(self.store, self.direction, self.slots, chunks)
        previous = dict(zip(chunks[1:], chunks))  # the chunk the pass visits before each
        self.after = dict(zip(todo, todo[1:]))  # the chunk to read ahead while one is tracked
        total = sum(self.span.count_in(self.direction, *self.plan.bounds(k)) for k in todo)
        restored = after = None
        # each chunk's writes, commit and `on_commit` (exports) run behind, while the next
        # chunk is tracked: one in flight at most (`segpipe.behind`)
        with (
            log.progress(f"track {self.direction}", total, quiet) as bar,
            Behind("segpipe-track-writes") as self.writer,
        ):
            for k in todo:
                self.supply.ensure(k)
                before = previous.get(k)
                if restored is None or after != before:
                    self.writer.wait()  # a restore reads the snapshot written behind
                    restored = self.restore(before)
                self.track_chunk(k, restored, owned, bar)
                after = k
        self.supply.finished(self.unit)

    def load_features(self, k: int, lo: int, hi: int) -> None:
        """Load chunk k's features; read the next chunk's ahead if they are ready, else
        get its frames ahead, to encode."""
        self.features.load(lo, hi)
        if k not in self.after:
            return
        if self.supply.has(self.after[k]):
            self.features.read_ahead(*self.plan.bounds(self.after[k]))
        else:
            self.supply.ahead(self.after[k])

    def write(self, k, lo, packed, scores, areas, mine, snapshot) -> None:
        """Write the chunk's results (masks from `packed`, unpacked one zarr chunk, so one
        object, at a time; scores; areas, each mask's pixel count) and its memory
        `snapshot`, commit it, and hand it to `on_commit` (behind the tracking: `run`)."""
        idx = np.nonzero(mine)[0]
        if len(idx):
            a, b = lo + idx[0], lo + idx[-1] + 1  # owned frames are contiguous
            s0, s1 = self.slots[0], self.slots[-1] + 1  # the group's zarr chunks alone
            write_packed(self.store, a, b, packed[idx[0] : idx[-1] + 1], s0)
            # areas before scores: a reader of scores, then areas (the studio's flags), never
            # sees a frame's new score beside its area not yet written
            self.store.array("object_areas")[a:b, s0:s1] = areas[idx[0] : idx[-1] + 1]
            self.store.array("object_scores")[a:b, s0:s1] = scores[idx[0] : idx[-1] + 1]
            self.store.array("tracked")[a:b, s0:s1] = True
        written = self.memstore.write_snapshot(k, snapshot)
        self.store.commit_objects(self.direction, k, self.slots, list(TRACK_ARRAYS), written)
        if self.on_commit is not None:
            self.on_commit(self.direction, k)
