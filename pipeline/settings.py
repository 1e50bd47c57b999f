"""Settings as frozen objects, one per concern, each filled in and checked in one place: what
was given, else the store's record, else `DEFAULTS` (a `Decoding` given is held against the
store's record; `defaults.resolve` takes the store's decoding, encoding and output settings,
`Tracking.resolve` its tracking). The command line's options have the fields' names.

- `Decoding`: chunk and image size, a video's stream, a frame folder's or stack's rate.
- `Encoding`: the model, its weights, and how frames become features (batch size, dtype,
  precision).
- `Tracking`: direction, window and the options that turn SAM 2's outputs into masks.
- `Output`: what the store keeps and which exports `run` writes.
- `Execution`: where and how this call runs (device, Dask, progress, the space check,
  starting over, another environment); never recorded in the store.

The API takes them as objects (`segpipe.run(video, store, prompts, decoding=Decoding(...),
...)`), the command line builds them from its options (`from_options`), and the encode and
track stages take them too (see docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from segpipe.errors import BadInput

if TYPE_CHECKING:
    from segpipe.store.runstore import RunStore

# The values segpipe offers: the stored features' dtypes, SAM 2's precisions.
DTYPES = ("float32", "float16", "bfloat16")
PRECISIONS = ("float32", "bfloat16")

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
        _positive("--chunk-size", self.chunk_size)
        _positive("--image-size", self.image_size)
        if self.image_size is not None and self.image_size % 32 and self.image_size % 14:
            raise BadInput(
                f"--image-size must be a multiple of 32 (SAM 2, EdgeTAM) or of 14 (SAM 3's "
                f"tracker), got {self.image_size}"
            )
        return self

    def sizes(self) -> tuple[int, int]:
        """(chunk size, image size) of a new store."""
        return self.chunk_size or DEFAULTS["chunk_size"], self.image_size or DEFAULTS["image_size"]

    def against(self, store: "RunStore") -> None:
        """Each setting given must be the store's (`StoreMismatch` names the first that is
        not)."""
        had = recorded(store, Decoding)
        for name, was, given in (
            ("chunk_size", had.chunk_size, self.chunk_size),
            ("image_size", had.image_size, self.image_size),
            ("--stream", had.stream, self.stream),
            ("--fps", had.fps, None if self.fps is None else float(self.fps)),
        ):
            if given is not None:
                store.require(name, was, given)


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
    # noun phrases whose every instance SAM 3's concept model finds and tracks
    # (`stages.track.concepts`): forward from frame 0, over the whole video
    concepts: tuple = ()

    def resolve(self, store: "RunStore", prompts: list | None) -> "ResolvedTracking":
        """Given, else the store's, else the default; checked against the video and (the
        window) against the passes from the earliest of `prompts`."""
        if self.concepts:
            return self._resolve_concepts(store)
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

    def check_concepts(self) -> tuple[str, ...]:
        """The concepts, checked with what goes with them (no store needed: `run` checks
        them before it decodes)."""
        if isinstance(self.concepts, str):
            raise BadInput("concepts is a list of phrases, e.g. concepts=('fish',)")
        concepts = tuple(str(c).strip() for c in self.concepts)
        if not concepts:
            raise BadInput("no concept given: name what to find, e.g. --concept fish")
        if not all(concepts):
            raise BadInput("--concept is empty: name what to find, e.g. --concept fish")
        if len(set(concepts)) < len(concepts):
            raise BadInput("a --concept is given twice")
        if self.direction not in (None, "forward"):
            raise BadInput("concept prompts track forward from frame 0 (--direction forward)")
        if self.frames is not None:
            raise BadInput("concept prompts track the whole video (no --frames)")
        for name in ("non_overlap", "object_start", "object_batch"):
            if getattr(self, name) not in (None, False, 1, "first"):
                raise BadInput(f"--{name.replace('_', '-')} is SAM 2's, not for concept prompts")
        return concepts

    def _resolve_concepts(self, store: "RunStore") -> "ResolvedTracking":
        """A concept tracking's: forward from frame 0 over the whole video (transformers'
        `Sam3VideoModel` propagates so), SAM 2's options as recorded, unused."""
        from segpipe.store.tracking import resolve_options

        concepts = self.check_concepts()
        given = {k: getattr(self, k) for k in ("postprocessing", "score_threshold")}
        options = resolve_options(store, "forward", given)
        return ResolvedTracking("forward", options, None, concepts)


@dataclass(frozen=True)
class ResolvedTracking:
    """A tracking's settings, filled in and checked: the direction, the options (as the
    store records them), the window ([lo, hi); None: the whole video) and the concepts
    (empty: the prompts' objects are tracked)."""

    direction: str
    options: dict
    window: list | None
    concepts: tuple = ()


def _positive(name: str, value) -> None:
    if value is not None and (
        isinstance(value, bool) or not hasattr(value, "__index__") or value < 1
    ):
        raise BadInput(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Encoding:
    """The model and how it encodes (None: the store's, else `DEFAULTS`): `model` (a name of
    `segpipe.model.MODELS`), its weights (`checkpoint`: an official checkpoint file, or
    "hf:facebook/sam2.1-hiera-tiny"; or `random_weights=SEED`, tests and demos
    only), `batch_size` frames through the image encoder at once, `embedding_dtype` of the
    stored features, `precision` ("bfloat16": SAM 2 under bfloat16 autocast, the default on
    CUDA; "float32" elsewhere)."""

    model: str | None = None
    checkpoint: str | None = None
    random_weights: int | None = None
    batch_size: int = 1
    embedding_dtype: str | None = None
    precision: str | None = None

    def check(self) -> "Encoding":
        """Refuses values that cannot be (before anything is read or written)."""
        _positive("--batch-size", self.batch_size)
        if self.embedding_dtype is not None and self.embedding_dtype not in DTYPES:
            raise BadInput(f"--embedding-dtype must be one of {', '.join(DTYPES)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise BadInput(
                f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        return self

    def filled(self) -> "Encoding":
        """`DEFAULTS` in place of the model and dtype not given (once the store's are in:
        `defaults.resolve`). The precision stays None: the store's, else the device's."""
        return replace(
            self,
            model=self.model or DEFAULTS["model"],
            embedding_dtype=self.embedding_dtype or DEFAULTS["embedding_dtype"],
        )


@dataclass(frozen=True)
class Output:
    """What a run leaves: `keep` and `exports`.

    `keep`: "all" (frames and features stay: re-prompting then costs no encoding, and the
    chunks no pass needed are encoded at the end), "masks" (a chunk's frames are dropped
    once encoded, and its features are written only where a later read needs them, the
    prompted chunks, and dropped once every pass has tracked them, so a long video needs a
    few chunks of them on disk; the video is then decoded twice, once to count and time its
    frames, and again chunk by chunk as the passes need them; the storage estimate counts
    frames and features as the 3 chunks of each such a run holds at once), or None (the
    store's, else "all").

    `exports`: `run`'s formats, written into `<store name>.export/` beside the store as
    chunks are final (None: the registry's defaults; () for none)."""

    keep: str | None = None
    exports: tuple | None = None

    def check(self, registered) -> "Output":
        """Refuses an unknown keep setting, or an export format not in `registered` (the
        export registry's names: `stages.export.formats`, a layer above)."""
        from segpipe.store.retention import check_keep

        check_keep(self.keep)
        if isinstance(self.exports, str):
            raise BadInput(f"exports must be a list of formats, got the string {self.exports!r}")
        unknown = [f for f in self.exports or () if f not in registered]
        if unknown:
            raise BadInput(
                f"unknown export format {unknown[0]!r}; choose from {', '.join(registered)}"
            )
        return self

    def formats(self, defaults) -> list[str]:
        """The formats `run` exports (`defaults`: the registry's, where none are given)."""
        return list(defaults) if self.exports is None else list(self.exports)


@dataclass(frozen=True)
class Execution:
    """Where and how one call runs; none of it is recorded in the store. `device` ("auto":
    CUDA, else MPS, else the CPU), `workers=N` (a local Dask cluster of N processes) or
    `scheduler="tcp://..."` (that Dask scheduler's workers), `groups` of objects tracked
    side by side there, `progress` bars, `space_check` (refuse when the disk lacks the
    space the estimate needs), `force` (start over a store made otherwise, or track anew),
    `allow_env_change` (go on in another compute environment than the store's: the results
    are then no longer bit-identical; see `segpipe.environment`)."""

    device: str = "auto"
    workers: int | None = None
    scheduler: str | None = None
    groups: int | None = None
    progress: bool = True
    space_check: bool = True
    force: bool = False
    allow_env_change: bool = False

    @property
    def quiet(self) -> bool:
        return not self.progress

    @property
    def on_dask(self) -> bool:
        return self.workers is not None or self.scheduler is not None

    def check(self) -> "Execution":
        """Refuses a count below one, and Dask named twice."""
        _positive("--workers", self.workers)
        _positive("--groups", self.groups)
        if self.workers is not None and self.scheduler is not None:
            raise BadInput("give --workers or --scheduler, not both")
        return self


SETTINGS = (Decoding, Encoding, Tracking, Output, Execution)


@dataclass(frozen=True)
class Settings:
    """A whole run's settings, one object of each concern."""

    decoding: Decoding = Decoding()
    encoding: Encoding = Encoding()
    tracking: Tracking = Tracking()
    output: Output = Output()
    execution: Execution = Execution()

    @classmethod
    def of(cls, decoding=None, encoding=None, tracking=None, output=None, execution=None):
        """The settings given, the defaults' objects for those not given (None)."""
        return cls(
            decoding or Decoding(),
            encoding or Encoding(),
            tracking or Tracking(),
            output or Output(),
            execution or Execution(),
        )


def from_options(options: dict, *kinds) -> dict:
    """The settings objects of `kinds` (all of `SETTINGS` when none is named), each from the
    entries of `options` (a command's click options, or keywords) that bear one of its
    fields' names; `quiet` and `no_space_check`, the command line's flags said the other way
    round, are `Execution`'s `progress` and `space_check`. Keyed by the API's argument
    names (`decoding`, `encoding`, ...). An entry no setting takes is an error (a
    command's option that nothing would read)."""
    options = dict(options)
    if "quiet" in options:
        options["progress"] = not options.pop("quiet")
    if "no_space_check" in options:
        options["space_check"] = not options.pop("no_space_check")
    made = {}
    for kind in kinds or SETTINGS:
        given = {f.name: options.pop(f.name) for f in fields(kind) if f.name in options}
        made[kind.__name__.lower()] = kind(**given)
    if options:
        raise TypeError(f"options no setting takes: {', '.join(options)}")
    return made


# -- the store's record of its settings (schema 5) ----------------------------------------


def record(decoding: Decoding) -> dict:
    """The store attributes that record `decoding` (filled in): its sizes, as "decoding".
    The one writing of a store's settings, with `retention.set_keep` (the "output" record);
    the stream and rate decoded are the "video" record's, the model the "model" record's,
    the tracking the "track" record's: what was computed, with more than the settings."""
    return {"decoding": {"chunk_size": decoding.chunk_size, "image_size": decoding.image_size}}


def recorded(store: "RunStore", kind):
    """The `kind` of settings (`Decoding`, `Encoding`, `Output`) the store records, None where
    it has none yet: the one reading of a store's record as settings. `Encoding` is the
    model record's (its seed, not its checkpoint: a checkpoint is given each time)."""
    attrs = store.attrs
    if kind is Decoding:
        video, sizes = attrs.get("video") or {}, attrs.get("decoding")
        if sizes is None:
            return None
        return Decoding(
            sizes["chunk_size"], sizes["image_size"], video.get("stream"), video.get("fps")
        )
    if kind is Encoding:
        spec = attrs.get("model")
        if spec is None:
            return None
        return Encoding(
            spec["name"],
            None,
            spec["weights"].get("random_seed"),
            embedding_dtype=spec["embedding_dtype"],
            precision=spec["precision"],
        )
    if kind is Output:
        from segpipe.store.retention import keep_setting

        return Output(keep_setting(store))
    raise TypeError(f"a store records no {kind.__name__} as such (see `Tracking.resolve`)")
