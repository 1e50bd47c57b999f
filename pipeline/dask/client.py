"""Dask distributed for `--workers N` and `--scheduler ADDRESS`: the client side.

Without either, nothing here runs and Dask is never imported. With `--workers N`, a
`LocalCluster` of N worker processes of one thread each; with `--scheduler`, the workers
already attached to that scheduler. Before any work is sent, every worker proves that it
sees the store (the lock file this process holds, with its token: `store.lock.check_lease`) and
the other paths the work reads, on the same device type: a cluster whose workers do not
share the client's file system is refused in one line.

`Cluster` sends the units of work (`segpipe.dask.tasks`: encode chunks, tracking passes,
export chunks, dataset videos) and waits for them, watching the futures; a `SegpipeError` raised in a task reaches the caller as itself (the CLI prints its
one line), a worker that dies mid-task has its task run again elsewhere (Dask's own retry).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

from segpipe import interrupt, log
from segpipe.dask.tasks import Work, encode_task, export_task, pass_task, video_task
from segpipe.errors import BadInput, SegpipeError
from segpipe.fsutil import resolved
from segpipe.models.registry import family_of
from segpipe.plan import Span, passes
from segpipe.settings import Execution
from segpipe.store.retention import keep_setting, refuse_on_dask

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
POLL = 0.25  # seconds between looks at the futures (and, while tracking, at the ledgers)


@contextmanager
def connect(execution: Execution, store=None, paths=()):
    """A `Cluster` for the command, or None where `execution` (checked by the caller:
    `Execution.check`) names no `workers` and no `scheduler`. With `store`, this process holds the store's lock for as long
    (taken here, or already held), and the workers write under it. Workers that compute in
    different environments are refused (`Cluster.check_bits`), unless
    `execution.allow_env_change`."""
    if not execution.on_dask:
        yield None
        return
    workers, scheduler, device = execution.workers, execution.scheduler, execution.device
    if importlib.util.find_spec("distributed") is None:
        raise BadInput("--workers and --scheduler need Dask: pip install 'segpipe[dask]'")
    if store is not None:
        from segpipe.store.runstore import RunStore

        if RunStore.exists(store):
            refuse_on_dask(keep_setting(RunStore.open(store, read_only=True)), store)
    with ExitStack() as stack:
        if store is not None:
            from segpipe.store.lock import store_lock

            stack.enter_context(store_lock(store))
        own = worker_threads()  # before a local cluster's nanny touches os.environ
        # N workers on these cores: their share each
        threads = own if workers is None else max(1, own // workers)
        client = stack.enter_context(_client(workers, scheduler, threads))
        cluster = Cluster(client, threads, local=workers is not None, own=own)
        cluster.check(device, store, paths)
        cluster.check_bits(execution.allow_env_change)
        each = f", {log.count(threads, 'torch thread')} each" if cluster.device == "cpu" else ""
        log.info(
            f"dask: {cluster.size} workers ({cluster.device}{each}); "
            f"dashboard {_dashboard(client, workers)}",
            execution.quiet,
        )
        yield cluster


def worker_threads() -> int:
    """The client's torch threads: its OMP_NUM_THREADS where it is set, else its
    `torch.get_num_threads()`, the count a single-process run here would use. Workers of a
    scheduler (`--scheduler`) run at it, so their bits are that run's (CPU results change
    in the last bits with the thread count, and a worker left to its own would pick one
    from its machine and from Dask, which sets OMP_NUM_THREADS=1 in the workers it
    starts). The N workers of `--workers N` share this machine's cores: each runs at this
    count // N (at least 1), started with it as OMP_NUM_THREADS, so their bits are those
    of a single process started with that OMP_NUM_THREADS."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    import torch

    return torch.get_num_threads()


def _said(environ: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in environ.items() if v is not None) or "none set"


def _thread_environment() -> str:
    said = ", ".join(f"{k}={os.environ[k]}" for k in THREAD_VARIABLES if k in os.environ)
    return said or "none set"


def absolute(checkpoint: str | None) -> str | None:
    """A checkpoint path as the workers must get it: absolute (theirs is not the client's
    working directory); an hf: name as it is."""
    if checkpoint is None or str(checkpoint).startswith("hf:"):
        return checkpoint
    return str(resolved(checkpoint))


@contextmanager
def _client(workers: int | None, scheduler: str | None, threads: int = 1):
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)  # failures come back as errors
    if workers is not None:
        import dask

        _quiet_resource_tracker()
        # Dask's port where the dashboard can be served (bokeh), else any free one (its
        # HTTP server still runs: health and metrics)
        dashboard = ":8787" if importlib.util.find_spec("bokeh") else ":0"
        # Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536: glibc then gives
        # back and faults in again the image encoder's buffers, a chunk encoded 40% slower
        # (3.75 s against 2.66 s for 16 frames at 256 here); segpipe's workers go without it.
        # And with OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's): the nanny also writes those
        # into this process's os.environ, so the client's thread count read after it was 1
        # where a single-process run uses the cores. The workers start with their share of
        # the cores in all three (`worker_threads`), which the client reads before: in the
        # nanny's settings, and in this process's environment while the cluster runs (the
        # nanny takes a variable set here over its settings), put back after.
        environ = {
            k: v
            for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
            if k != "MALLOC_TRIM_THRESHOLD_"
        }
        share = {k: str(threads) for k in THREAD_VARIABLES}
        environ.update(share)
        with ExitStack() as stack:
            stack.enter_context(_environment(share))
            stack.enter_context(dask.config.set({"distributed.nanny.pre-spawn-environ": environ}))
            with _sigint_ignored():  # inherited by the workers: see there
                local = stack.enter_context(
                    LocalCluster(
                        n_workers=workers,
                        threads_per_worker=1,
                        processes=True,
                        # its workers print nothing: a task's failure comes back to the
                        # client, and a worker whose client was killed logs, on the way
                        # out, a traceback per failed heartbeat on the user's terminal
                        silence_logs=logging.CRITICAL,
                        dashboard_address=dashboard,
                    )
                )
            yield stack.enter_context(Client(local))
        return
    try:
        client = Client(scheduler)  # within Dask's connect timeout (its config: 30 s)
    except (OSError, TimeoutError, ValueError) as e:
        raise BadInput(
            f"cannot reach the Dask scheduler at {scheduler}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    with client:
        try:
            client.wait_for_workers(1, timeout=60)
        except TimeoutError:
            raise BadInput(f"the Dask scheduler at {scheduler} has no workers") from None
        yield client


@contextmanager
def _environment(values: dict):
    """`values` in os.environ for the block; the variables as they were after it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _sigint_ignored():
    """SIGINT ignored while the local workers start, so they inherit it ignored (Python keeps
    an ignored SIGINT so): a Ctrl-C at a terminal reaches the whole process group, and the
    workers would each print a KeyboardInterrupt traceback. The client alone handles it
    (`segpipe.interrupt`: the chunks in flight finish) and then shuts the workers down."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (a process started with the local cluster's first
    semaphore, with this interpreter's -W options) warns, after a kill -9 or a Ctrl-C of
    the command, that it cleans up "leaked semaphore objects": it does clean them up, and
    the user sees noise after a clean exit. Its warnings are ignored; must run before the
    tracker starts."""
    import sys

    option = "ignore::UserWarning:multiprocessing.resource_tracker"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)


def _dashboard(client, workers: int | None) -> str:
    if workers is not None and importlib.util.find_spec("bokeh") is None:
        return "off (pip install bokeh for Dask's dashboard)"
    return client.dashboard_link  # a scheduler's own: served where it has bokeh


class Cluster:
    """The client, and the futures it waits for: the stages' `stages.executor.Executor` on
    Dask's workers."""

    def __init__(self, client, threads: int, local: bool = False, own: int | None = None):
        self.client, self.threads, self.local = client, threads, local
        self.own = threads if own is None else own  # this process's count, as started
        self.device = None  # the workers' device type (checked alike on every worker)
        self.environments = []  # the workers' compute environments, distinct (`check_bits`)
        self.size = 0
        self.background = []  # futures nobody waits for yet (exports sent while tracking)

    def check(self, device: str, store=None, paths=()) -> None:
        """Every worker runs one task at a time, sees `store` (and holds no stale view of its
        lock) and `paths`, and picks one device type for `device`; else refuse, naming the
        first problem."""
        from segpipe.dask.tasks import look_around
        from segpipe.store.lock import token

        lease = (str(resolved(store)), token(store)) if store is not None else None
        # what the client sees (what it does not is the stages' to report, as without Dask)
        wanted = [
            str(resolved(p))
            for p in paths
            if p is not None and not str(p).startswith("hf:") and Path(p).exists()
        ]
        seen = self.client.run(look_around, wanted, lease, device)
        for worker, (problem, _) in sorted(seen.items()):
            if problem:
                raise BadInput(f"Dask worker {worker}: {problem}")
        devices = {kind for _, kind in seen.values()}
        if len(devices) > 1:
            raise BadInput(
                f"the Dask workers run on different devices ({', '.join(sorted(devices))}): "
                f"give --device, or use workers alike"
            )
        self.device, self.size = devices.pop(), len(seen)
        self.workers = sorted(seen)

    def check_bits(self, allow_env_change: bool = False) -> None:
        """Every worker computes in one environment (`environment.current`: device, library
        versions, on CPU the thread count and ISA level), its `environments` (else refuse in
        one line, or with `allow_env_change` warn and keep each). On CPU workers: each computes SAM 2's
        image encoder as this process does (`model.thread_probe`, run as a task at the
        client's thread count), else refuse in one line: its masks would not be those of
        the single-process run. The workers of a local cluster run at their share of the
        cores, in processes started with it (`worker_threads`), which this process was not:
        there they must agree with each other."""
        import uuid

        import torch

        from segpipe.dask.tasks import probe_task
        from segpipe.environment import differences
        from segpipe.model import thread_probe

        mine = None
        if self.device == "cpu" and (not self.local or self.threads == self.own):
            before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                mine = thread_probe()
            finally:
                torch.set_num_threads(before)
        workers = self.workers
        futures = [
            self.client.submit(
                probe_task,
                self.threads,
                self.device,
                workers=[w],
                allow_other_workers=False,
                pure=False,
                key=f"probe-{n}-{uuid.uuid4().hex}",
            )
            for n, w in enumerate(workers)
        ]
        for worker, (digest, environ, env) in zip(workers, self.client.gather(futures)):
            if self.device == "cpu":
                self._check_digest(worker, digest, environ, mine)
                mine = digest if mine is None else mine  # a local cluster's first worker
            if not self.environments:
                self.environments.append(env)
                first = worker
            elif env not in self.environments:
                self.environments.append(env)
            changed = differences(self.environments[0], env, (f"on {first}", f"on {worker}"))
            if changed and not allow_env_change:
                raise BadInput(
                    f"the Dask workers compute in different environments ({'; '.join(changed)}): "
                    f"use workers alike, or pass --allow-env-change"
                )
            if changed:
                log.warn(
                    f"the Dask workers compute in different environments ({'; '.join(changed)}): "
                    f"going on as --allow-env-change asks; the results are no longer "
                    f"bit-identical to an uninterrupted run"
                )

    def _check_digest(self, worker, digest: str, environ: dict, mine: str | None) -> None:
        """Refuse a CPU worker whose probe digest is not `mine` (None: the first worker's)."""
        started = {environ.get(k) for k in THREAD_VARIABLES}
        if self.local and started != {str(self.threads)}:
            raise SegpipeError(
                f"Dask worker {worker} started with other thread variables than the "
                f"{self.threads} it was given ({_said(environ)}): report this as a bug"
            )
        if mine is not None and digest != mine:
            raise BadInput(
                f"Dask worker {worker} computes other bits than this process at "
                f"{self.threads} torch threads (its thread environment: {_said(environ)}"
                f"; here: {_thread_environment()}): start the workers with this "
                f"process's OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS"
            )

    def work(self, store, checkpoint: str | None, device: str, batch_size: int = 1):
        """The settings every task on `store` carries (`tasks.Work`)."""
        from segpipe.dask.tasks import Work
        from segpipe.store.lock import token

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
                raise SegpipeError(
                    f"Dask workers died running {e.task} (each time it was tried: out "
                    f"of memory? try a smaller --chunk-size); finished chunks are kept"
                ) from None
            if isinstance(e, FutureCancelledError):
                raise SegpipeError(
                    "the Dask scheduler dropped the work (it restarted, or lost "
                    "its workers); run the same command again"
                ) from None
            raise

    # -- the units of work, sent and watched --------------------------------------------

    def encode(self, store, chunks: list[int], work: Work, quiet: bool) -> None:
        """Encode `chunks`, one task each. Where any of the feature arrays does not exist yet
        (none, or some: a kill between making the levels), the first chunk goes alone: its
        task makes every missing one (their dtypes and layouts are the model's), so tasks
        side by side only ever write into arrays that exist. (A task making one is harmless
        anyway: `features.level_array`.)"""
        from segpipe.stages.encode import STAGE
        from segpipe.store.features import LEVELS

        refuse_on_dask(keep_setting(store), store.path)
        plan = store.plan
        store.ledger(STAGE).reserve(max(chunks) + 1)
        size = {k: plan.bounds(k)[1] - plan.bounds(k)[0] for k in chunks}
        path = str(resolved(store.path))
        with log.progress(
            "encode", plan.num_frames, quiet, initial=plan.num_frames - sum(size.values())
        ) as bar:

            def done(k):
                bar.update(size[k])

            first = chunks[:1] if any(store.array(n) is None for n in LEVELS) else []
            for batch in (first, chunks[len(first) :]):
                self.wait(
                    [self.submit(encode_task, path, k, work, key=f"encode-{k}") for k in batch],
                    each=done,
                )

    def track(
        self, store, pending: list[str], work: Work, on_commit, quiet: bool, groups: int = 1
    ) -> None:
        """Run the passes `pending` side by side, each in `groups` groups of objects
        (`stages.track.groups`), one task per pass and group (sequential inside, as it must
        be to stay exact), after encoding the chunks they need that have no features. The
        client watches the passes' ledgers: a chunk every group of a pass has committed
        moves the bar and goes to `on_commit(direction, k)` (`run` exports it then)."""
        from segpipe.stages.track.groups import object_groups
        from segpipe.stages.track.supply import ChunkSupply, pass_todo, prompt_reads

        refuse_on_dask(keep_setting(store), store.path)
        settings = store.attrs["track"]
        plan = store.plan
        span = Span.of(settings, plan.num_frames)
        todo = pass_todo(store, plan, pending, span)
        _, prompted = prompt_reads(plan, span, todo, [e["frame"] for e in settings["prompts"]])
        missing = ChunkSupply.missing(store, todo, prompted)
        if missing:
            log.info(
                f"track: {log.count(len(missing), 'chunk', 'has')} no features yet: encoding them "
                f"first",
                quiet,
            )
            self.encode(store, missing, work, quiet)
        for d in pending:
            store.pass_ledger(d).reserve(max(span.chunks(plan, d)) + 1)
        # a family tracked in its own session: every object in one group, whatever each has
        together = family_of(store.attrs["model"]["name"]).session_tracker
        units = [
            (d, g)
            for d in pending
            for g in object_groups(
                store, d, span.chunks(plan, d), groups, settings["options"], together
            )
        ]
        watch = _PassWatch(store, span, todo, units, on_commit)
        path = str(resolved(store.path))

        def send(i):
            d, g = units[i]
            return self.submit(pass_task, path, d, g, work, key=f"track-{d}-{g[0]}-{g[-1]}")

        with log.progress("track", watch.frames(), quiet) as bar:
            futures = [send(i) for i in range(len(units)) if not watch.later.get(i)]

            def look():
                futures.extend(send(i) for i in watch.look(bar))

            self.wait(futures, poll=look)

    def export(self, job, request: dict, k: int) -> None:
        """Send chunk k of an export (`stages.export.Export`); it runs in the background (the
        next `Cluster.wait` collects it)."""
        self.background.append(self._send_export(job, request, k))

    def export_rest(self, jobs: list, requests: list[dict], quiet: bool) -> None:
        """Every chunk the exports still lack, one task each (their finish is the caller's)."""
        self.wait(list(self.background))  # those sent while tracking: then the ledgers say
        futures, frames = [], {}
        for job, request in zip(jobs, requests):
            if not job.complete:
                for k in job.store.ledger(job.stage).reread().todo(job.chunks):
                    futures.append(self._send_export(job, request, k))
                    frames[job.stage, k] = job.frames_of(k)[1] - job.frames_of(k)[0]
        if futures:
            with log.progress("export", sum(frames.values()), quiet) as bar:
                self.wait(futures, each=lambda done: bar.update(frames[done]))

    def _send_export(self, job, request: dict, k: int):
        job.store.ledger(job.stage).reserve(max(job.chunks) + 1)  # once: later calls find it so
        work = self.work(job.store.path, None, "cpu")  # the lease; exports run no model
        return self.submit(
            export_task,
            str(resolved(job.store.path)),
            {**request, "out": str(job.out)},
            k,
            work,
            key=f"export-{job.fmt}-{k}",
        )

    def videos(
        self, layout, names: list[str], options, out, work_dir, total: int, quiet: bool
    ) -> list:
        """The dataset's videos side by side, one task each; results in the videos' order. Every
        path goes out absolute: a worker's working directory is not the client's."""
        from dataclasses import replace

        from segpipe.vos.dataset import frame_count

        out.mkdir(parents=True, exist_ok=True)
        self.check(options.execution.device, paths=[out, work_dir])  # where the workers write
        layout = replace(
            layout,
            base_video_dir=resolved(layout.base_video_dir),
            input_mask_dir=resolved(layout.input_mask_dir),
        )
        options = replace(
            options,
            encoding=replace(options.encoding, checkpoint=absolute(options.encoding.checkpoint)),
        )
        with log.progress("dataset", total, quiet) as bar:
            futures = [
                self.submit(
                    video_task,
                    layout,
                    v,
                    options,
                    resolved(out),
                    resolved(work_dir),
                    self.threads,
                    key=f"video-{v}",
                )
                for v in names
            ]

            def done(result):
                bar.update(frame_count(layout, result.video))
                if result.failed:
                    log.info(f"{result.video}: {result.status.removeprefix('failed: ')}", quiet)

            self.wait(futures, each=done)
        return [f.result() for f in futures]


class _PassWatch:
    """What the client sees of the passes' ledgers while their tasks run: the chunks every
    group of a pass has committed (each moves the bar once and goes to `on_commit`), and
    the reverse groups held back until the forward pass has written, for their objects, the
    chunks they write too (the start's, under `both`: see `tasks`)."""

    def __init__(self, store, span: Span, todo: dict, units: list, on_commit):
        from segpipe.stages.track.groups import object_todo

        settings, plan = store.attrs["track"], store.plan
        self.store, self.todo, self.units, self.on_commit = store, todo, units, on_commit
        self.slots = range(len(settings["object_ids"]))
        self.counts = {d: {k: span.count_in(d, *plan.bounds(k)) for k in todo[d]} for d in todo}
        self.seen = {d: set() for d in todo}
        # per pass and object, how far into the pass's chunks left it has committed: a group
        # commits its chunks in the pass's order, so each look reads about one file an object
        self.reached = {(d, s): 0 for d in todo for s in self.slots}
        forward = (
            set(span.chunks(plan, "forward"))
            if "forward" in passes(settings["direction"])
            else set()
        )
        self.later = {
            i: [k for k in object_todo(store, d, g, span.chunks(plan, d)) if k in forward]
            for i, (d, g) in enumerate(units)
            if d == "reverse"
        }

    def frames(self) -> int:
        return sum(sum(f.values()) for f in self.counts.values())

    def record(self, d: str, s: int, k: int) -> bool:
        """Object slot s's record of chunk k of pass d: one file read."""
        from segpipe.store.ledger import is_done_record, pass_stage

        return is_done_record(self.store.path / "ledger" / pass_stage(d) / str(s) / "c" / str(k))

    def look(self, bar) -> list[int]:
        """Read the ledgers: the chunks newly committed by every group move `bar` and go to
        `on_commit`; the units held back that may start now are returned."""
        for d, todo in self.todo.items():
            for s in self.slots:
                i = self.reached[d, s]
                while i < len(todo) and self.record(d, s, todo[i]):
                    i += 1
                self.reached[d, s] = i
            for k in todo[: min(self.reached[d, s] for s in self.slots)]:
                if k not in self.seen[d]:
                    self.seen[d].add(k)
                    bar.update(self.counts[d][k])
                    if self.on_commit is not None:
                        self.on_commit(d, k)
        ready = [
            i
            for i, wait in self.later.items()
            if wait and all(self.record("forward", s, k) for s in self.units[i][1] for k in wait)
        ]
        for i in ready:
            self.later[i] = []
        return ready
