"""The tracking settings a store records: prompts, direction and the options that turn SAM 2's
outputs into masks. Read by track and export (without importing torch)."""

from __future__ import annotations

import math

from segpipe import prompts as prompt_file
from segpipe.errors import BadInput, StoreNotReady
from segpipe.plan import ChunkPlan, Span, passes
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


def stored_settings(store: RunStore) -> dict | None:
    """The recorded tracking settings (the `track` attribute), None before any tracking."""
    return store.attrs.get("track")


def pick_options(store: RunStore, direction: str, **given) -> dict:
    """Options given, else the store's, else SAM 2's predictor defaults; checked."""
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
    options["postprocessing"], options["non_overlap"] = (
        bool(options["postprocessing"]),
        bool(options["non_overlap"]),
    )
    return options


def stored_track(store: RunStore) -> dict:
    settings = stored_settings(store)
    if settings is None:
        raise StoreNotReady(f"store {store.path} has no tracking results yet (run `segpipe track`)")
    return settings


def require_tracked(store: RunStore) -> dict:
    settings = stored_track(store)
    T = store.attrs.get("frame_count")
    plan = ChunkPlan(T, store.attrs["chunk_size"])
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
