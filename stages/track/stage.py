"""Track stage: SAM 2 video tracking chunk by chunk, from stored embeddings.

Semantics are exactly `SAM2VideoPredictor` with all prompts added up front: the forward pass
runs from the earliest prompted frame to the last frame, the reverse pass from it back to
frame 0, each from a fresh state (within a tracking window, `frames`, as
`propagate_in_video(start_frame_idx, max_frame_num_to_track)`: `plan.Span`); masks are its
outputs' logits above the score threshold.
With `object_start="own"` each object is tracked forward from its own first prompt, alone,
as SAM 2's vos_inference tracks objects that appear later in a video. SAM 2's own methods do the work (`add_new_points_or_box`,
`add_new_mask`, `propagate_in_video_preflight`, `_run_single_frame_inference`,
`_get_orig_video_res_output`); segpipe supplies the stored features through the predictor's
feature cache and carries `TrackerMemory` across chunks, so masks are bit-identical to the
predictor tracking the whole video in memory.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from segpipe import environment, log
from segpipe import prompts as prompt_file
from segpipe.errors import BadInput, StoreNotReady
from segpipe.labels import of_prompts
from segpipe.model import (
    autocast,
    check_model,
    family_of_predictor,
    for_workers,
    made_by_shipped_weights,
    model_spec,
    predictor_for,
    resolve_weights,
    tracking_options,
)
from segpipe.models.registry import family_of
from segpipe.plan import ChunkPlan, Span, passes, untracked_chunks
from segpipe.settings import Encoding, Execution, Tracking
from segpipe.stages.track.groups import coupled, cut, object_groups, object_todo
from segpipe.stages.track.supply import ChunkSupply, prompt_reads, say_cost
from segpipe.store.labels import save as save_labels
from segpipe.store.layout import TRACK_ARRAYS, require_decoded, reset_from
from segpipe.store.lock import holds_store_lock
from segpipe.store.masks import mask_chunks, write_fill
from segpipe.store.retention import keep_setting, on_disk, sweep
from segpipe.store.runstore import RunStore
from segpipe.store.source import stored_source
from segpipe.store.tracking import (
    draft_prompts,
    drop_draft,
    next_prompts,
    stored_prompts,
    stored_settings,
)

if TYPE_CHECKING:
    from segpipe.stages.executor import Executor


def tracking_settings(prompts: list, direction: str, options: dict, window=None) -> dict:
    """What the store records of a tracking (`track` attribute): changing any of it tracks
    anew. `window` ([lo, hi), `--frames`) is recorded only when it is not the whole video."""
    entries, _ = prompt_file.to_record(prompts)
    settings = {
        "prompts_sha256": prompt_file.digest(prompts),
        "direction": direction,
        "object_ids": prompt_file.object_ids(prompts),
        "start_frame": min(p.frame for p in prompts),
        "prompts": entries,
        "options": options,
    }
    if window is not None:
        settings["frames"] = list(window)
    return settings


def prepare(store: RunStore, prompts: list, settings: dict, again: bool, quiet: bool) -> None:
    """With `again` (the settings changed, or `force`), discard the old tracking and make
    the arrays. The new settings are recorded last (see `reset_from`)."""
    if not again:
        return
    T, C = require_decoded(store), store.chunk_size
    if store.attrs.get("track") is not None:
        log.info("track: starting over (prompts, direction or options changed, or --force)", quiet)
    reset_from(store, "track")
    create_results(store, len(settings["object_ids"]), {"object_ids": settings["object_ids"]})
    save_prompt_masks(store, prompts)
    write_untracked(
        store, untracked_chunks(ChunkPlan(T, C), settings["direction"], Span.of(settings, T))
    )
    store.set_attrs(track=settings)
    drop_draft(store)  # the prompts tracked are the store's now


def save_prompt_masks(store: RunStore, prompts: list) -> None:
    """The mask prompts' masks, which the stored prompts' entries index (`prompt_masks`)."""
    _, masks = prompt_file.to_record(prompts)
    if len(masks):
        arr = store.create_array("prompt_masks", masks.shape, masks.shape, "bool", fill_value=False)
        arr[...] = masks
        store.commit_array("prompt_masks")


def create_results(store: RunStore, objects: int, attributes: dict) -> None:
    """The tracking's results arrays for `objects` objects (`attributes`: the masks')."""
    T, C = store.plan.num_frames, store.chunk_size
    H, W = store.attrs["video"]["height"], store.attrs["video"]["width"]
    # one zarr chunk per object and band of rows: one in RAM is small, whatever the objects
    store.create_array(
        "masks", (T, objects, H, W), mask_chunks(C, H, W), "bool", fill_value=False,
        attributes=attributes,
    )  # fmt: skip
    # one zarr chunk per object: groups of objects tracked side by side write apart
    store.create_array("object_scores", (T, objects), (C, 1), "float32", fill_value=np.nan)
    store.create_array("object_areas", (T, objects), (C, 1), "int64", fill_value=0)
    store.create_array("tracked", (T, objects), (C, 1), "bool", fill_value=False)


def write_untracked(store: RunStore, chunks) -> None:
    """Write the chunks no pass reaches as untracked (no masks, NaN scores): every chunk of
    the results then exists, and reads back as untracked rather than missing. They need no
    ledger: they are written before the tracking settings are recorded (`prepare`)."""
    plan = store.plan
    scores, tracked = store.array("object_scores"), store.array("tracked")
    areas = store.array("object_areas")
    for k in chunks:
        lo, hi = plan.bounds(k)
        write_fill(store, lo, hi)  # one zarr chunk (object) at a time
        scores[lo:hi] = np.nan
        areas[lo:hi] = 0
        tracked[lo:hi] = False
        store.sync_chunk(TRACK_ARRAYS, k)


@holds_store_lock
def track(
    store_path,
    prompts=None,
    tracking: Tracking | None = None,
    encoding: Encoding = Encoding(),
    execution: Execution = Execution(),
    *,
    predictor=None,
    on_commit=None,
    cluster: Executor | None = None,
    space=None,
    draft: bool = True,
) -> RunStore:
    """Track from `prompts` (a file path, entries or `Prompt`s), or (without them) from the
    store's prompts (`next_prompts`: segpipe studio's saved draft, else those of the last
    track; with `draft` False, those of the last track: a repair), resuming or repairing
    whatever is not done; or the concepts of `tracking` (or the store's: `_concepts_asked`).

    `tracking` (None: all the store's) says what is computed; what it leaves None is the
    store's, else the default (`Tracking.resolve`). `encoding`: the `checkpoint`, and the
    `batch_size` of chunks encoded as the passes reach them (`supply`). `execution`: the
    device, progress, `force` (track anew), `groups` (of objects: `stages.track.groups`) and
    `allow_env_change` (`segpipe.environment`). `on_commit(direction, chunk)` is called after
    each chunk a pass commits (`run` and the dataset command export it then). `cluster`:
    Dask workers run the passes. `space` (`run`'s) is asked before the first write."""
    quiet, device, checkpoint = execution.check().quiet, execution.device, encoding.checkpoint
    encoding.check()
    store = RunStore.open(store_path)
    if (asked := _concepts_asked(store, prompts, tracking)) is not None:
        args = (store, *asked, encoding, execution, predictor, on_commit, cluster, space)
        return _track_concepts(*args)
    plan, spec, prompts, weights, named = _track_inputs(store, prompts, draft, checkpoint, quiet)
    resolved = (tracking or Tracking()).resolve(store, prompts)
    check_family(spec["name"], prompts, resolved.options)
    _check_predictor(predictor, resolved.options)
    settings = tracking_settings(prompts, resolved.direction, resolved.options, resolved.window)
    again = execution.force or stored_settings(store) != settings  # every chunk anew
    env = (environment.of_work(device, predictor, cluster), execution.allow_env_change)
    pending = _prepare_passes(
        store, plan, prompts, settings, resolved.direction, again, quiet, space, env
    )
    save_labels(store, named)
    if not pending:
        sweep(store)
        log.info("track: already complete", quiet)
        return store
    groups = _groups(store, execution.groups, resolved.options, cluster, quiet, spec)
    if cluster is not None:
        work = cluster.work(
            store_path, for_workers(checkpoint, weights), device, encoding.batch_size
        )
        cluster.track(store, pending, work, on_commit, quiet, groups or cluster.size)
    else:
        predictor = predictor or predictor_for(spec, weights, device, resolved.options)
        run_passes(
            store, predictor, prompts, pending, on_commit, encoding.batch_size, quiet, groups or 1
        )
    sweep(store)  # under --keep masks: what a crash left between a chunk's last use and its drop
    _say_tracked(store, prompts, quiet)
    return store


def _concepts_asked(store: RunStore, prompts, tracking: Tracking | None):
    """(the concept tracking asked for, the objects clicked beside it: prompts, and the
    names their prompts file gives them): `tracking`'s concepts, else the store's (a
    resume, without prompts); the prompts given, else the store's concept tracking's
    clicks. None: the prompts' objects are tracked."""
    settings = stored_settings(store) or {}
    recorded = settings.get("concepts")
    given = tracking is not None and bool(tracking.concepts)
    if not given and not (recorded and prompts is None):
        return None
    if not given:
        tracking = replace(tracking or Tracking(), concepts=tuple(recorded))
    if prompts is None:
        return tracking, stored_prompts(store) if recorded and settings["prompts"] else [], {}
    T, video = require_decoded(store), store.attrs["video"]
    clicks = prompt_file.load(prompts, T, video["width"], video["height"])
    return tracking, clicks, of_prompts(prompts)


def concept_settings(concepts, options: dict, clicks: list = ()) -> dict:
    """What the store records of a concept tracking (`track`): forward from frame 0, one
    ledger (no prompted objects: the instances appear as it goes); the objects clicked
    beside the concepts are its `prompts`."""
    entries, _ = prompt_file.to_record(list(clicks))
    return {
        "prompts_sha256": prompt_file.digest(list(clicks)) + ":" + "|".join(concepts),
        "direction": "forward",
        "object_ids": [],
        "start_frame": 0,
        "prompts": entries,
        "concepts": list(concepts),
        "options": options,
    }


def _track_concepts(
    store, tracking, clicks, named, encoding, execution, predictor, on_commit, cluster, space
):
    """`track` with concept prompts (`stages.track.concepts`), and objects clicked beside
    them (`clicks`, prompts: `stages.track.clicks`; `named`, their names): one pass, one
    process. `on_commit(d, k)` is told each chunk committed (the studio's progress); `run`
    exports at its finish, once every instance is known."""
    quiet, device = execution.quiet, execution.device
    spec, resolved, settings, weights = _concept_inputs(store, tracking, clicks, encoding)
    if cluster is not None:
        raise BadInput("concept prompts are tracked in one process so far (no --workers)")
    again = execution.force or stored_settings(store) != settings
    plan = store.plan
    chunks = list(range(plan.num_chunks))
    todo = chunks if again else store.pass_ledger("forward").todo(chunks)
    unit = ("forward", 0)
    # the clicked objects' prompts are applied where the pass starts (after, from memory)
    span = Span.of(settings, plan.num_frames)
    _, reads = prompt_reads(plan, span, {"forward": todo}, [p.frame for p in clicks])
    prompted = {unit: reads} if reads else {}
    missing = ChunkSupply.missing(store, {unit: todo}, prompted.get(unit, ()))
    if todo:
        if not set(missing) <= on_disk(store, "frames"):
            stored_source(store)
        if space is not None:
            space.before_track(store)
        env = environment.of_work(device, predictor, cluster)
        environment.check(store, env, execution.allow_env_change, quiet)
    if again:
        prepare_concepts(store, settings, clicks, quiet)
    save_labels(store, named)
    if not todo:
        sweep(store)
        log.info("track: already complete", quiet)
        return store
    predictor = predictor or predictor_for(spec, weights, device, resolved.options)
    say_cost(store, plan, missing, quiet)
    frames = sum(hi - lo for lo, hi in map(plan.bounds, missing))
    with (
        log.progress("encode", frames, quiet or not missing) as bar,
        ChunkSupply(store, predictor, {unit: todo}, prompted, encoding.batch_size, bar) as supply,
    ):
        _concept_pass(store, predictor, resolved, clicks, supply, todo, on_commit, quiet)
    sweep(store)
    n = len(store.array("masks").attrs.get("concept_ids", []))
    also = f" and {len(prompt_file.object_ids(clicks))} clicked objects" if clicks else ""
    found = f"{n} instances of {', '.join(resolved.concepts)}{also}"
    log.result(f"track: {found} in {store.path}", quiet)
    return store


def _concept_inputs(store: RunStore, tracking: Tracking, clicks: list, encoding: Encoding):
    """(model spec, resolved tracking, settings to record, weights) of a concept tracking,
    checked: an encoded store of a model with a detector, the clicks and the concepts."""
    require_decoded(store)
    spec = store.attrs.get("model")
    if spec is None:
        raise StoreNotReady(f"store {store.path} is not encoded yet (run `segpipe encode`)")
    family = family_of(spec["name"])
    if not family.detects:
        raise BadInput(
            f"{spec['name']} has no detector: concept prompts need --model sam3-video "
            f"(a new --store)"
        )
    resolved = tracking.resolve(store, None)
    if clicks:
        check_family(spec["name"], clicks, resolved.options, concepts=True)
    weights, seed = embeddings_weights(store, spec, encoding.checkpoint)
    family.check_concepts(spec["name"], resolved.concepts, weights)
    if seed is not None:
        log.warn("random weights: masks from them mean nothing")
    settings = concept_settings(resolved.concepts, resolved.options, clicks)
    return spec, resolved, settings, weights


def _concept_pass(store, predictor, resolved, clicks, supply, todo, on_commit, quiet) -> None:
    """The concept tracking's pass over the chunks `todo`, features from `supply`."""
    from segpipe.stages.track.concepts import ConceptTracker
    from segpipe.stages.track.tracker import StoredFeatures

    supply.ensure(todo[0])  # the level array made (its kind known) before it is read
    supply.written()
    features = StoredFeatures(store, predictor.device, [], supply.held)
    threshold = float(resolved.options["score_threshold"])
    args = (predictor, store, resolved.concepts, features, supply, on_commit, clicks)
    ConceptTracker(*args, threshold).run(quiet)


def prepare_concepts(store: RunStore, settings: dict, clicks: list, quiet: bool) -> None:
    """`prepare` for a concept tracking: the results arrays with the clicked objects'
    columns alone (they grow as instances appear), the clicks' masks, and `instances`, a
    count per chunk."""
    T, C = require_decoded(store), store.chunk_size
    if store.attrs.get("track") is not None:
        log.info("track: starting over (concepts, clicks or options changed, or --force)", quiet)
    reset_from(store, "track")
    ids = prompt_file.object_ids(clicks)
    create_results(store, len(ids), {"object_ids": ids, "concept_ids": []})
    save_prompt_masks(store, clicks)
    store.create_array("instances", (ChunkPlan(T, C).num_chunks,), (1,), "int32", fill_value=-1)
    store.set_attrs(track=settings)
    drop_draft(store)


def _groups(store: RunStore, groups: int | None, options: dict, cluster, quiet: bool, spec):
    """The groups asked for, or one where they cannot be (said)."""
    if family_of(spec["name"]).session_tracker:  # one group, also on Dask workers
        if (groups or 1) > 1:
            log.info(f"track: {spec['name']} tracks its objects in one group (together)", quiet)
        return 1
    if (groups or 1) > 1 and coupled(options):
        log.info(
            "track: the objects in one group (under --non-overlap or --object-batch they "
            "are computed together)",
            quiet,
        )
        return 1
    if cluster is None and (groups or 1) > 1 and keep_setting(store) == "masks":
        log.info(
            "track: one group here under --keep masks (each group would read every chunk's "
            "features, which would then all be written)",
            quiet,
        )
        return 1
    return groups


def _track_inputs(store: RunStore, given, draft: bool, checkpoint, quiet: bool):
    """(chunk plan, model spec, prompts, weights, the objects' names) of a tracking of the
    store, checked in this order: the prompts given (with the names a prompts file carries),
    else the studio's draft (said), else the last track's; the model; its weights."""
    if given is None and draft and draft_prompts(store) is not None:
        log.info("track: the prompts segpipe studio saved (prompts.json in the store)", quiet)
    T = require_decoded(store)
    plan = ChunkPlan(T, store.chunk_size)
    spec = store.attrs.get("model")
    if spec is None:
        raise StoreNotReady(f"store {store.path} is not encoded yet (run `segpipe encode`)")
    video = store.attrs["video"]
    prompts = (
        (next_prompts(store) if draft else stored_prompts(store))
        if given is None
        else prompt_file.load(given, T, video["width"], video["height"])
    )
    if not family_of(spec["name"]).tracks_with_segpipe:
        raise BadInput(f"{spec['name']} is not tracked by segpipe's chunked tracker yet")
    weights, seed = embeddings_weights(store, spec, checkpoint)
    if seed is not None:
        log.warn("random weights: masks from them mean nothing")
    return plan, spec, prompts, weights, of_prompts(given)


def embeddings_weights(store: RunStore, spec: dict, checkpoint: str | None):
    """(weights, random seed) of the model the store's embeddings were made with, checked."""
    seed = spec["weights"].get("random_seed")
    if seed is None and checkpoint is None and not made_by_shipped_weights(spec):
        raise BadInput("the embeddings were made from a checkpoint: pass the same --checkpoint")
    weights = resolve_weights(spec["name"], checkpoint, seed)
    precision = spec["precision"]
    check_model(store, model_spec(store, spec["name"], weights, spec["embedding_dtype"], precision))
    return weights, seed


def check_family(model: str, prompts: list, options: dict, concepts: bool = False) -> None:
    """Refuse what a family tracked in its own session does not do, before anything is
    written: SAM 2's options (`options`: as resolved, or those asked, None where not), and
    what transformers' own session fails on; clicks on a concept model without concepts."""
    family = family_of(model)
    if family.detects and not concepts:
        raise BadInput(
            f"{model} tracks clicked objects beside concept prompts (--concept); to track "
            f"clicked objects alone use --model sam3-tracker"
        )
    if not family.session_tracker:
        return
    for option, asked in (
        ("--non-overlap", options["non_overlap"]),
        ("--object-start own", options["object_start"] == "own"),
        ("--object-batch", options.get("object_batch", 1) > 1),
    ):
        if asked:
            raise BadInput(f"{model}: {option} is SAM 2's alone so far")
    if not family.masks_beside_others and len(prompt_file.object_ids(prompts)) > 1:
        if any(p.mask is not None for p in prompts):
            raise BadInput(
                f"{model}: a mask prompt beside other objects fails in transformers' own "
                f"{family.name} (its score comes back in another shape); prompt with points "
                f"or a box, or track that object alone"
            )


def _check_predictor(predictor, options: dict) -> None:
    """Refuse a predictor given that was built with other tracking options than `options`."""
    if predictor is not None:
        made = tracking_options(predictor)
        wanted = {k: options[k] for k in made}
        if made != wanted:
            raise BadInput(
                f"the predictor given was built with {made}, the tracking asks for {wanted}"
            )


def _prepare_passes(
    store: RunStore,
    plan: ChunkPlan,
    prompts: list,
    settings: dict,
    direction: str,
    again: bool,
    quiet: bool,
    space=None,
    env: tuple[environment.Work, bool] | None = None,
) -> list[str]:
    """Check the source is there if needed, the space and the environment (`env`: where
    the work computes, and whether another than the store's is allowed), `prepare` the
    tracking; the passes left to run."""
    span = Span.of(settings, plan.num_frames)
    needed = {
        d: span.chunks(plan, d) if again else store.pass_ledger(d).todo(span.chunks(plan, d))
        for d in passes(direction)
    }
    _, prompted = prompt_reads(plan, span, needed, [p.frame for p in prompts])
    missing = ChunkSupply.missing(store, needed, prompted)
    if not set(missing) <= on_disk(store, "frames"):
        stored_source(store)  # before anything changes: the source must be there
    if space is not None and any(needed.values()):
        space.before_track(store)
    if env is not None and any(needed.values()):
        environment.check(store, *env, quiet)
    prepare(store, prompts, settings, again, quiet)
    return [
        d for d in passes(direction) if store.pass_ledger(d).count() < len(span.chunks(plan, d))
    ]


def _say_tracked(store: RunStore, prompts: list, quiet: bool) -> None:
    """Say the tracking is done (and that hole filling was skipped, without sam2's _C)."""
    if (
        importlib.util.find_spec("sam2._C") is None
        and not family_of(store.attrs["model"]["name"]).session_tracker
    ):
        log.info(
            "note: sam2 has no _C extension here, so small-hole filling was skipped "
            "(as SAM 2's own predictor does)",
            quiet,
        )
    log.result(
        f"track: masks for {len(prompt_file.object_ids(prompts))} objects in {store.path}", quiet
    )


def run_passes(
    store: RunStore,
    predictor,
    prompts: list,
    pending: list[str],
    on_commit=None,
    batch_size: int = 1,
    quiet: bool = False,
    groups=1,
) -> None:
    """Run the passes `pending` of the store's tracking (prepared, with its settings recorded)
    one after the other, each in `groups` groups of objects one after another (an int), or
    in the one group of object slots given (a Dask task's). Chunks without features are
    encoded as the passes reach them, with a bar of their own."""
    settings = stored_settings(store)
    plan = store.plan
    span = Span.of(settings, plan.num_frames)
    together = family_of_predictor(predictor).session_tracker  # its objects go together
    units = _units(store, plan, span, pending, groups, settings["options"], together)
    todo = {u: object_todo(store, u[0], g, span.chunks(plan, u[0])) for u, g in units.items()}
    starts = {u: c[0] == span.chunks(plan, u[0])[0] for u, c in todo.items()}
    prompt_chunks = unit_prompt_chunks(plan, prompts, units, starts)
    missing = ChunkSupply.missing(store, todo, set().union(set(), *prompt_chunks.values()))
    say_cost(store, plan, missing, quiet)
    if not units:
        return
    on_commit = _once_the_pass_has_it(store, on_commit)
    frames = sum(hi - lo for lo, hi in map(plan.bounds, missing))
    with (
        log.progress("encode", frames, quiet or not missing) as bar,
        ChunkSupply(store, predictor, todo, prompt_chunks, batch_size, bar) as supply,
    ):
        supply.ensure(next(iter(todo.values()))[0])  # the features' shapes are known then,
        supply.written()  # and the level arrays made (their kinds: positional encodings)
        run = _run_sessions if family_of_predictor(predictor).session_tracker else _run_trackers
        run(store, predictor, prompts, units, supply, span, settings, on_commit, quiet)


def _run_trackers(store, predictor, prompts, units, supply, span, settings, on_commit, quiet):
    """The passes of SAM 2 (`stages.track.tracker`), group after group."""
    from segpipe.stages.track.tracker import StoredFeatures, Tracker, positional_encodings, shown_by

    precision = store.attrs["model"]["precision"]
    vision_pos, maskmem_pos = positional_encodings(predictor, store, precision)
    features = StoredFeatures(store, predictor.device, vision_pos, supply.held)
    for (d, _), slots in units.items():
        tracker = Tracker(
            predictor,
            store,
            store.plan,
            d,
            prompts,
            features,
            maskmem_pos,
            supply,
            span,
            settings["options"],
            on_commit,
            slots,
        )
        # the precision the embeddings were made in: SAM 2's GPU usage is bfloat16 autocast
        with autocast(predictor.device.type, precision), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cannot import name '_C'")
            tracker.run(shown_by(settings["direction"], d, span.start), quiet)


def _run_sessions(store, predictor, prompts, units, supply, span, settings, on_commit, quiet):
    """The passes of a family tracked in its own inference session (`stages.track.session`),
    every object in one group."""
    from segpipe.stages.track.session import SessionTracker
    from segpipe.stages.track.tracker import StoredFeatures, shown_by

    features = StoredFeatures(store, predictor.device, [], supply.held)
    for (d, _), slots in units.items():
        assert slots == list(range(len(prompt_file.object_ids(prompts)))), "one group"
        tracker = SessionTracker(
            predictor,
            store,
            store.plan,
            d,
            prompts,
            features,
            supply,
            span,
            settings["options"],
            on_commit,
        )
        tracker.run(shown_by(settings["direction"], d, span.start), quiet)


def _units(
    store: RunStore, plan: ChunkPlan, span: Span, pending, groups, options, together=False
) -> dict:
    """The groups of objects each pass runs, by (direction, first slot): `groups` groups
    (an int) of the objects with chunks to do, or the one group of slots given (a Dask
    task's); one group of every object where they go `together` (a family tracked in
    its own session)."""
    units = {}
    for d in pending:
        chunks = span.chunks(plan, d)
        if isinstance(groups, int):
            # under --keep masks one group here: groups read each chunk's features once
            # each, which would then all be written; objects ahead of others (a run in
            # groups that stopped) redo their chunks, bit for bit
            one = together or keep_setting(store) == "masks"
            parts = object_groups(store, d, chunks, groups, options, one)
        elif together or coupled(options):  # every object together, whatever each has
            parts = [list(groups)] if object_todo(store, d, list(groups), chunks) else []
        else:
            parts = cut(store, d, chunks, list(groups))
        units.update({(d, g[0]): g for g in parts})
    return units


def _once_the_pass_has_it(store: RunStore, on_commit):
    """`on_commit(d, k)` called once every group has committed chunk k of pass d."""
    if on_commit is None:
        return None

    def committed(d, k):
        if store.pass_ledger(d).is_done(k):
            on_commit(d, k)

    return committed


def unit_prompt_chunks(plan: ChunkPlan, prompts: list, units: dict, starts: dict) -> dict:
    """Per group of a pass (`units`) that starts from the prompts (`starts`), the chunks of
    its objects' prompted frames, whose features it reads; empty for the others."""
    ids = prompt_file.object_ids(prompts)
    out = {}
    for u, slots in units.items():
        mine = {ids[s] for s in slots}
        frames = {p.frame for p in prompts if p.object_id in mine}
        out[u] = {plan.chunk_of(f) for f in frames} if starts[u] else set()
    return out
