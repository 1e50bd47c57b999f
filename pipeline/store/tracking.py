"""The tracking settings a store records: prompts, direction and the options that turn SAM 2's
outputs into masks. Read by track and export (without importing torch)."""

from __future__ import annotations

import math

from segpipe import prompts as prompt_file
from segpipe.errors import BadInput, StoreNotReady
from segpipe.plan import ChunkPlan, Span, frame_window, passes
from segpipe.store.layout import require_decoded
from segpipe.store.runstore import RunStore

OBJECT_STARTS = ("earliest", "own")
# How masks are made from SAM 2's outputs: its predictor's defaults. SAM 2's vos_inference
# turns postprocessing off and non-overlap on; with --track_object_appearing_later_in_video
# it tracks each object from its own first mask ("own").
OPTIONS = {
    "postprocessing": True,
    "non_overlap": False,
    "score_threshold": 0.0,
    "object_start": "earliest",
}
ABSENT_LOGIT = -1024.0  # an object before its own start, as vos_inference fills it
DIRECTIONS = ("both", "forward", "reverse")


# The prompts the next tracking without new prompts takes, where they are not the tracked
# ones: what segpipe studio saves as they are edited (a prompts file, masks inline), in the
# store's folder. A tracking that starts anew removes it (its prompts are then the store's).
DRAFT = "prompts.json"


def draft_prompts(store: RunStore) -> list | None:
    """The saved draft's prompts (checked as any prompts file), None without one."""
    path = store.path / DRAFT
    if not path.is_file():
        return None
    video = store.attrs["video"]
    try:
        return prompt_file.load(path, store.frame_count, video["width"], video["height"])
    except BadInput as e:
        raise BadInput(
            f"segpipe studio's saved prompts {path} are not valid ({e.message}): "
            f"fix or delete that file (the tracked prompts are kept apart)"
        ) from None


def next_prompts(store: RunStore) -> list:
    """What a tracking without new prompts tracks: the draft, else the last tracked prompts."""
    draft = draft_prompts(store)
    return draft if draft is not None else stored_prompts(store)


def save_draft(store: RunStore, entries: list[dict]) -> None:
    """Save prompts-file entries (masks inline) as the store's draft, atomically; none: the
    draft goes (the tracked prompts are the store's again)."""
    import json

    from segpipe.fsutil import atomic_write, fsync_path_dir

    path = store.path / DRAFT
    if entries:
        atomic_write(path, json.dumps({"prompts": entries}, indent=1).encode())
    else:
        path.unlink(missing_ok=True)
    fsync_path_dir(store.path)


def drop_draft(store: RunStore) -> bool:
    """Remove the draft (durably); whether there was one."""
    from segpipe.fsutil import fsync_path_dir

    path = store.path / DRAFT
    if not path.is_file():
        return False
    path.unlink()
    fsync_path_dir(store.path)
    return True


def stored_settings(store: RunStore) -> dict | None:
    """The recorded tracking settings (the `track` attribute), None before any tracking."""
    return store.attrs.get("track")


def resolve_options(store: RunStore, direction: str, given: dict) -> dict:
    """Options given (None: not given), else the store's, else SAM 2's predictor defaults
    (`OPTIONS`); checked. `settings.Tracking.resolve` is what calls it."""
    stored = (stored_settings(store) or {}).get("options", OPTIONS)
    options = {**stored, **{k: v for k, v in given.items() if v is not None}}
    if options["object_start"] not in OBJECT_STARTS:
        raise BadInput(f"--object-start must be one of {', '.join(OBJECT_STARTS)}")
    if options["object_start"] == "own" and direction != "forward":
        raise BadInput(
            "--object-start own tracks each object forward from its first prompt: "
            "use it with --direction forward"
        )
    threshold = options["score_threshold"]
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
    ):
        raise BadInput(f"--score-threshold must be a finite number, got {threshold!r}")
    if options["object_start"] == "own" and threshold <= ABSENT_LOGIT:
        raise BadInput(
            f"--score-threshold {threshold} would count objects as present before "
            f"their start (logit {ABSENT_LOGIT}); use a threshold above it"
        )
    options["score_threshold"] = float(threshold)
    batch = options.pop("object_batch", 1)  # recorded only when on: 1 is no setting
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BadInput(f"--object-batch must be a positive integer, got {batch!r}")
    if batch > 1:
        options["object_batch"] = batch
    options["postprocessing"], options["non_overlap"] = (
        bool(options["postprocessing"]),
        bool(options["non_overlap"]),
    )
    return options


def tracking_window(store: RunStore, frames, prompts: list, direction: str, options: dict):
    """The tracking window [lo, hi) asked for (None: the store's), checked against the video
    and the passes; None when it is the whole video."""
    T = store.frame_count
    if frames is None:
        frames = (stored_settings(store) or {}).get("frames")
        if frames is None:
            return None
    lo, hi = frame_window(frames, T)
    if (lo, hi) == (0, T):
        return None
    if options["object_start"] == "own":
        raise BadInput("--frames cannot be combined with --object-start own")
    span = Span(min(p.frame for p in prompts), lo, hi)
    if not any(span.count_in(d, lo, hi) for d in passes(direction)):
        raise BadInput(
            f"--frames {lo}:{hi}: no {direction} pass from the earliest prompt "
            f"(frame {span.start}) reaches those frames"
        )
    return [lo, hi]


def preview_options(store: RunStore, direction: str) -> dict:
    """The options a preview of one frame depends on: the store's (`resolve_options`), less the
    object batch (how a tracking computes, not what a frame shows): changing it alone
    rebuilds no model."""
    options = resolve_options(store, direction, {})
    options.pop("object_batch", None)
    return options


def tracked_ids(store: RunStore, settings: dict | None = None) -> list[int]:
    """The ids of the objects tracked, in the results' object order: the prompts' objects,
    or a concept tracking's instances found so far (`stages.track.concepts`: transformers'
    ids + 1, in the order they appeared)."""
    settings = stored_settings(store) if settings is None else settings
    if settings is None:
        return []
    if settings.get("concepts"):
        masks = store.array("masks")
        return [] if masks is None else list(masks.attrs.get("object_ids", []))
    return list(settings["object_ids"])


def stored_track(store: RunStore) -> dict:
    settings = stored_settings(store)
    if settings is None:
        raise StoreNotReady(f"store {store.path} has no tracking results yet (run `segpipe track`)")
    return settings


def require_tracked(store: RunStore) -> dict:
    settings = stored_track(store)
    T = require_decoded(store)
    plan = ChunkPlan(T, store.chunk_size)
    for d in passes(settings["direction"]):
        if store.pass_ledger(d).count() < len(Span.of(settings, T).chunks(plan, d)):
            raise StoreNotReady(
                f"store {store.path}: tracking is not finished (run `segpipe track`)"
            )
    return settings


def stored_prompts(store: RunStore) -> list:
    settings = store.attrs.get("track")
    if settings is None:
        raise StoreNotReady(f"store {store.path} has no prompts yet: pass --prompts")
    masks = store.read("prompt_masks") if store.array("prompt_masks") is not None else None
    return prompt_file.from_record(settings["prompts"], masks)
