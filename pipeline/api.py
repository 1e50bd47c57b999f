"""The Python API: the four stages, `run`, `label`, `repair`, `dataset`, `studio` and `open`.

Each call takes its inputs and the settings objects of `segpipe.settings` it uses
(`Decoding`, `Encoding`, `Tracking`, `Output`, `Execution`; each field None: the store's
setting, else the default), the same names as the command line's options. Each stage
takes the store's lock (one writer per store), resumes where the store stopped, shows a
progress bar (tqdm's auto mode: a widget in Jupyter; `Execution(progress=False)` turns it
off) and raises `segpipe.SegpipeError` subclasses. Heavy modules (torch, SAM 2) are
imported only by the calls that need them, so `import segpipe` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from segpipe import defaults, log
from segpipe.errors import BadInput
from segpipe.estimate import Later
from segpipe.models.registry import family_of
from segpipe.results import Run
from segpipe.settings import (
    DEFAULTS,
    Decoding,
    Encoding,
    Execution,
    Output,
    Settings,
    Tracking,
)
from segpipe.space import SpaceGuard
from segpipe.store.layout import export_folder  # noqa: F401 - segpipe.api.export_folder
from segpipe.store.runstore import RunStore


def open(store) -> Run:  # noqa: A001 - segpipe.open, as the API names it
    """The results in `store`, read only.

    Example:
        >>> run = segpipe.open("clip.zarr")
        >>> run.masks(frames=slice(0, 10)).shape
    """
    return Run(store)


def decode(
    video, store, *, decoding: Decoding | None = None, execution: Execution | None = None
) -> Run:
    """Decode `video` (a video file, a folder of JPEG/PNG frames named by number, as SAM 2
    reads them, or a TIFF stack) into the store's model-input frames, upright (a phone's
    rotation applied).

    `decoding`: `chunk_size` (default 32) frames make the unit of work and storage;
    `image_size` (default 1024) is SAM 2's input size; `stream` the video stream of a file
    with several (default: the container's default); `fps` a frame folder's rate (default
    24). `execution.force` starts over a store made from another video or with other
    settings instead of refusing.

    Before writing, the storage estimate is shown (see `segpipe.estimate`) and, with
    `execution.space_check`, `NotEnoughSpace` is raised when the store's file system has
    less free space than the frames need.

    Example:
        >>> segpipe.decode("clip.mp4", "clip.zarr", decoding=segpipe.Decoding(chunk_size=32))
    """
    from segpipe.stages.decode import decode as decode_stage

    decoding, execution = (decoding or Decoding()).check(), (execution or Execution()).check()
    quiet = execution.quiet
    space = SpaceGuard(store, ("decode",), "decode", enabled=execution.space_check, quiet=quiet)
    decode_stage(
        Path(video), Path(store), decoding, quiet=quiet, force=execution.force, space=space
    )
    return Run(store)


def encode(store, *, encoding: Encoding | None = None, execution: Execution | None = None) -> Run:
    """Compute SAM 2's image embeddings of every decoded frame.

    `encoding`: the model and its weights (`checkpoint`: an official checkpoint file, or
    "hf:facebook/sam2.1-hiera-tiny"; or `random_weights=SEED`, tests and demos only: masks
    mean nothing), `precision` ("bfloat16" runs SAM 2 under bfloat16 autocast, as SAM 2
    runs on GPUs, the default on CUDA; "float32" without, the default elsewhere; tracking
    uses the same), `batch_size`, `embedding_dtype`.

    Before writing, the storage estimate is shown and, with `execution.space_check`,
    `NotEnoughSpace` is raised when the store's file system has less free space than the
    features need.

    `execution`: `workers=N` encodes on a local Dask cluster of N processes,
    `scheduler="tcp://..."` on the workers of that Dask scheduler (see `segpipe.dask`);
    `allow_env_change` goes on in another compute environment than the store was computed
    in (device, library versions, CPU thread count or ISA level), which is otherwise
    refused (`EnvironmentChanged`): the results are then no longer bit-identical to an
    uninterrupted run (see `segpipe.environment`).

    Example:
        >>> segpipe.encode("clip.zarr", encoding=segpipe.Encoding(checkpoint="sam2.1_hiera_tiny.pt"))
    """
    from segpipe.dask.client import connect
    from segpipe.stages.encode import encode as encode_stage

    encoding, execution = (encoding or Encoding()).check(), (execution or Execution()).check()
    _, encoding, _ = defaults.resolve(store, "encode", execution.quiet, encoding=encoding)
    space = SpaceGuard(
        store,
        ("decode", "encode"),
        "encode",
        Later(model=encoding.model),
        enabled=execution.space_check,
        quiet=execution.quiet,
    )
    with connect(execution, store, [encoding.checkpoint]) as cluster:
        encode_stage(store, encoding, execution, space=space, cluster=cluster)
    return Run(store)


def track(
    store,
    prompts=None,
    *,
    tracking: Tracking | None = None,
    encoding: Encoding | None = None,
    execution: Execution | None = None,
) -> Run:
    """Track the prompted objects through the video from the stored embeddings.

    `prompts`: a prompts file path, a list of its entries (dicts), or `segpipe.Prompt`
    objects; None takes the store's (the prompts segpipe studio saved, else the last
    tracked ones). New prompts or settings discard the old tracking and retrack.

    `tracking` (each None: the store's, else SAM 2's predictor's default): `direction`
    ("both", "forward" or "reverse"); `postprocessing` (SAM 2's apply_postprocessing,
    default on), `non_overlap` (each pixel to the highest-scoring object, default off),
    `score_threshold` (mask = logit above it, default 0.0), `object_start` ("earliest":
    every object from the earliest prompt, as SAM 2's predictor; "own": each from its own
    first prompt, empty before, forward only, as vos_inference's
    --track_object_appearing_later_in_video); `frames`, the tracking window, (A, B) or
    "A:B" (the whole video by default): only frames A..B-1 are tracked, as SAM 2's
    `propagate_in_video(start_frame_idx, max_frame_num_to_track)` tracks them (see
    `segpipe.plan.Span`), and prompts outside it still condition the tracking;
    `object_batch` (default 1): up to that many objects of a frame through SAM 2's step at
    once, as SAM 2's legacy predictor batches them, for a GPU that one object's step leaves
    idle: not bit for bit SAM 2's predictor (a few pixels differ;
    `benchmarks/bench_objects.py` measures it), and the objects then run as one group.

    `encoding`: only its `checkpoint` (the store records the rest). `execution`: `workers`
    / `scheduler` track on Dask (as `encode`), the forward and reverse passes side by side,
    each in `groups` groups of objects (default: one per worker; one under `non_overlap`
    and `object_batch`), which give the same masks (SAM 2 tracks each object alone);
    without Dask the groups run one after another. `force` tracks anew;
    `allow_env_change` as `encode`'s.

    Example:
        >>> segpipe.track("clip.zarr", [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])])
    """
    from segpipe.dask.client import connect
    from segpipe.stages.track.stage import track as track_stage

    tracking, encoding = tracking or Tracking(), encoding or Encoding()
    execution = (execution or Execution()).check()
    with connect(execution, store, [encoding.checkpoint]) as cluster:
        track_stage(store, prompts, tracking, encoding, execution, cluster=cluster)
    return Run(store)


def label(store, labels, *, replace: bool = False) -> Run:
    """Name the store's objects (and give them a class): `labels`, a labels file path or a
    list of `segpipe.Label`s (or the file's entries), `{"objects": [{"id": 1, "name": "left
    mouse", "class": "mouse"}]}` (see `segpipe.labels`). Recorded over the store's labels of
    other ids (`replace`: the store then holds only these). No tracking is redone; the
    exports that show names (CVAT, vis-json, DAVIS's labels.json) are redone when next made.
    A prompts file's "objects" are recorded as `track` and `run` take its prompts.

    Example:
        >>> segpipe.label("clip.zarr", [segpipe.Label(1, "left mouse", "mouse")])
    """
    from segpipe.labels import load
    from segpipe.store.labels import save
    from segpipe.store.lock import store_lock

    given = load(labels)  # checked before the store is touched
    with store_lock(store):
        save(RunStore.open(store), given, replace=replace)
    return Run(store)


def export(
    store,
    format: str,
    out,
    *,
    frames: slice | str | None = None,  # noqa: A002
    objects: Sequence[int] | str | None = None,
    per_object: bool = False,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Export the tracked masks: "davis" (a folder of indexed PNGs), "vis-json"
    (YouTube-VIS RLE JSON), "overlay" (an MP4), "frames" (the overlay as a folder of JPEGs),
    "cvat" (CVAT for video 1.1 XML, one mask track per object), or any format registered
    (`segpipe.stages.export.formats`). Returns the output path. `per_object` (davis): one
    folder of 0/1 PNGs per object, `<id:03d>/<frame>.png` (SA-V's layout; ids need not fit
    1..255). A single-file format given a folder (an existing one, or a path ending in "/")
    writes into it, as `masks.json`, `overlay.mp4` or `annotations.xml`.

        Example:
            >>> segpipe.export("clip.zarr", "davis", "clip_davis/", frames=slice(0, 300), objects=[1])
    """
    from segpipe.stages.export.stage import FORMATS
    from segpipe.stages.export.stage import export as export_stage

    single = format in FORMATS and FORMATS[format].single_file
    if single and (str(out).endswith("/") or Path(out).is_dir()):
        out = Path(out) / FORMATS[format].output
    if objects is not None and not isinstance(objects, str):
        objects = ",".join(str(int(o)) for o in objects)
    return export_stage(
        store, format, out, frames, objects, quiet=not progress, force=force, per_object=per_object
    )


def run(
    video,
    store,
    prompts=None,
    *,
    decoding: Decoding | None = None,
    encoding: Encoding | None = None,
    tracking: Tracking | None = None,
    output: Output | None = None,
    execution: Execution | None = None,
) -> Run:
    """Every stage, each resuming where it stopped: decode, then (with `prompts`) the passes
    with each chunk encoded just before a pass tracks it and exported as soon as its masks
    are final. Without prompts: decode and encode. The settings are `decode`'s, `encode`'s
    and `track`'s, and:

    `output.exports`: the formats written into `<store name>.export/` beside the store
    (default davis, vis-json, overlay; () for none). `output.keep`: "all" (the default;
    re-prompting then costs no encoding) or "masks" (a chunk's frames and features are
    dropped once no pass needs them, so a long video needs a few chunks of them on disk;
    see `segpipe.settings.Output`). The setting is the store's from then on.

    Before the first write, the storage estimate of the whole store is shown and, with
    `execution.space_check`, `NotEnoughSpace` is raised when the store's file system has
    less free space than the run still needs.

    `execution.workers=N` (a local Dask cluster of N processes) or `scheduler="tcp://..."`
    (the workers of that Dask scheduler; see `segpipe.dask`): decode here, then every chunk
    encoded on the workers, the forward and reverse passes side by side, each chunk
    exported as its masks are final; the same store and exports. Not with `keep="masks"`.

    Example:
        >>> run = segpipe.run("clip.mp4", "clip.zarr", "prompts.json",
        ...                   encoding=segpipe.Encoding(checkpoint="sam2.1_hiera_tiny.pt"),
        ...                   output=segpipe.Output(exports=["davis"]))
        >>> run.masks(objects=[1])
    """
    from segpipe import runner
    from segpipe.dask.client import connect
    from segpipe.store.lock import store_lock

    given = Settings.of(decoding, encoding, tracking, output, execution)
    settings = runner.settled(video, store, prompts, given)  # before anything is written
    execution = settings.execution
    space = SpaceGuard(
        store,
        ("decode", "encode")
        + (("track",) if prompts is not None or settings.tracking.concepts else ()),
        "run",
        Later.of(settings, prompts),
        enabled=execution.space_check,
        keep=settings.output.keep,
        quiet=execution.quiet,
    )
    with (
        store_lock(store),
        connect(execution, store, [video, settings.encoding.checkpoint]) as cluster,
    ):
        runner.run(video, store, prompts, settings, space=space, cluster=cluster)
    return Run(store)


def repair(store, *, encoding: Encoding | None = None, execution: Execution | None = None) -> list:
    """Find damaged chunks (missing files, failed checksums) and recompute exactly those;
    returns what was found. In the store's compute environment (`encoding.checkpoint`: the
    weights, where the store's are not found; `execution.allow_env_change`: as `encode`).

    Example:
        >>> segpipe.repair("clip.zarr")
    """
    from segpipe.repairs import repair as repair_store

    checkpoint = (encoding or Encoding()).checkpoint
    return repair_store(store, checkpoint, (execution or Execution()).check())


def migrate(store, *, execution: Execution | None = None) -> list[int]:
    """Convert a store of an earlier schema to this segpipe's, in place, keeping its frames,
    features, memory and masks (`segpipe.store.migrate`); the schema versions it went
    through (empty: it was current).

    Example:
        >>> segpipe.migrate("clip.zarr")
    """
    from segpipe.store.migrate import migrate as migrate_store

    return migrate_store(store, (execution or Execution()).quiet)


def dataset(
    base_video_dir,
    input_mask_dir,
    output_mask_dir,
    work_dir,
    *,
    vos=None,
    decoding: Decoding | None = None,
    encoding: Encoding | None = None,
    execution: Execution | None = None,
) -> list:
    """SAM 2's tools/vos_inference.py over a VOS dataset, with its options
    (`vos`: a `segpipe.VosInference`) and output PNGs, one resumable store per video under
    `work_dir`. Returns one `VideoResult` per video (video, frames, objects, seconds,
    status); a video that fails is reported there ("failed: <reason>") and the others go
    on. `decoding`, `encoding`: as `run`'s (the image size by default the one the weights
    were trained at). `execution.workers` / `scheduler`: the videos side by side on Dask
    (as `run`), one task per video.

    Example:
        >>> results = segpipe.dataset("DAVIS/JPEGImages/480p", "DAVIS/Annotations/480p",
        ...                           "out/", "stores/",
        ...                           encoding=segpipe.Encoding(model="segpipe_tiny"))
        >>> [r.status for r in results]
    """
    from segpipe.dask.client import connect
    from segpipe.vos.dataset import Options, VosInference, run_dataset

    encoding = (encoding or Encoding()).check().filled()
    execution = (execution or Execution()).check()
    vos, family = vos or VosInference(), family_of(encoding.model)
    if family.session_tracker and not vos.per_obj_png_file:
        raise BadInput(
            f"{encoding.model}: vos_inference's one mask per pixel (non-overlap) is SAM 2's "
            f"alone so far: give per-object masks with --per-obj-png-file"
        )
    decoding = (decoding or Decoding()).check()
    if decoding.image_size is not None:  # before any download
        family.check_size(encoding.model, decoding.image_size)
    decoding = defaults.sized(decoding, encoding, execution, "dataset")
    family.check_size(encoding.model, decoding.image_size or DEFAULTS["image_size"])
    options = Options(vos, decoding, encoding, execution)
    paths = [base_video_dir, input_mask_dir, encoding.checkpoint]
    with connect(execution, paths=paths) as cluster:
        return run_dataset(
            base_video_dir,
            input_mask_dir,
            output_mask_dir,
            work_dir,
            options,
            quiet=execution.quiet,
            cluster=cluster,
        )


def evaluate(
    results_dir, gt_dir, *, videos: Sequence[str] | None = None, per_obj_png_file: bool = False
):
    """DAVIS 2017 J&F of result PNGs against ground-truth PNGs (see `segpipe evaluate`).

    Example:
        >>> report = segpipe.evaluate("out/", "DAVIS/Annotations/480p")
        >>> report.jf_mean
    """
    from segpipe.vos.davis import evaluate as evaluate_dirs

    return evaluate_dirs(results_dir, gt_dir, videos=videos, per_object_png=per_obj_png_file)


def studio(
    path,
    *,
    store=None,
    host: str = "127.0.0.1",
    port: int = 8765,
    open_page: bool = False,
    decoding: Decoding | None = None,
    encoding: Encoding | None = None,
    execution: Execution | None = None,
) -> None:
    """Serve segpipe studio (prompt, review and correct in the browser) over a store, until
    Ctrl-C. `path`: a store, or a video / frame folder / TIFF stack, first decoded into
    `store` (default `<name>.zarr` beside it; `decoding` as `decode` takes it, the image
    size by default the one the weights were trained at). `encoding`: the model and its
    weights (`model`, `checkpoint`, `random_weights`), for a store not yet encoded (Track
    encodes the chunks as it tracks them). A `host` other than loopback requires the token
    the printed URL carries. `execution`: the `device`; `allow_env_change`: Track goes on
    in another compute environment than the store's (as `track`).

    Example:
        >>> segpipe.studio("clip.mp4", store="clip.zarr",
        ...                encoding=segpipe.Encoding(model="segpipe_tiny"))
    """
    from segpipe.stages.decode import check as check_decode
    from segpipe.web.server import serve

    decoding, encoding = (decoding or Decoding()).check(), (encoding or Encoding()).check()
    execution, path, source = (execution or Execution()).check(), Path(path), None
    if not (path / "zarr.json").is_file():
        if not path.exists():
            raise BadInput(
                f"{path} does not exist: give a store, a video, a frame folder or a TIFF stack"
            )
        store = Path(store) if store is not None else path.with_name(path.stem + ".zarr")
        if not (store / "zarr.json").is_file():
            decoding = defaults.sized(decoding, encoding.filled(), execution, "studio")
        space = SpaceGuard(store, ("decode",), "decode", quiet=execution.quiet)
        check_decode(path, store, decoding, space=space)  # bad input: refused here, at once
        source = (path, decoding)  # decoded in the page, with its progress
        if "frame_count" not in RunStore.open(store, read_only=True).attrs:
            log.info(f"studio: {path} is decoded into {store} as the page shows", execution.quiet)
        path = store
    serve(path, host, port, encoding, execution, open_page, source)
