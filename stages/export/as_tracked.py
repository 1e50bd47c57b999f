"""Exports that follow the tracking: chunk k is exported as soon as every pass that visits
it has committed it and the video is decoded (`run` and the dataset command), the rest at
the finish."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from segpipe import log
from segpipe.plan import Span, passes
from segpipe.stages.export.stage import Export
from segpipe.stages.export.writers import remove_parts
from segpipe.store.runstore import RunStore
from segpipe.store.tracking import stored_track

if TYPE_CHECKING:
    from segpipe.stages.executor import Executor


class ExportsAsTracked:
    """Exports made chunk by chunk while the tracking runs (`track`'s `on_commit`): a chunk
    is exported once every pass that visits it has committed it, so results appear as the
    run goes and a crash costs at most the chunk in flight. `finish` exports what is left
    (chunks no pass visits; a chunk tracked just before a crash) and records each export
    complete. `requests`: each export's `Export` arguments (format, out, ...). With
    `cluster` (`segpipe.dask.client`), each chunk is exported by a Dask task (`segpipe.dask.tasks`)."""

    def __init__(self, store_path, requests: list[dict], cluster: Executor | None = None):
        self.store_path, self.requests, self.cluster = Path(store_path), requests, cluster
        self.jobs = self.visited = None
        self.ready: list[int] = []  # chunks every pass has committed, to export once decoded
        self.worked = False  # a chunk tracked or exported while this ran

    def _passes(self) -> None:
        """The chunks each pass visits, and those it has committed."""
        if self.visited is None:
            store = RunStore.open(self.store_path)
            track = stored_track(store)
            plan = store.plan
            self.visited = {
                d: set(Span.of(track, plan.num_frames).chunks(plan, d))
                for d in passes(track["direction"])
            }
            self.committed_chunks = {
                d: set(np.nonzero(store.pass_ledger(d).done())[0].tolist()) for d in self.visited
            }

    def open(self) -> list[Export]:
        """The exports; made once the video is decoded (`decoded`): a writer reads what
        decode records for the whole video (the overlay's frame times)."""
        if self.jobs is None:
            store = RunStore.open(self.store_path)
            self.jobs = [Export(store, tracking=True, **r) for r in self.requests]
        return self.jobs

    def decoded(self) -> bool:
        """Whether decode has recorded the frame count (complete); not while the video
        decodes alongside the tracking (`stages.alongside`)."""
        return RunStore.open(self.store_path).attrs.get("frame_count") is not None

    def committed(self, direction: str, k: int) -> None:
        self.worked = True
        self._passes()
        self.committed_chunks[direction].add(k)
        if all(k in self.committed_chunks[d] for d, chunks in self.visited.items() if k in chunks):
            self.ready.append(k)
        if self.ready and (self.jobs is not None or self.decoded()):
            jobs, ready, self.ready = self.open(), self.ready, []
            for k in ready:
                for n, job in enumerate(jobs):
                    if k in job.chunks and k in job.todo():
                        if self.cluster is None:
                            job.chunk(k)
                        else:
                            self.cluster.export(job, self.requests[n], k)

    def finish(self, quiet: bool) -> list[Path]:
        if self.cluster is not None:  # what is left goes to the workers; the finish is here
            self.cluster.export_rest(self.open(), self.requests, quiet)
        for job in self.open():
            if job.complete:  # what a kill between its record and the parts' removal left
                remove_parts(job.out)
            else:
                self.worked = True
                job.run(quiet)
                log.result(f"export {job.fmt}: {job.out}", quiet)
        return [job.out for job in self.jobs]
