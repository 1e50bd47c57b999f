"""The units of work a Dask worker runs (the client sends them: `segpipe.dask.client`).

Encode chunks, tracking passes, export chunks and dataset videos are independent once the
client has made what they share: the settings and arrays (recorded and created by the
stage, on the client, before anything is sent) and the ledgers' size (`Ledger.reserve`:
growing a ledger rewrites its metadata, which two workers must not do at once). The feature
arrays alone are made by a task, their dtypes and layouts being the model's: the first encode
chunk goes alone while any level is missing (`Cluster.encode`), and a level is made alike
by whichever task makes it, a task that loses a race to make it using the winner's
(`features.level_array`). A task takes paths and a few settings, never arrays; it writes
whole zarr chunks and commits each chunk itself after its data, exactly as the
single-process code (which it runs) does, so a task cut short by a dead worker is simply run again and resumes from the ledger. Each
write to the store first checks the task's lease on it (`runstore.LeasedFiles`,
inside zarr's own store): a task outliving its client writes nothing for the run that took
over. A worker builds each model once and keeps it (`model.shared_predictor`).

A tracking pass runs as groups of objects, one task each (`stages.track.groups`): a
group writes only its objects' zarr chunks, memory and ledgers. The one zarr chunk two
tasks write is an object's chunk of the earliest prompted frame under direction `both`:
the forward pass writes its frames from that frame on, the reverse pass the ones before
it, into the same zarr chunks (a read, a change and a write each). So a group's reverse
pass is sent only once the forward pass has committed that chunk for each of its objects:
the two never write it at once, whatever the timing. (A stale forward task cannot release it: the
forward ledger's records are written under the lease, and a run that took over reset
them.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """What a task on a store carries besides the store's path."""

    token: str  # the client's store lock (`lock.check_lease`)
    checkpoint: str | None  # an absolute path, or an hf: name
    device: str
    batch_size: int
    threads: int  # torch threads (`client.worker_threads`)


def probe_task(threads: int, device: str) -> tuple[str | None, dict, dict]:
    """The worker's compute environment on `device` at the client's thread count
    (`environment.current`), run as a task (in the thread tasks run in); on CPU its
    `model.thread_probe` too, and its thread environment, for the refusal message."""
    import os

    import torch

    from segpipe.environment import current
    from segpipe.model import thread_probe

    torch.set_num_threads(threads)
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    digest = thread_probe() if device == "cpu" else None
    return digest, {k: os.environ.get(k) for k in names}, current(device)


def look_around(
    paths: list[str], lease, device: str, dask_worker=None
) -> tuple[str | None, str | None]:
    """On each worker before any work: (the first problem, the device type it would use).
    A worker must run one task at a time: two would race on torch's process-wide thread
    count (`Work.threads`), and each would build and keep a model of its own (a thread's
    predictor: `model.shared_predictor`)."""
    from pathlib import Path

    from segpipe.errors import SegpipeError
    from segpipe.store.lock import check_lease

    if dask_worker is not None and dask_worker.state.nthreads != 1:
        return (
            f"runs {dask_worker.state.nthreads} tasks at a time; segpipe needs one "
            f"(dask worker --nthreads 1)"
        ), None
    try:
        if lease is not None:
            check_lease(*lease)
        for p in paths:
            if not Path(p).exists():
                return (
                    f"cannot see {p} (every worker needs the client's file system, shared)"
                ), None
        from segpipe.model import pick_device

        return None, pick_device(device)
    except SegpipeError as e:
        return e.message, None


def _store(path: str, work: Work):
    """Every store task starts here: the client still holds the store's lock, torch has the
    client's thread count, and the store is open under the client's lease (checked again
    before every write: `runstore.LeasedFiles`)."""
    from segpipe.store.lock import check_lease
    from segpipe.store.runstore import RunStore

    check_lease(path, work.token)
    import torch

    torch.set_num_threads(work.threads)
    return RunStore.open(path, lease=work.token)


def _predictor(store, work: Work, options: dict | None = None):
    """The worker's predictor of the store's model (`model.predictor_for`: built once in
    the worker), with the tracking's `options` (None for the image encoder, which they do not
    change)."""
    from segpipe.model import predictor_for, resolve_weights

    spec = store.attrs["model"]
    weights = resolve_weights(spec["name"], work.checkpoint, spec["weights"].get("random_seed"))
    return predictor_for(spec, weights, work.device, options)


def encode_task(path: str, k: int, work: Work) -> int:
    return encode_on(_store(path, work), k, work)


def encode_on(store, k: int, work: Work) -> int:
    """`encode_task`'s work on its store (opened under the lease: `_store`)."""
    from segpipe.stages.encode import STAGE, FramesOnDisk, encode_chunk

    if store.ledger(STAGE).todo([k]):  # a task run again after its commit has nothing to do
        encode_chunk(store, _predictor(store, work), k, FramesOnDisk(store), work.batch_size)
    return k


def pass_task(path: str, direction: str, slots: list[int], work: Work) -> str:
    return pass_on(_store(path, work), direction, slots, work)


def pass_on(store, direction: str, slots: list[int], work: Work) -> str:
    """`pass_task`'s work on its store (opened under the lease: `_store`): pass `direction`
    of the group of objects `slots`."""
    from segpipe.stages.track.stage import run_passes
    from segpipe.store.tracking import stored_prompts, stored_settings

    predictor = _predictor(store, work, stored_settings(store)["options"])
    run_passes(
        store,
        predictor,
        stored_prompts(store),
        [direction],
        batch_size=work.batch_size,
        quiet=True,
        groups=slots,
    )
    return direction


def export_task(path: str, request: dict, k: int, work: Work):
    return export_on(_store(path, work), request, k)


def export_on(store, request: dict, k: int):
    """`export_task`'s work on its store: the export as the client recorded it (`recorded`:
    a task never resets its ledger or rewrites the record; a difference is an error)."""
    from segpipe.stages.export.stage import Export

    job = Export(store, tracking=True, recorded=True, **request)
    if k in job.todo():
        job.chunk(k)
    return job.stage, k


def video_task(layout, video: str, options, out, work_dir, threads: int):
    """One video of a dataset, as the single-process loop runs it (`run_video`): the
    video's store lock is taken here, on the worker, for the video's stages."""
    import torch

    from segpipe.vos.dataset import VideoRunner, run_video

    torch.set_num_threads(threads)
    return run_video(VideoRunner(options, out, work_dir, quiet=True), layout, video)
