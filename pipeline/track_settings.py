"""The tracking settings a store records: prompts, direction and the options that turn SAM 2's
outputs into masks. Read by track and export (without importing torch)."""
from __future__ import annotations

import math

from .errors import BadInput
from .store import RunStore

OBJECT_STARTS = ("earliest", "own")
# How masks are made from SAM 2's outputs: its predictor's defaults. SAM 2's vos_inference
# turns postprocessing off and non-overlap on; with --track_object_appearing_later_in_video
# it tracks each object from its own first mask ("own").
OPTIONS = {"postprocessing": True, "non_overlap": False, "score_threshold": 0.0,
           "object_start": "earliest"}
ABSENT_LOGIT = -1024.0  # an object before its own start, as vos_inference fills it


def stored_settings(store: RunStore) -> dict | None:
    """The recorded tracking settings, options filled in with the defaults of the stores
    that predate them."""
    settings = store.attrs.get("track")
    if settings is None:
        return None
    return {**settings, "options": {**OPTIONS, **settings.get("options", {})}}


def pick_options(store: RunStore, direction: str, **given) -> dict:
    """Options given, else the store's, else SAM 2's predictor defaults; checked."""
    stored = (stored_settings(store) or {}).get("options", OPTIONS)
    options = {**stored, **{k: v for k, v in given.items() if v is not None}}
    if options["object_start"] not in OBJECT_STARTS:
        raise BadInput(f"--object-start must be one of {', '.join(OBJECT_STARTS)}")
    if options["object_start"] == "own" and direction != "forward":
        raise BadInput("--object-start own tracks each object forward from its first prompt: "
                       "use it with --direction forward")
    threshold = options["score_threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise BadInput(f"--score-threshold must be a finite number, got {threshold!r}")
    if options["object_start"] == "own" and threshold <= ABSENT_LOGIT:
        raise BadInput(f"--score-threshold {threshold} would count objects as present before "
                       f"their start (logit {ABSENT_LOGIT}); use a threshold above it")
    options["score_threshold"] = float(threshold)
    options["postprocessing"], options["non_overlap"] = (
        bool(options["postprocessing"]), bool(options["non_overlap"]))
    return options


