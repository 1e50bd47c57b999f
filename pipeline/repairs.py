"""`segpipe repair`: find every done chunk that no longer reads back intact (a missing chunk
file, or one failing its crc32c check), mark exactly those chunks not done, and let the
stages recompute them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from segpipe import log
from segpipe.errors import DamagedStore, SegpipeError, StoreNotReady
from segpipe.models.registry import family_of
from segpipe.plan import ChunkPlan, Span, passes, untracked_chunks
from segpipe.settings import Encoding, Execution
from segpipe.store.layout import TRACK_ARRAYS, memory_arrays, session_arrays
from segpipe.store.ledger import object_stage
from segpipe.store.lock import holds_store_lock
from segpipe.store.retention import DROPPABLE, dropped
from segpipe.store.runstore import RunStore

FRAME_ARRAYS = {
    "frames": "decode",
    "pts": "decode",
    "timestamps": "decode",
    "frame_digests": "decode",
    "features/level0": "encode",
    "features/level1": "encode",
    "features/level2": "encode",
}
UNTRACKED = "untracked"  # chunks no pass reaches: rewritten as untracked, no ledger of their own


@dataclass(frozen=True)
class Damage:
    array: str
    chunk: int
    reason: str
    slot: int | None = None  # the object, in arrays a group of objects writes apart


def _check(store: RunStore, name: str, k: int, found: list[Damage], slot=None) -> bool:
    """Whether pipeline chunk k of `name` (only object `slot`'s zarr chunks, with it) reads
    back intact: every zarr chunk of it (`masks` has one per object) read and verified one
    at a time, so a chunk of masks is never held whole."""
    arr = store.array(name)
    if arr is None:  # the whole array gone (its zarr.json too)
        found.append(Damage(name, k, "is missing (the whole array)", slot))
        return False
    step = arr.chunks[0]
    lo, hi = k * step, min((k + 1) * step, arr.shape[0])
    groups = [slice(a, b) for a, b in store.col_groups(name)] if arr.ndim > 1 else []
    if slot is not None:
        groups = [slice(slot, slot + 1)]
    try:
        for cols in groups or [None]:
            store.read(name, lo, hi, cols=cols)
        return True
    except DamagedStore as e:
        found.append(Damage(name, k, e.reason, slot))
        return False


def scan(store: RunStore) -> tuple[list[Damage], dict[str, set[int]]]:
    """The damaged chunks, and per stage ledger the chunks to redo."""
    found: list[Damage] = []
    redo: dict[str, set[int]] = {}
    done = {stage: store.ledger(stage).done() for stage in ("decode", "encode")}

    def is_done(stage, k):  # one read of each ledger for the whole scan
        return k < len(done[stage]) and done[stage][k]

    _scan_frame_arrays(store, done, is_done, found, redo)
    track = store.attrs.get("track")
    if track is None or track.get("concepts"):  # a concept tracking's results and memory
        return found, redo  # are not checked yet (`track --force` tracks them anew)
    if "frame_count" not in store.attrs:  # tracked alongside a decode, both stopped
        raise StoreNotReady(
            f"store {store.path} stopped while it decoded and tracked at once: run `segpipe "
            f"run` again to finish both, then repair"
        )
    T, C = store.attrs["frame_count"], store.chunk_size
    plan = ChunkPlan(T, C)
    for d in passes(track["direction"]):
        _scan_pass(store, plan, track, d, found, redo)
    for k in untracked_chunks(plan, track["direction"], Span.of(track, T)):
        if not all([_check(store, name, k, found) for name in TRACK_ARRAYS]):
            redo.setdefault(UNTRACKED, set()).add(k)
    if store.array("prompt_masks") is not None and not _check(store, "prompt_masks", 0, found):
        raise SegpipeError(
            f"store {store.path}: the stored mask prompts are damaged; track again "
            f"with `segpipe track --store {store.path} --prompts FILE --force`"
        )
    return found, redo


def _scan_frame_arrays(store: RunStore, done: dict, is_done, found: list, redo: dict) -> None:
    """Scan decode's and encode's arrays: their damaged done chunks (not dropped) to redo."""
    gone = {what: dropped(store, what).done() for what in DROPPABLE}
    kept = {name: what for what, names in DROPPABLE.items() for name in names}

    def was_dropped(name, k):  # dropped on purpose (`--keep masks`): not damage
        what = kept.get(name)
        return what is not None and k < len(gone[what]) and gone[what][k]

    for name, stage in FRAME_ARRAYS.items():
        if store.array(name) is None:
            continue
        for k in range(len(done[stage])):
            if is_done(stage, k) and not was_dropped(name, k) and not _check(store, name, k, found):
                redo.setdefault(stage, set()).add(k)


def _scan_pass(store: RunStore, plan: ChunkPlan, track: dict, d: str, found: list, redo: dict):
    """Scan pass `d` object by object (each has its own ledger, memory and zarr chunks of the
    results: groups of objects commit apart): its prompted memory, and its done chunks'
    results and memory. A damaged chunk of the results holds both passes' frames: it is
    redone in both, for that object. A family tracked in its own session keeps every
    object's memory in one set of arrays: read once, a damaged chunk redone for all."""
    chunks = Span.of(track, plan.num_frames).chunks(plan, d)
    shared = None
    if family_of(store.attrs["model"]["name"]).session_tracker:  # its chunks any object did
        done = [store.ledger(object_stage(d, s)).done() for s in range(len(track["object_ids"]))]
        some = [k for k in chunks if any(k < len(x) and x[k] for x in done)]
        memory = [session_arrays(store, d, kind) for kind in ("prompted", "recent")]
        shared = _scan_memory(store, some, *memory, found)
    for s in range(len(track["object_ids"])):
        stage = object_stage(d, s)
        done = store.ledger(stage).done()
        mine = [k for k in chunks if k < len(done) and done[k]]
        prompted_bad, recent_bad = shared or _scan_memory(
            store,
            mine,
            [n for n in memory_arrays(d, s, "prompted") if store.array(n) is not None],
            memory_arrays(d, s, "recent"),
            found,
        )
        if prompted_bad:
            redo.setdefault(stage, set()).update(mine)
        for k in mine:
            results = [_check(store, n, k, found, slot=s) for n in TRACK_ARRAYS]
            if not all(results) or k in recent_bad:
                redo.setdefault(stage, set()).add(k)
            if not all(results):
                for other in passes(track["direction"]):
                    if store.ledger(object_stage(other, s)).is_done(k):
                        redo.setdefault(object_stage(other, s), set()).add(k)


def _scan_memory(store: RunStore, chunks, prompted: list, recent: list, found: list):
    """(whether a prompted array is damaged, the chunks of `chunks` whose snapshot is)."""
    prompted_bad = not all([_check(store, n, 0, found) for n in prompted])
    recent_bad = {k for k in chunks if not all([_check(store, n, k, found) for n in recent])}
    return prompted_bad, recent_bad


@holds_store_lock
def repair(store_path, checkpoint: str | None, execution: Execution) -> list[Damage]:
    """Recompute the damaged chunks `scan` finds (`checkpoint`: the weights, where the store
    records no seed), in the store's compute environment (checked before anything changes;
    `execution.allow_env_change`: in another too)."""
    from segpipe import environment
    from segpipe.stages.decode import decode
    from segpipe.stages.encode import encode
    from segpipe.stages.track.stage import track, write_untracked

    store, quiet = RunStore.open(store_path), execution.quiet
    found, redo = scan(store)  # an unfinished decode too: decode then continues from the damage
    if not found:
        log.info(f"repair: no damage found in {store.path}", quiet)
        return found
    for d in found:
        log.warn(f"damaged: array {d.array!r} chunk {d.chunk} {d.reason}")
    computed = [stage for stage in redo if stage == "encode" or stage.startswith("track")]
    if computed and "model" in store.attrs:
        computing = environment.of_work(execution.device)
        environment.check(store, computing, execution.allow_env_change, quiet)
    for stage, chunks in redo.items():
        for k in sorted(chunks) if stage != UNTRACKED else ():
            store.ledger(stage).undo(k)
    for d in found:  # gone before the redo: a chunk written only in part is read first
        if store.array(d.array) is None:  # the whole array is gone: made again by the redo
            continue
        cols = None if d.slot is None else slice(d.slot, d.slot + 1)  # (else every object's)
        for path in store.chunk_files(d.array, d.chunk, cols):
            path.unlink(missing_ok=True)
    if UNTRACKED in redo:
        write_untracked(store, sorted(redo[UNTRACKED]))
    if "decode" in redo:
        decode(Path(store.attrs["source"]["path"]), store.path, quiet=quiet)
    model = store.attrs.get("model")
    if "encode" in redo:
        encoding = Encoding(
            model["name"],
            checkpoint,
            model["weights"].get("random_seed"),
            embedding_dtype=model["embedding_dtype"],
        )  # the store's precision
        encode(store.path, encoding, execution)
    if any(stage.startswith("track") for stage in redo):
        # the tracked prompts, never a studio's draft: a repair recomputes what was tracked
        track(
            store.path, encoding=Encoding(checkpoint=checkpoint), execution=execution, draft=False
        )
    # untracked chunks count as track's; a pass's chunk once, whatever objects it was for
    redone = {(stage.split("/")[0], k) for stage, chunks in redo.items() for k in chunks}
    stages = sorted({stage for stage, _ in redone})
    log.result(
        f"repair: recomputed {log.count(len(redone), 'chunk')} of {', '.join(stages)}", quiet
    )
    return found
