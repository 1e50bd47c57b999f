"""Settings as frozen objects, one per concern, each filled in and checked in one place: what
was given, else the store's record, else `DEFAULTS` (a `Decoding` given is held against the
store's record; `defaults.fill` takes the store's for `run`). The command line's options and the
API's keywords have the fields' names.

- `Decoding`: chunk and image size, a video's stream, a frame folder's or stack's rate.
- `Tracking`: direction, window and the options that turn SAM 2's outputs into masks.

(The model's and the encoding's settings, the output's and the execution's are still
threaded as keywords: see docs/architecture.md.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from segpipe.errors import BadInput

if TYPE_CHECKING:
    from segpipe.store.runstore import RunStore

# The defaults, where neither the command nor the store says (the tracking options' are SAM
# 2's predictor's: `store.tracking.OPTIONS`).
DEFAULTS = {
    "chunk_size": 32,
    "image_size": 1024,
    "model": "sam2.1_hiera_t",
    "embedding_dtype": "float32",
    "keep": "all",
    "direction": "both",
}


@dataclass(frozen=True)
class Decoding:
    """How a source becomes the store's frames (None: the store's, else `DEFAULTS`)."""

    chunk_size: int | None = None
    image_size: int | None = None
    stream: int | None = None  # a video file's stream number (None: its default stream)
    fps: float | None = None  # a frame folder's or TIFF stack's rate (None: 24)

    def check(self) -> "Decoding":
        """Refuses sizes that cannot be (before anything is read or written)."""
        for name, value in (("--chunk-size", self.chunk_size), ("--image-size", self.image_size)):
            if value is not None and (
                isinstance(value, bool) or not hasattr(value, "__index__") or value < 1
            ):
                raise BadInput(f"{name} must be a positive integer, got {value!r}")
        if self.image_size is not None and self.image_size % 32:
            raise BadInput(
                f"--image-size must be a multiple of 32 (SAM 2's stride), got {self.image_size}"
            )
        return self

    def sizes(self) -> tuple[int, int]:
        """(chunk size, image size) of a new store."""
        return self.chunk_size or DEFAULTS["chunk_size"], self.image_size or DEFAULTS["image_size"]

    def against(self, store: "RunStore") -> None:
        """Each setting given must be the store's (`StoreMismatch` names the first that is
        not)."""
        attrs = store.attrs
        for name, recorded, given in (
            ("chunk_size", attrs["chunk_size"], self.chunk_size),
            ("image_size", attrs["image_size"], self.image_size),
            ("--stream", attrs["video"].get("stream"), self.stream),
            ("--fps", attrs["video"]["fps"], None if self.fps is None else float(self.fps)),
        ):
            if given is not None:
                store.require(name, recorded, given)


@dataclass(frozen=True)
class Tracking:
    """What a tracking computes, as given to `track`, `run`, the studio or a dataset. None is
    the store's recorded setting, else the default: direction "both", the whole video,
    `OPTIONS`, one object at a time. `resolve` is the one place they are filled in and
    checked."""

    direction: str | None = None
    frames: object = None  # the window: "A:B", "A:", ":B", a slice or (A, B or None)
    postprocessing: bool | None = None
    non_overlap: bool | None = None
    score_threshold: float | None = None
    object_start: str | None = None
    object_batch: int | None = None

    def resolve(self, store: "RunStore", prompts: list | None) -> "ResolvedTracking":
        """Given, else the store's, else the default; checked against the video and (the
        window) against the passes from the earliest of `prompts`."""
        from segpipe.store.tracking import (
            DIRECTIONS,
            OPTIONS,
            resolve_options,
            stored_settings,
            tracking_window,
        )

        recorded = stored_settings(store) or {}
        direction = self.direction or recorded.get("direction", DEFAULTS["direction"])
        if direction not in DIRECTIONS:
            raise BadInput(f"--direction must be one of {', '.join(DIRECTIONS)}")
        given = {k: getattr(self, k) for k in (*OPTIONS, "object_batch")}
        options = resolve_options(store, direction, given)
        window = (
            None
            if prompts is None
            else tracking_window(store, self.frames, prompts, direction, options)
        )
        return ResolvedTracking(direction, options, window)


@dataclass(frozen=True)
class ResolvedTracking:
    """A tracking's settings, filled in and checked: the direction, the options (as the
    store records them) and the window ([lo, hi); None: the whole video)."""

    direction: str
    options: dict
    window: list | None
