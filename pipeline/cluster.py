"""Dask distributed for `--workers N` and `--scheduler ADDRESS`: the client side.

Without either, nothing here runs and Dask is never imported. With `--workers N`, a
`LocalCluster` of N worker processes of one thread each; with `--scheduler`, the workers
already attached to that scheduler. Before any work is sent, every worker proves that it
sees the store (the lock file this process holds, with its token: `lock.check_lease`) and
the other paths the work reads, on the same device type: a cluster whose workers do not
share the client's file system is refused in one line.

The client sends units of work (`segpipe.units`) and waits for them here, watching the
futures; a `SegpipeError` raised in a task reaches the caller as itself (the CLI prints its
one line), a worker that dies mid-task has its task run again elsewhere (Dask's own retry).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

from . import interrupt, log
from .errors import BadInput, SegpipeError

POLL = 0.25  # seconds between looks at the futures (and, while tracking, at the ledgers)


@contextmanager
def connect(workers: int | None = None, scheduler: str | None = None, device: str = "auto",
            quiet: bool = False, store=None, paths=()):
    """A `Cluster` for the command, or None without `workers` and `scheduler`. With `store`,
    this process holds the store's lock for as long (taken here, or already held), and the
    workers write under it."""
    if workers is None and scheduler is None:
        yield None
        return
    if workers is not None and scheduler is not None:
        raise BadInput("give --workers or --scheduler, not both")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise BadInput(f"--workers must be a positive integer, got {workers!r}")
    if importlib.util.find_spec("distributed") is None:
        raise BadInput("--workers and --scheduler need Dask: pip install 'segpipe[dask]'")
    if store is not None:
        from .retention import keep_setting
        from .store import RunStore
        if RunStore.exists(store) and keep_setting(RunStore.open(store, read_only=True)) == "masks":
            raise BadInput(f"store {store} keeps only masks (--keep masks), which runs in one "
                           f"process: run it without --workers or --scheduler")
    with ExitStack() as stack:
        if store is not None:
            from .lock import store_lock
            stack.enter_context(store_lock(store))
        client = stack.enter_context(_client(workers, scheduler))
        cluster = Cluster(client, worker_threads())
        cluster.check(device, store, paths)
        log.info(f"dask: {cluster.size} workers ({cluster.device}); "
                 f"dashboard {_dashboard(client, workers)}", quiet)
        yield cluster


def worker_threads() -> int:
    """Torch threads per worker, always sent: the client's OMP_NUM_THREADS where it is set,
    else the client's `torch.get_num_threads()`, the count a single-process run here would
    use. Results are bit for bit that run's only at its thread count (CPU results change
    in the last bits with it), and a worker left to its own would pick one from its
    machine and from Dask (which sets OMP_NUM_THREADS=1 in the workers it starts). On a
    local cluster, OMP_NUM_THREADS=cores//N keeps N workers from oversubscribing."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    import torch
    return torch.get_num_threads()


def absolute(checkpoint: str | None) -> str | None:
    """A checkpoint path as the workers must get it: absolute (theirs is not the client's
    working directory); an hf: name as it is."""
    if checkpoint is None or str(checkpoint).startswith("hf:"):
        return checkpoint
    return str(Path(checkpoint).resolve())


@contextmanager
def _client(workers: int | None, scheduler: str | None):
    from distributed import Client, LocalCluster
    logging.getLogger("distributed").setLevel(logging.ERROR)  # failures come back as errors
    if workers is not None:
        import dask
        # Dask's port where the dashboard can be served (bokeh), else any free one (its
        # HTTP server still runs: health and metrics)
        dashboard = ":8787" if importlib.util.find_spec("bokeh") else ":0"
        # Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536: glibc then gives
        # back and faults in again the image encoder's buffers, a chunk encoded 40% slower
        # (3.75 s against 2.66 s for 16 frames at 256 here); segpipe's workers go without it
        environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
                   if k != "MALLOC_TRIM_THRESHOLD_"}
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), \
                LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                             silence_logs=logging.ERROR, dashboard_address=dashboard) as local, \
                Client(local) as client:
            yield client
        return
    try:
        client = Client(scheduler)  # within Dask's connect timeout (its config: 30 s)
    except (OSError, TimeoutError, ValueError) as e:
        raise BadInput(f"cannot reach the Dask scheduler at {scheduler}: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=60)
        except TimeoutError:
            raise BadInput(f"the Dask scheduler at {scheduler} has no workers") from None
        yield client


def _dashboard(client, workers: int | None) -> str:
    if workers is not None and importlib.util.find_spec("bokeh") is None:
        return "off (pip install bokeh for Dask's dashboard)"
    return client.dashboard_link  # a scheduler's own: served where it has bokeh


class Cluster:
    """The client, and the futures it waits for."""

    def __init__(self, client, threads: int):
        self.client, self.threads = client, threads
        self.device = None  # the workers' device type (checked alike on every worker)
        self.size = 0
        self.background = []  # futures nobody waits for yet (exports sent while tracking)

    def check(self, device: str, store=None, paths=()) -> None:
        """Every worker runs one task at a time, sees `store` (and holds no stale view of its
        lock) and `paths`, and picks one device type for `device`; else refuse, naming the
        first problem."""
        from .lock import token
        from .units import look_around
        lease = (str(Path(store).resolve()), token(store)) if store is not None else None
        # what the client sees (what it does not is the stages' to report, as without Dask)
        wanted = [str(Path(p).resolve()) for p in paths
                  if p is not None and not str(p).startswith("hf:") and Path(p).exists()]
        seen = self.client.run(look_around, wanted, lease, device)
        for worker, (problem, _) in sorted(seen.items()):
            if problem:
                raise BadInput(f"Dask worker {worker}: {problem}")
        devices = {kind for _, kind in seen.values()}
        if len(devices) > 1:
            raise BadInput(f"the Dask workers run on different devices ({', '.join(sorted(devices))}): "
                           f"give --device, or use workers alike")
        self.device, self.size = devices.pop(), len(seen)

    def work(self, store, checkpoint: str | None, device: str, batch_size: int = 1):
        """The settings every task on `store` carries (`units.Work`)."""
        from .lock import token
        from .units import Work
        return Work(token(store), absolute(checkpoint), device, batch_size, self.threads)

    def submit(self, fn, *args, key: str):
        import uuid
        return self.client.submit(fn, *args, key=f"{key}-{uuid.uuid4().hex}", pure=False)

    def wait(self, futures, poll=None, each=None) -> None:
        """Until every future in `futures` (a collection `poll` may add to) is done, calling
        `each(value)` as each one finishes and `poll()` every `POLL` seconds; a task's error
        is raised here, and the rest of the work is cancelled. A signal stops the wait."""
        from distributed import wait
        reaped = set()
        while True:
            for future in [f for f in list(futures) + self.background if f.done()]:
                if future.key not in reaped:
                    reaped.add(future.key)
                    value = self.result(future)
                    if each is not None and future in futures:
                        each(value)
            self.background = [f for f in self.background if f.key not in reaped]
            if poll is not None:
                poll()
            interrupt.check()
            pending = [f for f in list(futures) if f.key not in reaped]
            if not pending:
                return
            try:
                wait(pending, timeout=POLL, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass

    def result(self, future):
        """The task's value, or its error: a segpipe error as itself (its one line), and
        Dask's own failures as one line too."""
        from distributed import KilledWorker
        from distributed.client import FutureCancelledError
        try:
            return future.result()
        except BaseException as e:
            self.client.cancel(list(self.background))
            if isinstance(e, KilledWorker):
                raise SegpipeError(f"Dask workers died running {e.task} (each time it was "
                                   f"tried); see the workers' logs") from None
            if isinstance(e, FutureCancelledError):
                raise SegpipeError("the Dask scheduler dropped the work (it restarted, or lost "
                                   "its workers); run the same command again") from None
            raise
