"""The Python API: the four stages, `run`, `repair` and `open`, keyword arguments only.

Each stage takes the store's lock (one writer per store), resumes where the store stopped,
shows a progress bar (tqdm's auto mode: a widget in Jupyter; `progress=False` turns it off)
and raises `segpipe.SegpipeError` subclasses. Heavy modules (torch, SAM 2) are imported
only by the calls that need them, so `import segpipe` stays light.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .errors import BadInput
from .estimate import Later, SpaceGuard
from .model import DEFAULT_MODEL
from .results import Run
from .store import RunStore


def open(store) -> Run:  # noqa: A001 - segpipe.open, as the API names it
    """The results in `store`, read only.

    Example:
        >>> run = segpipe.open("clip.zarr")
        >>> run.masks(frames=slice(0, 10)).shape
    """
    return Run(store)


def decode(video, store, *, chunk_size: int | None = None, image_size: int | None = None,
           stream: int | None = None, fps: float | None = None, force: bool = False,
           space_check: bool = True, progress: bool = True) -> Run:
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
    from .stages.decode import decode as decode_stage
    space = SpaceGuard(store, ("decode",), "decode", enabled=space_check, quiet=not progress)
    decode_stage(Path(video), Path(store), chunk_size, image_size, quiet=not progress,
                 force=force, stream=stream, fps=fps, space=space)
    return Run(store)


def encode(store, *, model: str = DEFAULT_MODEL, checkpoint: str | None = None,
           random_weights: int | None = None, device: str = "auto", batch_size: int = 1,
           embedding_dtype: str = "float32", precision: str | None = None, force: bool = False,
           space_check: bool = True, progress: bool = True, workers: int | None = None,
           scheduler: str | None = None) -> Run:
    """Compute SAM 2's image embeddings of every decoded frame.

    `precision`: "bfloat16" runs SAM 2 under bfloat16 autocast, as SAM 2 runs on GPUs (the
    default on CUDA), "float32" without (the default elsewhere); tracking uses the same.

    Weights: `checkpoint` (an official checkpoint file, or "hf:facebook/sam2.1-hiera-tiny")
    or `random_weights=SEED` (tests and demos only: masks mean nothing).

    Before writing, the storage estimate is shown and, with `space_check`, `NotEnoughSpace`
    is raised when the store's file system has less free space than the features need.

    `workers=N` encodes on a local Dask cluster of N processes, `scheduler="tcp://..."` on
    the workers of that Dask scheduler (see `segpipe.cluster`); the chunks are spread
    over them.

    Example:
        >>> segpipe.encode("clip.zarr", checkpoint="sam2.1_hiera_tiny.pt")
    """
    from .cluster import connect
    from .stages.encode import encode as encode_stage
    space = SpaceGuard(store, ("decode", "encode"), "encode", Later(model=model),
                       enabled=space_check, quiet=not progress)
    with connect(workers, scheduler, device, not progress, store, [checkpoint]) as cluster:
        encode_stage(store, model=model, checkpoint=checkpoint, random_seed=random_weights,
                     device=device, batch_size=batch_size, embedding_dtype=embedding_dtype,
                     quiet=not progress, force=force, precision=precision, space=space,
                     cluster=cluster)
    return Run(store)


def track(store, prompts=None, *, direction: str | None = None, checkpoint: str | None = None,
          device: str = "auto", force: bool = False, progress: bool = True,
          postprocessing: bool | None = None, non_overlap: bool | None = None,
          score_threshold: float | None = None, object_start: str | None = None,
          workers: int | None = None, scheduler: str | None = None) -> Run:
    """Track the prompted objects through the video from the stored embeddings.

    `prompts`: a prompts file path, a list of its entries (dicts), or `segpipe.Prompt`
    objects; None reuses the store's last prompts. `direction`: "both" (default),
    "forward" or "reverse". New prompts or options discard the old tracking and retrack.

    How masks are made (None: the store's, else SAM 2's predictor defaults):
    `postprocessing` (SAM 2's apply_postprocessing, default on), `non_overlap` (each pixel
    to the highest-scoring object, default off), `score_threshold` (mask = logit above it,
    default 0.0), `object_start` ("earliest": every object from the earliest prompt, as SAM
    2's predictor; "own": each from its own first prompt, empty before, forward only, as
    vos_inference's --track_object_appearing_later_in_video).

    `workers` / `scheduler`: on Dask (as `encode`), the forward and reverse passes side by
    side.

    Example:
        >>> segpipe.track("clip.zarr", [segpipe.Prompt(1, frame=0, points=[[120, 80]], labels=[1])])
    """
    from .cluster import connect
    from .stages.track import track as track_stage
    with connect(workers, scheduler, device, not progress, store, [checkpoint]) as cluster:
        track_stage(store, prompts, direction, device=device, checkpoint=checkpoint,
                    quiet=not progress, force=force, postprocessing=postprocessing,
                    non_overlap=non_overlap, score_threshold=score_threshold,
                    object_start=object_start, cluster=cluster)
    return Run(store)


def export(store, format: str, out, *, frames: slice | str | None = None,  # noqa: A002
           objects: Sequence[int] | str | None = None, force: bool = False,
           progress: bool = True) -> Path:
    """Export the tracked masks: "davis" (a folder of indexed PNGs), "vis-json"
    (YouTube-VIS RLE JSON), "overlay" (an MP4) or "frames" (the overlay as a folder of
    JPEGs). Returns the output path.

    Example:
        >>> segpipe.export("clip.zarr", "davis", "clip_davis/", frames=slice(0, 300), objects=[1])
    """
    from .stages.export import export as export_stage
    if isinstance(frames, slice):
        if frames.step not in (None, 1):
            raise BadInput(f"frames must be a contiguous slice, got {frames!r}")
        frames = f"{'' if frames.start is None else frames.start}:{'' if frames.stop is None else frames.stop}"
    if objects is not None and not isinstance(objects, str):
        objects = ",".join(str(int(o)) for o in objects)
    return export_stage(store, format, out, frames, objects, quiet=not progress, force=force)


def run(video, store, prompts=None, *, chunk_size: int | None = None,
        image_size: int | None = None, stream: int | None = None, fps: float | None = None,
        model: str = DEFAULT_MODEL,
        checkpoint: str | None = None, random_weights: int | None = None, device: str = "auto",
        batch_size: int = 1, embedding_dtype: str = "float32", precision: str | None = None,
        direction: str | None = None, postprocessing: bool | None = None,
        non_overlap: bool | None = None, score_threshold: float | None = None,
        object_start: str | None = None,
        keep: str | None = None,
        exports: Sequence[str] | None = None, force: bool = False, space_check: bool = True,
        progress: bool = True, workers: int | None = None, scheduler: str | None = None) -> Run:
    """Every stage, each resuming where it stopped: decode, then (with `prompts`) the passes
    with each chunk encoded just before a pass tracks it and exported (`exports`, default
    davis, vis-json, overlay; [] for none, into `<store name>.export/` beside the store) as
    soon as its masks are final. Without prompts: decode and encode.

    `keep`: "all" (the default; re-prompting then costs no encoding: chunks no pass needed
    are encoded at the end) or "masks" (a chunk's frames are dropped once encoded and its
    features once every pass has tracked it, so a long video needs a few chunks of them on
    disk; the video is then decoded twice, once to count and time its frames, and again
    chunk by chunk as the passes need them). The setting is the store's from then on.

    Before the first write, the storage estimate of the whole store is shown (memory and
    masks for the prompts' objects) and, with `space_check`, `NotEnoughSpace` is raised when
    the store's file system has less free space than the run still needs: under
    `keep="masks"` (given, or the store's) with frames and features counted as the 3
    chunks of each such a run holds at once.

    `workers=N` (a local Dask cluster of N processes) or `scheduler="tcp://..."` (the
    workers of that Dask scheduler; see `segpipe.cluster`): decode here, then every chunk
    encoded on the workers, the forward and reverse passes side by side, each chunk
    exported as its masks are final; the same store and exports. Not with `keep="masks"`.

    Example:
        >>> run = segpipe.run("clip.mp4", "clip.zarr", "prompts.json",
        ...                   checkpoint="sam2.1_hiera_tiny.pt", exports=["davis"])
        >>> run.masks(objects=[1])
    """
    from .lock import store_lock
    from .stages.export import FORMATS, OUTPUT_NAMES, RUN_FORMATS
    exports = RUN_FORMATS if exports is None else list(exports)
    unknown = [f for f in exports if f not in FORMATS]
    if unknown:
        raise BadInput(f"unknown export format {unknown[0]!r}; choose from {', '.join(FORMATS)}")
    from .retention import check_keep, drop, keep_setting, set_keep
    from .stages.decode import decode as decode_stage
    from .stages.encode import encode as encode_stage
    from .stages.export import ExportsAsTracked
    from .stages.track import track as track_stage
    check_keep(keep)  # before anything is written
    if keep == "masks" and (workers is not None or scheduler is not None):
        raise BadInput("--keep masks runs in one process: run it without --workers or --scheduler")

    def drop_frames(run_store, k):  # under --keep masks: decode's first pass only counts
        if (keep or keep_setting(run_store)) == "masks":
            drop(run_store, "frames", k)

    quiet = not progress
    stages = ("decode", "encode") + (("track",) if prompts is not None else ())
    later = Later(embedding_dtype, precision, prompts, direction, object_start,
                  len(exports) if prompts is not None else 0, device, model)
    space = SpaceGuard(store, stages, "run", later, enabled=space_check, keep=keep,
                       quiet=quiet)
    from .cluster import connect
    with store_lock(store), \
            connect(workers, scheduler, device, quiet, store, [video, checkpoint]) as cluster:
        # the whole run holds the lock, not only each stage; Dask's workers write under it
        decoded = decode_stage(Path(video), Path(store), chunk_size, image_size, quiet=quiet,
                               force=force, stream=stream, fps=fps,
                               on_commit=drop_frames if prompts is not None else None,
                               space=space)
        set_keep(decoded, keep)
        encoding = dict(model=model, checkpoint=checkpoint, random_seed=random_weights,
                        device=device, batch_size=batch_size, embedding_dtype=embedding_dtype,
                        quiet=quiet, force=force, precision=precision, space=space)
        if prompts is None:
            encode_stage(store, **encoding, cluster=cluster)
            return Run(store)
        # the model, checked and recorded (on Dask, every chunk encoded: the workers have
        # nothing else to do yet)
        encode_stage(store, **encoding, chunks=[] if cluster is None else None, cluster=cluster)
        space.before_track(RunStore.open(store))
        exporting = ExportsAsTracked(store, [dict(fmt=f, out=export_folder(store) / OUTPUT_NAMES[f])
                                             for f in exports], cluster)
        track_stage(store, prompts, direction, device=device, checkpoint=checkpoint,
                    quiet=quiet, postprocessing=postprocessing, non_overlap=non_overlap,
                    score_threshold=score_threshold, object_start=object_start,
                    on_commit=exporting.committed, batch_size=batch_size, cluster=cluster)
        exporting.finish(quiet)
        if keep_setting(decoded) == "all" and cluster is None:  # the chunks no pass needed:
            encode_stage(store, **encoding)                       # re-prompting is then free
    return Run(store)


def repair(store, *, checkpoint: str | None = None, device: str = "auto",
           progress: bool = True) -> list:
    """Find damaged chunks (missing files, failed checksums) and recompute exactly those;
    returns what was found.

    Example:
        >>> segpipe.repair("clip.zarr")
    """
    from .damage import repair as repair_store
    return repair_store(store, checkpoint, device, quiet=not progress)


def dataset(base_video_dir, input_mask_dir, output_mask_dir, work_dir, *,
            video_list_file=None, score_thresh: float = 0.0, use_all_masks: bool = False,
            per_obj_png_file: bool = False, apply_postprocessing: bool = False,
            track_object_appearing_later_in_video: bool = False, model: str = DEFAULT_MODEL,
            checkpoint: str | None = None, random_weights: int | None = None,
            image_size: int | None = None, chunk_size: int | None = None,
            device: str = "auto", batch_size: int = 1, embedding_dtype: str = "float32",
            precision: str | None = None, progress: bool = True, workers: int | None = None,
            scheduler: str | None = None) -> list:
    """SAM 2's tools/vos_inference.py over a VOS dataset, with its options and output PNGs,
    one resumable store per video under `work_dir`. Returns one `VideoResult` per video
    (video, frames, objects, seconds, status); a video that fails is reported there
    ("failed: <reason>") and the others go on. `workers` / `scheduler`: the videos side
    by side on Dask (as `run`), one task per video.

    Example:
        >>> results = segpipe.dataset("DAVIS/JPEGImages/480p", "DAVIS/Annotations/480p",
        ...                           "out/", "stores/", checkpoint="sam2.1_hiera_tiny.pt")
        >>> [r.status for r in results]
    """
    from .cluster import connect
    from .vos_dataset import Options, run_dataset
    options = Options(
        score_thresh=score_thresh, use_all_masks=use_all_masks, per_obj_png_file=per_obj_png_file,
        apply_postprocessing=apply_postprocessing,
        track_object_appearing_later_in_video=track_object_appearing_later_in_video,
        model=model, checkpoint=checkpoint, random_seed=random_weights, image_size=image_size,
        chunk_size=chunk_size, device=device, batch_size=batch_size,
        embedding_dtype=embedding_dtype, precision=precision)
    if workers is None and scheduler is None:
        return run_dataset(base_video_dir, input_mask_dir, output_mask_dir, work_dir,
                           video_list_file, options, quiet=not progress)
    paths = [base_video_dir, input_mask_dir, checkpoint]
    with connect(workers, scheduler, device, not progress, paths=paths) as cluster:
        return run_dataset(base_video_dir, input_mask_dir, output_mask_dir, work_dir,
                           video_list_file, options, quiet=not progress, cluster=cluster)


def evaluate(results_dir, gt_dir, *, videos: Sequence[str] | None = None,
             per_obj_png_file: bool = False):
    """DAVIS 2017 J&F of result PNGs against ground-truth PNGs (see `segpipe evaluate`).

    Example:
        >>> report = segpipe.evaluate("out/", "DAVIS/Annotations/480p")
        >>> report.jf_mean
    """
    from .davis_eval import evaluate as evaluate_dirs
    return evaluate_dirs(results_dir, gt_dir, videos=videos, per_object_png=per_obj_png_file)


def export_folder(store) -> Path:
    """Where `run` exports: `<store name>.export/` beside the store."""
    store = Path(store)
    return store.with_name(store.name.removesuffix(".zarr") + ".export")
