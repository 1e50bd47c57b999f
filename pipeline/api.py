"""The Python API: the four stages, `run`, `repair` and `open`, keyword arguments only.

Each stage takes the store's lock (one writer per store), resumes where the store stopped,
shows a progress bar (tqdm's auto mode: a widget in Jupyter; `progress=False` turns it off)
and raises `segpipe.SegpipeError` subclasses. Heavy modules (torch, SAM 2) are imported
only by the calls that need them, so `import segpipe` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from segpipe import defaults, log
from segpipe.errors import BadInput
from segpipe.estimate import Later
from segpipe.model import DEFAULT_MODEL, resolve_weights
from segpipe.results import Run
from segpipe.settings import Decoding, Tracking
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
    video,
    store,
    *,
    chunk_size: int | None = None,
    image_size: int | None = None,
    stream: int | None = None,
    fps: float | None = None,
    force: bool = False,
    space_check: bool = True,
    progress: bool = True,
) -> Run:
    """Decode `video` (a video file, or a folder of JPEG/PNG frames named by number, as SAM 2
    reads them) into the store's model-input frames, upright (a phone's rotation applied).

    `chunk_size` (default 32) frames make the unit of work and storage; `image_size`
    (default 1024) is SAM 2's input size; `stream` the video stream of a file with several
    (default: the container's default); `fps` a frame folder's rate (default 24). `force`
    starts over a store made from another video or with other settings instead of refusing.

    Before writing, the storage estimate is shown (see `segpipe.estimate`) and, with
    `space_check`, `NotEnoughSpace` is raised when the store's file system has less free
    space than the frames need.

    Example:
        >>> segpipe.decode("clip.mp4", "clip.zarr", chunk_size=32, image_size=1024)
    """
    from segpipe.stages.decode import decode as decode_stage

    space = SpaceGuard(store, ("decode",), "decode", enabled=space_check, quiet=not progress)
    decode_stage(
        Path(video),
        Path(store),
        Decoding(chunk_size, image_size, stream, fps),
        quiet=not progress,
        force=force,
        space=space,
    )
    return Run(store)


def encode(
    store,
    *,
    model: str | None = None,
    checkpoint: str | None = None,
    random_weights: int | None = None,
    device: str = "auto",
    batch_size: int = 1,
    embedding_dtype: str | None = None,
    precision: str | None = None,
    force: bool = False,
    space_check: bool = True,
    progress: bool = True,
    workers: int | None = None,
    scheduler: str | None = None,
    allow_env_change: bool = False,
) -> Run:
    """Compute SAM 2's image embeddings of every decoded frame.

    `precision`: "bfloat16" runs SAM 2 under bfloat16 autocast, as SAM 2 runs on GPUs (the
    default on CUDA), "float32" without (the default elsewhere); tracking uses the same.

    Weights: `checkpoint` (an official checkpoint file, or "hf:facebook/sam2.1-hiera-tiny")
    or `random_weights=SEED` (tests and demos only: masks mean nothing).

    Before writing, the storage estimate is shown and, with `space_check`, `NotEnoughSpace`
    is raised when the store's file system has less free space than the features need.

    `workers=N` encodes on a local Dask cluster of N processes, `scheduler="tcp://..."` on
    the workers of that Dask scheduler (see `segpipe.dask`); the chunks are spread
    over them.

    `allow_env_change`: go on in another compute environment than the store was computed in
    (device, library versions, CPU thread count or ISA level), which is otherwise refused
    (`EnvironmentChanged`): the results are then no longer bit-identical to an uninterrupted
    run (see `segpipe.environment`).

    Example:
        >>> segpipe.encode("clip.zarr", checkpoint="sam2.1_hiera_tiny.pt")
    """
    from segpipe.dask.client import connect
    from segpipe.stages.encode import encode as encode_stage

    settings = defaults.fill(
        store,
        "encode",
        not progress,
        checkpoint,
        model=model,
        random_weights=random_weights,
        embedding_dtype=embedding_dtype,
    )
    model, random_weights = settings["model"] or DEFAULT_MODEL, settings["random_weights"]
    embedding_dtype = settings["embedding_dtype"] or "float32"
    space = SpaceGuard(
        store,
        ("decode", "encode"),
        "encode",
        Later(model=model),
        enabled=space_check,
        quiet=not progress,
    )
    with connect(
        workers, scheduler, device, not progress, store, [checkpoint], allow_env_change
    ) as cluster:
        encode_stage(
            store,
            model=model,
            checkpoint=checkpoint,
            random_weights=random_weights,
            device=device,
            batch_size=batch_size,
            embedding_dtype=embedding_dtype,
            quiet=not progress,
            force=force,
            precision=precision,
            space=space,
            cluster=cluster,
            allow_env_change=allow_env_change,
        )
    return Run(store)


def track(
    store,
    prompts=None,
    *,
    direction: str | None = None,
    checkpoint: str | None = None,
    device: str = "auto",
    force: bool = False,
    progress: bool = True,
    postprocessing: bool | None = None,
    non_overlap: bool | None = None,
    score_threshold: float | None = None,
    object_start: str | None = None,
    frames=None,
    workers: int | None = None,
    scheduler: str | None = None,
    groups: int | None = None,
    object_batch: int | None = None,
    allow_env_change: bool = False,
) -> Run:
    """Track the prompted objects through the video from the stored embeddings.

    `prompts`: a prompts file path, a list of its entries (dicts), or `segpipe.Prompt`
    objects; None takes the store's (the prompts segpipe studio saved, else the last
    tracked ones). `direction`: "both" (default),
    "forward" or "reverse". New prompts or options discard the old tracking and retrack.

    How masks are made (None: the store's, else SAM 2's predictor defaults):
    `postprocessing` (SAM 2's apply_postprocessing, default on), `non_overlap` (each pixel
    to the highest-scoring object, default off), `score_threshold` (mask = logit above it,
    default 0.0), `object_start` ("earliest": every object from the earliest prompt, as SAM
    2's predictor; "own": each from its own first prompt, empty before, forward only, as
    vos_inference's --track_object_appearing_later_in_video).

    `frames`: the tracking window, (A, B) or "A:B" (None: the store's, else the whole video):
    only frames A..B-1 are tracked, as SAM 2's `propagate_in_video(start_frame_idx,
    max_frame_num_to_track)` tracks them (see `segpipe.plan.Span`); prompts outside it still
    condition the tracking, frames outside it are untracked.

    `workers` / `scheduler`: on Dask (as `encode`), the forward and reverse passes side by
    side, each in `groups` groups of objects (default: one per worker; one under
    `non_overlap` and `object_batch`), which give the same masks (SAM 2 tracks each object alone); without
    Dask the groups run one after another.

    `object_batch` (None: the store's, else 1): up to that many objects of a frame through
    SAM 2's step at once, as SAM 2's legacy predictor batches them, for a GPU that one
    object's step leaves idle. Not bit for bit SAM 2's predictor (a few pixels differ;
    `benchmarks/bench_objects.py` measures it); a setting like the others, so changing it
    tracks anew, and the objects run as one group.

    `allow_env_change`: go on in another compute environment than the store was computed in
    (device, library versions, CPU thread count or ISA level), which is otherwise refused
    (`EnvironmentChanged`): the results are then no longer bit-identical to an uninterrupted
    run (see `segpipe.environment`).

    Example:
        >>> segpipe.track("clip.zarr", [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])])
    """
    from segpipe.dask.client import connect
    from segpipe.stages.track.stage import track as track_stage

    tracking = Tracking(
        direction=direction,
        frames=frames,
        postprocessing=postprocessing,
        non_overlap=non_overlap,
        score_threshold=score_threshold,
        object_start=object_start,
        object_batch=object_batch,
    )
    with connect(
        workers, scheduler, device, not progress, store, [checkpoint], allow_env_change
    ) as cluster:
        track_stage(
            store,
            prompts,
            tracking,
            device=device,
            checkpoint=checkpoint,
            quiet=not progress,
            force=force,
            cluster=cluster,
            groups=groups,
            allow_env_change=allow_env_change,
        )
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
    chunk_size: int | None = None,
    image_size: int | None = None,
    stream: int | None = None,
    fps: float | None = None,
    model: str | None = None,
    checkpoint: str | None = None,
    random_weights: int | None = None,
    device: str = "auto",
    batch_size: int = 1,
    embedding_dtype: str | None = None,
    precision: str | None = None,
    direction: str | None = None,
    postprocessing: bool | None = None,
    non_overlap: bool | None = None,
    score_threshold: float | None = None,
    object_start: str | None = None,
    frames=None,
    keep: str | None = None,
    exports: Sequence[str] | None = None,
    force: bool = False,
    space_check: bool = True,
    progress: bool = True,
    workers: int | None = None,
    scheduler: str | None = None,
    groups: int | None = None,
    object_batch: int | None = None,
    allow_env_change: bool = False,
) -> Run:
    """Every stage, each resuming where it stopped: decode, then (with `prompts`) the passes
    with each chunk encoded just before a pass tracks it and exported (`exports`, default
    davis, vis-json, overlay; [] for none, into `<store name>.export/` beside the store) as
    soon as its masks are final. Without prompts: decode and encode.

    `keep`: "all" (the default; re-prompting then costs no encoding: chunks no pass needed
    are encoded at the end) or "masks" (a chunk's frames are dropped once encoded, and its
    features are written only where a later read needs them, the prompted chunks, and
    dropped once every pass has tracked them, so a long video needs a few chunks of them on
    disk; the video is then decoded twice, once to count and time its frames, and again
    chunk by chunk as the passes need them). The setting is the store's from then on.

    Before the first write, the storage estimate of the whole store is shown (memory and
    masks for the prompts' objects) and, with `space_check`, `NotEnoughSpace` is raised when
    the store's file system has less free space than the run still needs: under
    `keep="masks"` (given, or the store's) with frames and features counted as the 3
    chunks of each such a run holds at once.

    `workers=N` (a local Dask cluster of N processes) or `scheduler="tcp://..."` (the
    workers of that Dask scheduler; see `segpipe.dask`): decode here, then every chunk
    encoded on the workers, the forward and reverse passes side by side, each chunk
    exported as its masks are final; the same store and exports. Not with `keep="masks"`.

    `allow_env_change`: go on in another compute environment than the store was computed in
    (device, library versions, CPU thread count or ISA level), which is otherwise refused
    (`EnvironmentChanged`): the results are then no longer bit-identical to an uninterrupted
    run (see `segpipe.environment`).

    Example:
        >>> run = segpipe.run("clip.mp4", "clip.zarr", "prompts.json",
        ...                   checkpoint="sam2.1_hiera_tiny.pt", exports=["davis"])
        >>> run.masks(objects=[1])
    """
    from segpipe import runner
    from segpipe.dask.client import connect
    from segpipe.stages.export.formats import run_formats
    from segpipe.stages.export.stage import FORMATS
    from segpipe.store.lock import store_lock
    from segpipe.store.retention import check_keep, refuse_on_dask

    exports = run_formats() if exports is None else list(exports)
    unknown = [f for f in exports if f not in FORMATS]
    if unknown:
        raise BadInput(f"unknown export format {unknown[0]!r}; choose from {', '.join(FORMATS)}")
    check_keep(keep)  # before anything is written
    if workers is not None or scheduler is not None:
        refuse_on_dask(keep)
    if prompts is not None:
        runner.check_prompts(video, prompts, exports, stream, fps, store)
    settings = defaults.fill(
        store,
        "run",
        not progress,
        checkpoint,
        chunk_size=chunk_size,
        image_size=image_size,
        model=model,
        random_weights=random_weights,
        embedding_dtype=embedding_dtype,
        keep=keep,
    )
    chunk_size, image_size, keep = settings["chunk_size"], settings["image_size"], settings["keep"]
    model, random_weights = settings["model"] or DEFAULT_MODEL, settings["random_weights"]
    embedding_dtype = settings["embedding_dtype"] or "float32"
    weights = resolve_weights(model, checkpoint, random_weights)  # no weights: said now
    quiet = not progress
    if image_size is None:  # a new store: at the size the weights were trained at, if known
        image_size = defaults.trained_image_size(weights, quiet)
    stages = ("decode", "encode") + (("track",) if prompts is not None else ())
    later = Later(
        embedding_dtype,
        precision,
        prompts,
        direction,
        object_start,
        frames,
        len(exports) if prompts is not None else 0,
        device,
        model,
    )
    space = SpaceGuard(store, stages, "run", later, enabled=space_check, keep=keep, quiet=quiet)
    with (
        store_lock(store),
        connect(
            workers, scheduler, device, quiet, store, [video, checkpoint], allow_env_change
        ) as cluster,
    ):
        runner.run(
            video,
            store,
            prompts,
            exports=exports,
            keep=keep,
            space=space,
            cluster=cluster,
            quiet=quiet,
            decoding=Decoding(chunk_size, image_size, stream, fps),
            encoding=dict(
                model=model,
                checkpoint=checkpoint,
                random_weights=random_weights,
                device=device,
                batch_size=batch_size,
                embedding_dtype=embedding_dtype,
                force=force,
                precision=precision,
                allow_env_change=allow_env_change,
            ),
            tracking=Tracking(
                direction=direction,
                frames=frames,
                postprocessing=postprocessing,
                non_overlap=non_overlap,
                score_threshold=score_threshold,
                object_start=object_start,
                object_batch=object_batch,
            ),
            groups=groups,
        )
    return Run(store)


def repair(
    store,
    *,
    checkpoint: str | None = None,
    device: str = "auto",
    progress: bool = True,
    allow_env_change: bool = False,
) -> list:
    """Find damaged chunks (missing files, failed checksums) and recompute exactly those;
    returns what was found. In the store's compute environment (`allow_env_change`: as
    `encode`).

    Example:
        >>> segpipe.repair("clip.zarr")
    """
    from segpipe.repairs import repair as repair_store

    return repair_store(store, checkpoint, device, not progress, allow_env_change)


def dataset(
    base_video_dir,
    input_mask_dir,
    output_mask_dir,
    work_dir,
    *,
    video_list_file=None,
    score_thresh: float = 0.0,
    use_all_masks: bool = False,
    per_obj_png_file: bool = False,
    apply_postprocessing: bool = False,
    track_object_appearing_later_in_video: bool = False,
    model: str | None = None,
    checkpoint: str | None = None,
    random_weights: int | None = None,
    image_size: int | None = None,
    chunk_size: int | None = None,
    device: str = "auto",
    batch_size: int = 1,
    embedding_dtype: str | None = None,
    precision: str | None = None,
    progress: bool = True,
    workers: int | None = None,
    scheduler: str | None = None,
    allow_env_change: bool = False,
) -> list:
    """SAM 2's tools/vos_inference.py over a VOS dataset, with its options and output PNGs,
    one resumable store per video under `work_dir`. Returns one `VideoResult` per video
    (video, frames, objects, seconds, status); a video that fails is reported there
    ("failed: <reason>") and the others go on. `workers` / `scheduler`: the videos side
    by side on Dask (as `run`), one task per video. `allow_env_change`: as `run`'s.

    Example:
        >>> results = segpipe.dataset("DAVIS/JPEGImages/480p", "DAVIS/Annotations/480p",
        ...                           "out/", "stores/", model="segpipe_tiny")
        >>> [r.status for r in results]
    """
    from segpipe.dask.client import connect
    from segpipe.vos.dataset import Options, run_dataset

    model, embedding_dtype = model or DEFAULT_MODEL, embedding_dtype or "float32"
    if image_size is None:  # at the size the weights were trained at, if they say
        image_size = defaults.trained_image_size(
            resolve_weights(model, checkpoint, random_weights), not progress, "dataset"
        )
    options = Options(
        score_thresh=score_thresh,
        use_all_masks=use_all_masks,
        per_obj_png_file=per_obj_png_file,
        apply_postprocessing=apply_postprocessing,
        track_object_appearing_later_in_video=track_object_appearing_later_in_video,
        model=model,
        checkpoint=checkpoint,
        random_weights=random_weights,
        image_size=image_size,
        chunk_size=chunk_size,
        device=device,
        batch_size=batch_size,
        embedding_dtype=embedding_dtype,
        precision=precision,
        allow_env_change=allow_env_change,
    )
    if workers is None and scheduler is None:
        return run_dataset(
            base_video_dir,
            input_mask_dir,
            output_mask_dir,
            work_dir,
            video_list_file,
            options,
            quiet=not progress,
        )
    paths = [base_video_dir, input_mask_dir, checkpoint]
    with connect(
        workers, scheduler, device, not progress, paths=paths, allow_env_change=allow_env_change
    ) as cluster:
        return run_dataset(
            base_video_dir,
            input_mask_dir,
            output_mask_dir,
            work_dir,
            video_list_file,
            options,
            quiet=not progress,
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
    model: str | None = None,
    checkpoint: str | None = None,
    random_weights: int | None = None,
    device: str = "auto",
    chunk_size: int | None = None,
    image_size: int | None = None,
    stream: int | None = None,
    fps: float | None = None,
    open_page: bool = False,
    progress: bool = True,
    allow_env_change: bool = False,
) -> None:
    """Serve segpipe studio (prompt, review and correct in the browser) over a store, until
    Ctrl-C. `path`: a store, or a video / frame folder, first decoded into `store` (default
    `<name>.zarr` beside it; `chunk_size`, `image_size`, `stream`, `fps` as `decode` takes
    them, the image size by default the one `model`'s weights were trained at). `model`,
    `checkpoint`, `random_weights`: as `encode` takes them, for a store not yet encoded
    (Track encodes the chunks as it tracks them). A `host` other than loopback requires the
    token the printed URL carries. `allow_env_change`: Track goes on in another compute
    environment than the store's (as `track`).

    Example:
        >>> segpipe.studio("clip.mp4", store="clip.zarr", model="segpipe_tiny")
    """
    from segpipe.stages.decode import check as check_decode
    from segpipe.web.server import serve

    path = Path(path)
    source = None
    if not (path / "zarr.json").is_file():
        if not path.exists():
            raise BadInput(
                f"{path} does not exist: give a store, a video, a frame folder or a TIFF stack"
            )
        store = Path(store) if store is not None else path.with_name(path.stem + ".zarr")
        if image_size is None and not (store / "zarr.json").is_file():
            weights = resolve_weights(model or DEFAULT_MODEL, checkpoint, random_weights)
            image_size = defaults.trained_image_size(weights, not progress)
        decoding = Decoding(chunk_size, image_size, stream, fps)
        space = SpaceGuard(store, ("decode",), "decode", quiet=not progress)
        check_decode(path, store, decoding, space=space)  # bad input: refused here, at once
        source = (path, decoding)  # decoded in the page, with its progress
        if "frame_count" not in RunStore.open(store, read_only=True).attrs:
            log.info(f"studio: {path} is decoded into {store} as the page shows", not progress)
        path = store
    serve(
        path,
        host,
        port,
        dict(
            model=model,
            checkpoint=checkpoint,
            random_weights=random_weights,
            allow_env_change=allow_env_change,
        ),
        device,
        open_page,
        source,
    )
