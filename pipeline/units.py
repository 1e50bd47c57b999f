"""The units of work segpipe sends to Dask workers: how the client sends each (top) and the
task a worker runs for it (bottom).

Encode chunks, tracking passes, export chunks and dataset videos are independent once the
client has made what they share: the settings and arrays (recorded and created by the
stage, on the client, before anything is sent) and the ledgers' size (`Ledger.reserve`:
growing a ledger rewrites its metadata, which two workers must not do at once). A task
takes paths and a few settings, never arrays; it writes whole zarr chunks and commits each
chunk itself after its data, exactly as the single-process code (which it runs) does, so
a task cut short by a dead worker is simply run again and resumes from the ledger. Each
chunk's data and each commit first check the task's lease on the store
(`RunStore.check_lease`): a task outliving its client writes nothing for the run that took
over. A worker builds each model once and keeps it (`MODELS`).

The one zarr chunk two tasks write is the chunk of the earliest prompted frame under
direction `both`: the forward pass writes its frames from that frame on, the reverse pass
the ones before it, into the same zarr chunks (a read, a change and a write each). So the
reverse pass is sent only once the forward pass has committed that chunk: the two never
write it at once, whatever the timing. (A stale forward task cannot release it: the
forward ledger's records are written under the lease, and a run that took over reset
them.)
"""
from __future__ import annotations

from dataclasses import dataclass

from . import log
from .chunks import ChunkPlan, pass_chunks, pass_frame_count_in
from .errors import BadInput


@dataclass(frozen=True)
class Work:
    """What a task on a store carries besides the store's path."""
    token: str  # the client's store lock (`lock.check_lease`)
    checkpoint: str | None  # an absolute path, or an hf: name
    device: str
    batch_size: int
    threads: int  # torch threads (`cluster.worker_threads`)


def refuse_keep_masks(store) -> None:
    from .retention import keep_setting
    if keep_setting(store) == "masks":
        raise BadInput(f"store {store.path} keeps masks only (--keep masks), which runs in one "
                       f"process: run it without --workers or --scheduler")


# -- the client ----------------------------------------------------------------------------

def encode(cluster, store, chunks: list[int], work: Work, quiet: bool) -> None:
    """Encode `chunks`, one task each. Where the feature arrays do not exist yet, the first
    chunk goes alone: its task makes them (their dtypes and layouts are the model's)."""
    from .stages.encode import LEVELS, STAGE
    refuse_keep_masks(store)
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    store.ledger(STAGE).reserve(max(chunks) + 1)
    size = {k: plan.bounds(k)[1] - plan.bounds(k)[0] for k in chunks}
    path = str(store.path.resolve())
    with log.progress("encode", plan.num_frames, quiet,
                      initial=plan.num_frames - sum(size.values())) as bar:
        def done(k):
            bar.update(size[k])
        first = chunks[:1] if store.array(LEVELS[0]) is None else []
        for batch in (first, chunks[len(first):]):
            cluster.wait([cluster.submit(encode_task, path, k, work, key=f"encode-{k}")
                          for k in batch], each=done)


def track(cluster, store, pending: list[str], work: Work, on_commit, quiet: bool) -> None:
    """Run the passes `pending` side by side, one task each (a pass is sequential inside, as
    it must be to stay exact), after encoding the chunks they need that have no features.
    The client watches the passes' ledgers: a chunk a pass commits moves the bar and goes
    to `on_commit(direction, k)` (`run` exports it then)."""
    from .stages.supply import ChunkSupply, pass_todo
    refuse_keep_masks(store)
    settings = store.attrs["track"]
    start = settings["start_frame"]
    plan = ChunkPlan(store.attrs["frame_count"], store.attrs["chunk_size"])
    todo = pass_todo(store, plan, pending, start)
    missing = ChunkSupply.missing(store, todo)
    if missing:
        log.info(f"track: {len(missing)} chunks have no features yet: encoding them first", quiet)
        encode(cluster, store, missing, work, quiet)
    for d in pending:
        store.ledger(f"track_{d}").reserve(max(pass_chunks(plan, d, start)) + 1)
    frames = {d: {k: pass_frame_count_in(d, start, *plan.bounds(k)) for k in todo[d]}
              for d in pending}
    seen = {d: set() for d in pending}
    # the start's chunk, when both passes still have to write it: reverse waits (see above)
    shared = set(todo.get("forward", ())) & set(todo.get("reverse", ()))
    later = ["reverse"] if shared else []
    path = str(store.path.resolve())

    def send(d):
        return cluster.submit(pass_task, path, d, work, key=f"track-{d}")

    with log.progress("track", sum(sum(f.values()) for f in frames.values()), quiet) as bar:
        futures = [send(d) for d in pending if d not in later]

        def look():
            for d in pending:
                done = store.ledger(f"track_{d}").reread().done()
                for k in todo[d]:
                    if k < len(done) and done[k] and k not in seen[d]:
                        seen[d].add(k)
                        bar.update(frames[d][k])
                        if on_commit is not None:
                            on_commit(d, k)
            if later and shared <= seen["forward"]:
                futures.append(send(later.pop()))
        cluster.wait(futures, poll=look)


def export(cluster, job, request: dict, k: int) -> None:
    """Send chunk k of an export (`stages.export.Export`); it runs in the background (the
    next `Cluster.wait` collects it)."""
    cluster.background.append(_send_export(cluster, job, request, k))


def export_rest(cluster, jobs: list, requests: list[dict], quiet: bool) -> None:
    """Every chunk the exports still lack, one task each (their finish is the caller's)."""
    cluster.wait(list(cluster.background))  # those sent while tracking: then the ledgers say
    futures, frames = [], {}
    for job, request in zip(jobs, requests):
        if not job.complete:
            for k in job.store.ledger(job.stage).reread().todo(job.chunks):
                futures.append(_send_export(cluster, job, request, k))
                frames[job.stage, k] = job.frames_of(k)[1] - job.frames_of(k)[0]
    if futures:
        with log.progress("export", sum(frames.values()), quiet) as bar:
            cluster.wait(futures, each=lambda done: bar.update(frames[done]))


def _send_export(cluster, job, request: dict, k: int):
    job.store.ledger(job.stage).reserve(max(job.chunks) + 1)  # once: later calls find it so
    work = cluster.work(job.store.path, None, "cpu")  # the lease; exports run no model
    return cluster.submit(export_task, str(job.store.path.resolve()),
                          {**request, "out": str(job.out)}, k, work, key=f"export-{job.fmt}-{k}")


def videos(cluster, layout, names: list[str], options, out, work_dir, total: int,
           quiet: bool) -> list:
    """The dataset's videos side by side, one task each; results in the videos' order. Every
    path goes out absolute: a worker's working directory is not the client's."""
    from dataclasses import replace
    from .cluster import absolute
    from .vos_dataset import frame_count
    out.mkdir(parents=True, exist_ok=True)
    cluster.check(options.device, paths=[out, work_dir])  # where the workers write
    layout = replace(layout, base_video_dir=layout.base_video_dir.resolve(),
                     input_mask_dir=layout.input_mask_dir.resolve())
    options = replace(options, checkpoint=absolute(options.checkpoint))
    with log.progress("dataset", total, quiet) as bar:
        futures = [cluster.submit(video_task, layout, v, options, out.resolve(),
                                  work_dir.resolve(), cluster.threads, key=f"video-{v}")
                   for v in names]

        def done(result):
            bar.update(frame_count(layout, result.video))
            if result.failed:
                log.info(f"{result.video}: {result.status.removeprefix('failed: ')}", quiet)
        cluster.wait(futures, each=done)
    return [f.result() for f in futures]


# -- the workers ---------------------------------------------------------------------------

MODELS = None  # this worker's predictors (`model.Models`), made with the first task


def look_around(paths: list[str], lease, device: str,
                dask_worker=None) -> tuple[str | None, str | None]:
    """On each worker before any work: (the first problem, the device type it would use).
    A worker must run one task at a time: two would share its models and torch's
    process-wide thread count (`Work.threads`), and race on both."""
    from pathlib import Path
    from .errors import SegpipeError
    from .lock import check_lease
    if dask_worker is not None and dask_worker.state.nthreads != 1:
        return (f"runs {dask_worker.state.nthreads} tasks at a time; segpipe needs one "
                f"(dask worker --nthreads 1)"), None
    try:
        if lease is not None:
            check_lease(*lease)
        for p in paths:
            if not Path(p).exists():
                return (f"cannot see {p} (every worker needs the client's file system, "
                        f"shared)"), None
        from .model import pick_device
        return None, pick_device(device)
    except SegpipeError as e:
        return e.message, None


def _store(path: str, work: Work):
    """Every store task starts here: the client still holds the store's lock, torch has the
    client's thread count, and the store is open under the client's lease (checked again
    before each write: `RunStore.check_lease`)."""
    from .lock import check_lease
    from .store import RunStore
    check_lease(path, work.token)
    import torch
    torch.set_num_threads(work.threads)
    store = RunStore.open(path)
    store.lease = work.token
    return store


def _predictor(store, work: Work, options: dict | None = None):
    global MODELS
    from .model import Models, pick_device, resolve_weights
    if MODELS is None:
        MODELS = Models()
    spec, options = store.attrs["model"], options or {}
    weights = resolve_weights(spec["name"], work.checkpoint, spec["weights"].get("random_seed"))
    return MODELS.get(spec["name"], spec["image_size"], weights, pick_device(work.device),
                      postprocessing=options.get("postprocessing", True),
                      non_overlap=options.get("non_overlap", False))


def encode_task(path: str, k: int, work: Work) -> int:
    return encode_on(_store(path, work), k, work)


def encode_on(store, k: int, work: Work) -> int:
    """`encode_task`'s work on its store (opened under the lease: `_store`)."""
    from .stages.encode import STAGE, FramesOnDisk, encode_chunk
    if store.ledger(STAGE).todo([k]):  # a task run again after its commit has nothing to do
        encode_chunk(store, _predictor(store, work), k, FramesOnDisk(store), work.batch_size)
    return k


def pass_task(path: str, direction: str, work: Work) -> str:
    return pass_on(_store(path, work), direction, work)


def pass_on(store, direction: str, work: Work) -> str:
    """`pass_task`'s work on its store (opened under the lease: `_store`)."""
    from .stages.track import run_passes, stored_prompts
    from .track_settings import stored_settings
    predictor = _predictor(store, work, stored_settings(store)["options"])
    run_passes(store, predictor, stored_prompts(store), [direction],
               batch_size=work.batch_size, quiet=True)
    return direction


def export_task(path: str, request: dict, k: int, work: Work):
    return export_on(_store(path, work), request, k)


def export_on(store, request: dict, k: int):
    """`export_task`'s work on its store: the export as the client recorded it (`recorded`:
    a task never resets its ledger or rewrites the record; a difference is an error)."""
    from .stages.export import Export
    job = Export(store, tracking=True, recorded=True, **request)
    if k in job.todo():
        job.chunk(k)
    return job.stage, k


def video_task(layout, video: str, options, out, work_dir, threads: int):
    """One video of a dataset, as the single-process loop runs it (`run_video`): the
    video's store lock is taken here, on the worker, for the video's stages."""
    global MODELS
    from .model import Models
    from .vos_dataset import VideoRunner, run_video
    import torch
    torch.set_num_threads(threads)
    if MODELS is None:
        MODELS = Models()
    return run_video(VideoRunner(options, out, work_dir, quiet=True, models=MODELS), layout, video)
