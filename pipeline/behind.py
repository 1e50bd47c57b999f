"""Work done behind the critical path: one thread, one item in flight at most.

A stage hands its chunk's writes and commit to `Behind` and goes on with the next chunk;
handing over the next waits for the one before (and raises its error). So at most two
chunks' results are held (the one being written, the one being made), a chunk counts as
done only once its own commit ran (the ledger record is written last, there), and a crash
or kill at any moment loses at most the chunks not yet committed, which a rerun redoes.

`then`, given with an item, runs on the thread that handed it over once the item has
finished: bookkeeping that is not thread-safe (what the stage may now let go of) stays on
that thread.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


class Behind:
    """Used as a context manager: leaving it waits for the item in flight (and raises its
    error, unless an error is already on its way)."""

    def __init__(self, name: str):
        self.pool = ThreadPoolExecutor(1, name)
        self.flight: Future | None = None
        self.then = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        try:
            if kind is None:
                self.wait()
        finally:
            self.pool.shutdown()  # waits for an item in flight; the error at hand goes on

    def submit(self, work, *args, then=None) -> None:
        """Wait for the item in flight (its error raised here), then start `work(*args)`."""
        self.wait()
        self.flight, self.then = self.pool.submit(work, *args), then

    def wait(self) -> None:
        """The item in flight finished, its error raised here, its `then` run."""
        flight, then = self.flight, self.then
        self.flight = self.then = None
        if flight is not None:
            flight.result()
            if then is not None:
                then()

    def failed(self) -> None:
        """Raise the error of an item that has failed (disk full...) without waiting for
        one still running: the stage stops at once, not at its next hand-over."""
        if self.flight is not None and self.flight.done():
            self.wait()
