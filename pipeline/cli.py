"""The segpipe command line: decode -> encode -> track -> export, each resumable."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import click

from segpipe import api, interrupt, log
from segpipe.errors import SegpipeError, os_error_line
from segpipe.labels import load as load_labels
from segpipe.settings import (
    DEFAULTS,
    DTYPES,
    PRECISIONS,
    Decoding,
    Encoding,
    Execution,
    Tracking,
    from_options,
)

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}
STORE = click.option(
    "--store",
    "store",
    required=True,
    type=click.Path(path_type=Path),
    help="The run store (a zarr directory, one per video).",
)
QUIET = click.option(
    "--quiet",
    is_flag=True,
    help="No progress bars or notes: only the results (stdout) and warnings.",
)
DEVICE = click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda", "mps"]),
    default="auto",
    help="Where the model runs.",
)
CHECKPOINT = click.option(
    "--checkpoint",
    default=None,
    help="The weights: an official SAM 2 checkpoint file, or a hf:facebook/sam2.1-hiera-tiny "
    "style name. track needs the one the store was encoded with (segpipe_tiny's shipped "
    "weights and random weights are found without it).",
)


def decode_options(f):
    f = click.option(
        "--fps",
        type=float,
        default=None,
        show_default="24 for frames without a clock",
        help="Frame rate of a frame folder or a TIFF stack (a video file has its own).",
    )(f)
    f = click.option(
        "--stream",
        type=int,
        default=None,
        show_default="the default stream",
        help="Which video stream of a file with several (its stream number).",
    )(f)
    f = click.option(
        "--image-size",
        type=int,
        default=None,
        show_default=f"{DEFAULTS['image_size']}, or the store's",
        help="Model input size S (frames are resized to S x S; a multiple of 32, or of 14 for sam3-tracker).",
    )(f)
    f = click.option(
        "--chunk-size",
        type=int,
        default=None,
        show_default=f"{DEFAULTS['chunk_size']}, or the store's",
        help="Frames per chunk: the unit of work, storage and resumption.",
    )(f)
    return f


RANDOM_WEIGHTS = click.option(
    "--random-weights",
    "random_weights",
    type=int,
    default=None,
    metavar="SEED",
    help="Seeded random weights, for tests and demos: masks mean nothing.",
)


def encode_options(f):
    from segpipe.model import DEFAULT_MODEL, MODELS

    f = click.option(
        "--embedding-dtype",
        type=click.Choice(DTYPES),
        default=None,
        show_default="float32, or the store's",
        help="How the embeddings are stored on disk, whatever they were computed in "
        "(float32 keeps masks exact; bfloat16 halves the disk and is exact under "
        "--precision bfloat16).",
    )(f)
    f = click.option(
        "--precision",
        type=click.Choice(PRECISIONS),
        default=None,
        show_default="bfloat16 on CUDA, float32 elsewhere",
        help="How SAM 2 computes: bfloat16 runs it under bfloat16 autocast, as SAM 2 runs "
        "on GPUs; float32 without (--embedding-dtype is only how the results are stored).",
    )(f)
    f = click.option("--batch-size", type=int, default=1, help="Frames per encoder call.")(f)
    f = RANDOM_WEIGHTS(f)
    f = CHECKPOINT(f)
    f = click.option(
        "--model",
        type=click.Choice(list(MODELS)),
        default=None,
        show_default=f"{DEFAULT_MODEL}, or the store's",
        help="The tracker: a SAM 2 config (an official one, or segpipe_tiny, the demo model: "
        "trained on synthetic clips, weights shipped in the package; decode at the "
        "image size they were trained at, encode warns otherwise), edgetam or sam3-tracker "
        "(through transformers: --checkpoint hf:REPO or a folder; -mini: small, for tests).",
    )(f)
    return f


def studio_model_options(f):
    """The studio's --model, --checkpoint and --random-weights: encode's, for a store not
    yet encoded (Track encodes its chunks as it tracks them)."""
    from segpipe.model import DEFAULT_MODEL, MODELS

    f = RANDOM_WEIGHTS(f)
    f = CHECKPOINT(f)
    return click.option(
        "--model",
        type=click.Choice(list(MODELS)),
        default=None,
        show_default=f"the store's, else {DEFAULT_MODEL}",
        help="The model a store not yet encoded is encoded with, as Track needs it "
        "(segpipe_tiny: the demo model, shipped).",
    )(f)


DIRECTION = click.option(
    "--direction",
    type=click.Choice(["both", "forward", "reverse"]),
    default=None,
    show_default="both, or the store's",
    help="Which way to track from the earliest prompted frame: forward to the end, "
    "reverse to frame 0, or both (forward, then reverse), as SAM 2's propagate_in_video.",
)


CONCEPT = click.option(
    "--concept",
    "concepts",
    multiple=True,
    metavar="PHRASE",
    help="Find and track every instance of PHRASE (a short noun phrase: fish, cell, "
    "person) with SAM 3's concept model (--model sam3-video), forward from frame 0; "
    "repeat for several. New instances get new ids as they appear; --prompts beside it "
    "adds clicked objects, tracked forward by SAM 3's tracker.",
)

WINDOW = click.option(
    "--frames",
    default=None,
    metavar="A:B",
    show_default="all, or the store's",
    help="Track only frames A..B-1 (A: to the end, :B from the start), as SAM 2's "
    "propagate_in_video(start_frame_idx, max_frame_num_to_track): forward from A or the "
    "earliest prompt, whichever is later, reverse from B-1 or it, whichever is earlier. "
    "Prompts outside still count; frames outside are left untracked.",
)


def mask_options(f):
    """How masks are made from SAM 2's outputs (SAM 2's predictor defaults unless given)."""
    f = click.option(
        "--object-start",
        type=click.Choice(["earliest", "own"]),
        default=None,
        show_default="earliest, or the store's",
        help="Where each object's tracking starts: earliest: every object from the "
        "earliest prompted frame, as SAM 2's predictor; own: each from its own first "
        "prompt, empty before (vos_inference --track_object_appearing_later_in_video; "
        "needs --direction forward).",
    )(f)
    f = click.option(
        "--score-threshold",
        type=float,
        default=None,
        show_default="0.0, or the store's",
        help="A pixel is in an object's mask where its logit is above this.",
    )(f)
    f = click.option(
        "--non-overlap/--overlap",
        "non_overlap",
        default=None,
        show_default="overlap, or the store's",
        help="Give each pixel to the highest-scoring object only (SAM 2's non_overlap_masks).",
    )(f)
    f = click.option(
        "--postprocessing/--no-postprocessing",
        "postprocessing",
        default=None,
        show_default="on, or the store's",
        help="SAM 2's apply_postprocessing (vos_inference turns it off).",
    )(f)
    return f


def dask_options(f):
    """Where the work runs: here (default), or on Dask workers (`segpipe.dask.client`)."""
    f = click.option(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="Run on the workers of this Dask scheduler (e.g. tcp://10.0.0.5:8786); "
        "they must see the store and inputs at the same paths (a shared "
        "file system).",
    )(f)
    f = count_option(
        "--workers",
        "N",
        "Run on a local Dask cluster of N worker processes, one task at a "
        "time each, each at this process's torch thread count // N (OMP_NUM_THREADS "
        "where set, else the cores'): its results are those of one process started "
        "with OMP_NUM_THREADS at that count (pip install 'segpipe[dask]').  "
        "[default: one process, no Dask]",
    )(f)
    return f


def count_option(flag: str, metavar: str, help: str):
    """An option taking a positive count, None when not given (the store's or the default)."""
    return click.option(flag, type=click.IntRange(min=1), default=None, metavar=metavar, help=help)


GROUPS = count_option(
    "--groups",
    "G",
    "Track the objects in G groups, each on its own (the same masks: SAM 2 tracks "
    "each object alone): side by side on Dask workers, one after another here; one "
    "group under --non-overlap and --object-batch.  [default: one per Dask worker, else one]",
)
OBJECT_BATCH = count_option(
    "--object-batch",
    "K",
    "Up to K objects of a frame through SAM 2's step at once, as its legacy predictor "
    "batches them (for a GPU that one object's step leaves idle). Not bit for bit SAM 2's "
    "predictor: a few pixels differ. The objects then run as one group.  "
    "[default: 1, or the store's]",
)
FORCE = click.option(
    "--force",
    is_flag=True,
    help="Where the store was made from another video or with other settings, start "
    "this stage (and every later one) over instead of refusing. (On track and export, "
    "--force redoes the stage even with the same settings.)",
)
FORCE_AGAIN = click.option(
    "--force",
    is_flag=True,
    help="Redo this stage from the start, even where it is finished or would resume "
    "(new prompts or settings start it over anyway).",
)
NO_SPACE_CHECK = click.option(
    "--no-space-check",
    "no_space_check",
    is_flag=True,
    help="Start even where the storage estimate (printed before the first write) is larger "
    "than the free space of the store's file system, which is otherwise refused.",
)


ALLOW_ENV_CHANGE = click.option(
    "--allow-env-change",
    is_flag=True,
    help="Go on where the store was computed in another environment (device, torch, CUDA "
    "or cuDNN version, CPU thread count or ISA level), which is otherwise refused: the "
    "results are then no longer bit-identical to an uninterrupted run.",
)


@contextmanager
def writing(store: Path):
    """Every command that writes stops cleanly on a signal (the stages it calls hold the
    store's lock: one writer per store)."""
    with interrupt.finishing_chunks():
        yield
    interrupt.check()  # a signal after the last chunk's commit still ends in 130 / 143


class PipelineOrder(click.Group):
    """Commands listed as they are defined: the pipeline's order (decode, encode, track,
    export, run, ...), not the alphabet's."""

    def list_commands(self, ctx):
        return list(self.commands)


@click.group(cls=PipelineOrder, context_settings=CONTEXT)
@click.version_option(package_name="segpipe", prog_name="segpipe")
def cli():
    """segpipe: segment objects through long videos with SAM 2, chunk by chunk.

    \b
    Example (all four stages, resumable, with the shipped demo model):
      segpipe run clip.mp4 --store clip.zarr --prompts prompts.json --model segpipe_tiny
    """


@cli.command(context_settings=CONTEXT)
@click.argument("video", type=click.Path(path_type=Path))
@STORE
@decode_options
@FORCE
@NO_SPACE_CHECK
@QUIET
def decode(video, store, **options):
    """Decode VIDEO (a video file, a folder of numbered JPEG/PNG frames, or a TIFF stack: a
    multi-page file or a folder of numbered TIFFs, 8 or 16 bits) into the store's
    model-input frames, upright. First prints the storage estimate (frames measured on a
    sample of the video) and refuses if the frames need more than the free space.

    \b
    Example:
      segpipe decode clip.mp4 --store clip.zarr --chunk-size 4 --image-size 256
      segpipe decode DAVIS/JPEGImages/480p/clip --store frames.zarr --image-size 256
      segpipe decode cells.tif --store cells.zarr --fps 2
    """
    with writing(store):
        api.decode(video, store, **from_options(options, Decoding, Execution))


@cli.command(context_settings=CONTEXT)
@STORE
@encode_options
@DEVICE
@dask_options
@FORCE
@NO_SPACE_CHECK
@ALLOW_ENV_CHANGE
@QUIET
def encode(store, **options):
    """Compute the model's image embeddings for every decoded frame. First prints the storage
    estimate and refuses if the features need more than the free space.

    \b
    Example:
      segpipe encode --store clip.zarr --model segpipe_tiny
      segpipe encode --store frames.zarr --model segpipe_tiny --workers 2
    """
    with writing(store):
        api.encode(store, **from_options(options, Encoding, Execution))


@cli.command(context_settings=CONTEXT)
@STORE
@click.option(
    "--prompts",
    "prompts",
    default=None,
    type=click.Path(path_type=Path),
    show_default="the store's: segpipe studio's saved prompts, else the last tracked",
    help="Prompts JSON (see README, 'Prompts file').",
)
@click.option(
    "--labels",
    "labels",
    default=None,
    type=click.Path(path_type=Path),
    help='Names and classes of the objects: a JSON file {"objects": [{"id": 1, "name": '
    '"left mouse", "class": "mouse"}]} (a prompts file may carry the same list), recorded '
    "once the tracking of --prompts is done; without --prompts, nothing is tracked: the "
    "names are recorded alone. Exports show them; no tracking is redone for them.",
)
@DIRECTION
@WINDOW
@CONCEPT
@mask_options
@CHECKPOINT
@DEVICE
@dask_options
@GROUPS
@OBJECT_BATCH
@FORCE_AGAIN
@ALLOW_ENV_CHANGE
@QUIET
def track(store, prompts, labels, **options):
    """Track the prompted objects through the video from the stored embeddings (on Dask
    workers: the forward and reverse passes, and groups of objects, side by side).

    \b
    Example:
      segpipe track --store clip.zarr --prompts prompts.json --direction both
      segpipe track --store clip.zarr --frames 0:8 --direction forward --workers 2 --groups 3
      segpipe track --store clip.zarr --labels names.json
    """
    with writing(store):
        named = None if labels is None else load_labels(labels)  # checked before any write
        settings = from_options(options, Tracking, Encoding, Execution)
        if named is None or prompts is not None or options["concepts"]:
            api.track(store, prompts, **settings)
        if named is not None:  # (without --prompts, the names alone: nothing is tracked)
            api.label(store, list(named.values()))
            said = ", ".join(map(str, sorted(named)))
            alone = " (nothing tracked: --labels without --prompts)" if prompts is None else ""
            log.result(
                f"track: names recorded for objects {said} in {store}{alone}", options["quiet"]
            )


class ExportFormats(click.Choice):
    """`--format`'s choices: the export registry's (`stages.export.formats`), read when the
    option is used, so `import segpipe.cli` loads no export code."""

    def __init__(self):
        super().__init__([])

    @property
    def choices(self):
        from segpipe.stages.export.stage import FORMATS

        return list(FORMATS)

    @choices.setter
    def choices(self, value):  # click sets it once, empty
        pass


@cli.command(context_settings=CONTEXT)
@STORE
@click.option(
    "--format",
    "fmt",
    required=True,
    type=ExportFormats(),
    help="davis: indexed PNG per frame; vis-json: YouTube-VIS RLE JSON; overlay: MP4; "
    "cvat: CVAT for video 1.1 XML (mask tracks, to correct in CVAT); "
    "frames: the overlay as a folder of JPEGs; and any format registered "
    "(segpipe.stages.export.formats).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(),
    help="Output folder (davis, frames) or file (vis-json, overlay, cvat; given a folder: "
    "masks.json, overlay.mp4 or annotations.xml in it).",
)
@click.option("--frames", default=None, metavar="A:B", help="Only frames A..B-1.  [default: all]")
@click.option(
    "--objects", default=None, metavar="ID,ID", help="Only these object ids.  [default: all]"
)
@click.option(
    "--per-object",
    is_flag=True,
    help="davis: one folder of 0/1 PNGs per object, <id:03d>/<frame>.png (SA-V's layout).",
)
@FORCE_AGAIN
@QUIET
def export(store, fmt, out, **options):
    """Export the tracked masks in a standard format.

    \b
    Example:
      segpipe export --store clip.zarr --format davis --out clip_davis/
      segpipe export --store clip.zarr --format overlay --out clip_overlay.mp4 --frames 0:8
    """
    with writing(store):
        api.export(store, fmt, out, progress=not options.pop("quiet"), **options)


@cli.command(context_settings=CONTEXT)
@click.argument("video", type=click.Path(path_type=Path))
@STORE
@click.option(
    "--prompts",
    "prompts",
    default=None,
    type=click.Path(path_type=Path),
    help="Prompts JSON; without it, run stops after encode.",
)
@decode_options
@encode_options
@DIRECTION
@WINDOW
@CONCEPT
@mask_options
@click.option(
    "--keep",
    type=click.Choice(["all", "masks"]),
    default=None,
    show_default="all, or the store's",
    help="What the store keeps: all (frames and embeddings: re-prompting costs no "
    "encoding) or masks (a chunk's frames go once encoded; its features are written only "
    "where a later read needs them, the prompted chunks, and go once tracked, "
    "so hours of video fit a few chunks of them on disk; re-prompting then decodes and "
    "encodes again what the new passes need).",
)
@click.option(
    "--export",
    "exports",
    default=None,
    show_default="davis,vis-json,overlay",
    help="Export formats after tracking (comma list, or 'none'), into STORE's "
    "sibling folder <store name>.export/.",
)
@DEVICE
@dask_options
@GROUPS
@OBJECT_BATCH
@FORCE
@NO_SPACE_CHECK
@ALLOW_ENV_CHANGE
@QUIET
def run(video, store, prompts, exports, **options):
    """Run every stage on VIDEO in order, each resuming where it stopped. Before it writes
    anything, prints the storage estimate of the whole store by array group (frames,
    features, memory, masks) and refuses if it needs more than the free space of the
    store's file system.

    With --workers or --scheduler, decode runs here and the rest on Dask workers: every
    chunk encoded side by side, the forward and reverse passes side by side, each chunk
    exported once its masks are final; the store and exports are the same.

    \b
    Example:
      segpipe run clip.mp4 --store clip.zarr --prompts prompts.json --model segpipe_tiny \\
          --export davis,overlay
      segpipe run clip.mp4 --store long.zarr --prompts prompts.json --model segpipe_tiny \\
          --keep masks --chunk-size 4
      segpipe run clip.mp4 --store clip.zarr --prompts prompts.json --model segpipe_tiny \\
          --workers 2
      segpipe run clip.mp4 --store fish.zarr --concept fish --model sam3-video-mini \\
          --random-weights 0 --image-size 112
    """
    formats = (
        None
        if exports is None
        else []
        if exports.strip() == "none"
        else [f.strip() for f in exports.split(",") if f.strip()]
    )
    with writing(store):
        api.run(video, store, prompts, **from_options(dict(options, exports=formats)))
    if prompts is None and not options["concepts"] and not options["quiet"]:
        click.echo(
            f"run: no --prompts, so the video is decoded and encoded but not tracked; "
            f"to track, add --prompts PROMPTS.json (or run `segpipe track --store "
            f"{store} --prompts PROMPTS.json`)",
            err=True,
        )


@cli.command(context_settings=CONTEXT)
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--at", "at", type=int, required=True, metavar="N", help="The frame index (0 is the first)."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    show_default="<name>_frame<N>.png here",
    help="The PNG to write.",
)
@click.option(
    "--grid",
    type=int,
    default=None,
    metavar="PX",
    show_default="a round step",
    help="A labelled line every PX pixels (0: none).",
)
@click.option(
    "--stream",
    type=int,
    default=None,
    show_default="the default stream",
    help="Which video stream of a file with several.",
)
def frame(source, at, out, grid, stream):
    """Write frame N of SOURCE (a video, a frame folder, a TIFF stack, or a store: its
    source) as a PNG at the video's own size, upright, as the model sees it (16-bit TIFFs
    through the store's window), with a labelled pixel grid: read the coordinates of your
    prompts off it (x right, y down, as the prompts file takes them).

    \b
    Example:
      segpipe frame clip.mp4 --at 0 --out frame0.png
      segpipe frame clip.zarr --at 10 --grid 50
    """
    from segpipe.snapshot import save_frame

    path, what = save_frame(source, at, out, grid, stream)
    click.echo(what)


@cli.command(context_settings=CONTEXT)
@click.option(
    "--base-video-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="One folder of JPEG frames (named by number) per video.",
)
@click.option(
    "--input-mask-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Annotations: <video>/<frame>.png indexed PNGs whose values are object ids "
    "(with --per-obj-png-file: <video>/<obj>/<frame>.png).",
)
@click.option(
    "--output-mask-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Where the output PNGs go, laid out as the input masks.",
)
@click.option(
    "--work-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Where the per-video stores go (<video>.zarr): what makes the run resumable.",
)
@click.option(
    "--video-list-file",
    default=None,
    type=click.Path(path_type=Path),
    show_default="every subfolder of --base-video-dir",
    help="Video names, one per line.",
)
@click.option("--score-thresh", type=float, default=0.0, help="Mask logit threshold.")
@click.option(
    "--use-all-masks", is_flag=True, help="Prompt with every annotated frame, not only the first."
)
@click.option(
    "--per-obj-png-file",
    is_flag=True,
    help="One PNG per object and frame, in and out (SA-V); masks may then overlap.",
)
@click.option(
    "--apply-postprocessing",
    is_flag=True,
    help="SAM 2's postprocessing (hole filling and more); off in SAM 2's evaluation.",
)
@click.option(
    "--track-object-appearing-later-in-video",
    is_flag=True,
    help="Track each object from its own first mask (LVOS, YouTube-VOS).",
)
@click.option(
    "--image-size",
    type=int,
    default=None,
    show_default="1024",
    help="Model input size S (a multiple of 32, or of 14 for sam3-tracker).",
)
@click.option(
    "--chunk-size",
    type=int,
    default=None,
    show_default=str(DEFAULTS["chunk_size"]),
    help="Frames per chunk: the unit of work, storage and resumption.",
)
@click.option(
    "--evaluate",
    "gt_dir",
    default=None,
    type=click.Path(path_type=Path),
    metavar="GT_DIR",
    help="Then compute DAVIS J&F against these ground-truth PNGs.",
)
@encode_options
@DEVICE
@dask_options
@ALLOW_ENV_CHANGE
@QUIET
def dataset(base_video_dir, input_mask_dir, output_mask_dir, work_dir, gt_dir, **options):
    """SAM 2's tools/vos_inference.py over a VOS dataset (DAVIS, YouTube-VOS, MOSE, SA-V
    layouts): the same output PNGs, chunked, resumable, bounded in memory. Ends with a
    table of the videos; exits 1 if any failed.

    \b
    Example:
      segpipe dataset --base-video-dir DAVIS/JPEGImages/480p \\
          --input-mask-dir DAVIS/Annotations/480p --output-mask-dir out/ \\
          --work-dir stores/ --model segpipe_tiny
    (add --workers 4 for four videos at a time on Dask)
    """
    from segpipe.vos.dataset import VosInference, table

    vos = VosInference(**{f.name: options.pop(f.name) for f in fields(VosInference)})
    with interrupt.finishing_chunks():
        results = api.dataset(
            base_video_dir,
            input_mask_dir,
            output_mask_dir,
            work_dir,
            vos=vos,
            **from_options(options, Decoding, Encoding, Execution),
        )
    interrupt.check()
    click.echo(table(results))
    failed = [r for r in results if r.failed]
    problems = (
        [
            f"{len(failed)} of {len(results)} videos failed: "
            f"{', '.join(r.video for r in failed)} (see the table)"
        ]
        if failed
        else []
    )
    done = [r.video for r in results if not r.failed]
    if gt_dir is not None and done:
        try:
            click.echo(
                api.evaluate(
                    output_mask_dir,
                    gt_dir,
                    videos=done,
                    per_obj_png_file=vos.per_obj_png_file,
                ).table()
            )
        except SegpipeError as e:
            problems.append(f"evaluation: {e.message}")
    if problems:
        raise SegpipeError("; ".join(problems))


@cli.command(context_settings=CONTEXT)
@STORE
@CHECKPOINT
@DEVICE
@ALLOW_ENV_CHANGE
@QUIET
def repair(store, **options):
    """Find damaged chunks (missing files, failed checksums) and recompute exactly those.

    \b
    Example:
      segpipe repair --store clip.zarr
    """
    with writing(store):
        api.repair(store, **from_options(options, Encoding, Execution))


@cli.command(context_settings=CONTEXT)
@STORE
@QUIET
def migrate(store, quiet):
    """Convert a store made by an earlier segpipe (schema 4) to this one's, in place, keeping
    its frames, features, memory and masks: one atomic write of its attributes, so a kill
    leaves it as it was or converted. A store already current is left as it is.

    \b
    Example:
      segpipe migrate --store clip.zarr
    """
    with writing(store):
        api.migrate(store, execution=Execution(progress=not quiet))


@cli.command(context_settings=CONTEXT)
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--store",
    "store",
    type=click.Path(path_type=Path),
    default=None,
    show_default="<PATH name>.zarr beside it",
    help="The store, when PATH is a video or a frame folder (decoded into it first).",
)
@click.option(
    "--host", default="127.0.0.1", help="Where to listen; beyond loopback a token is required."
)
@click.option("--port", type=int, default=8765, help="The port (0: any free one).")
@click.option("--open", "open_page", is_flag=True, help="Open the page in the default browser.")
@decode_options
@studio_model_options
@ALLOW_ENV_CHANGE
@DEVICE
def studio(path, **options):
    """Prompt, review and correct the tracking in the browser, over the store: PATH is a store,
    or a video / frame folder / TIFF stack (decoded into --store first). Prints the URL; Ctrl-C stops.

    \b
    Example:
      segpipe studio clip.zarr
      segpipe studio clip.mp4 --store clip.zarr --model segpipe_tiny --port 0
    """
    where = {k: options.pop(k) for k in ("store", "host", "port", "open_page")}
    api.studio(path, **where, **from_options(options, Decoding, Encoding, Execution))


@cli.command(context_settings=CONTEXT)
@STORE
@click.option("--verbose", is_flag=True, help="The bytes on disk of every array too.")
@click.option("--json", "as_json", is_flag=True, help="Everything, machine-readable, on stdout.")
@click.option(
    "--flags",
    "with_flags",
    is_flag=True,
    help="Where each object may be lost, with the reason (segpipe studio's flags); reads "
    "every mask once.",
)
def status(store, verbose, as_json, with_flags):
    """Show the store in a few lines: its source, model, objects and prompts, whether a
    process is working on it now, each stage's chunks done / total (with frames/s and an ETA
    while a stage advances, from the ledger's commit times), the exports, and the storage
    estimate by array group beside the bytes on disk.

    \b
    Example:
      segpipe status --store clip.zarr
      segpipe status --store clip.zarr --json
      segpipe status --store clip.zarr --flags
    """
    from segpipe.status import describe, render

    report = describe(store, with_flags=with_flags)
    click.echo(json.dumps(report, indent=1) if as_json else render(report, verbose))


@cli.command(context_settings=CONTEXT)
@click.option(
    "--results-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Result masks, <dir>/<video>/<frame>.png: indexed PNGs whose pixel values are "
    "object ids (as SAM 2's tools/vos_inference.py and `export --format davis` "
    "write them).",
)
@click.option(
    "--gt-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Ground-truth masks in the same layout (e.g. DAVIS/Annotations/480p); its "
    "PNGs are the frames scored.",
)
@click.option(
    "--video-list-file",
    type=click.Path(path_type=Path),
    default=None,
    show_default="every folder of --gt-dir",
    help="Videos to score, one name a line.",
)
@click.option(
    "--per-obj-png-file",
    "per_object_png",
    is_flag=True,
    help="Per-object layout (SA-V): <dir>/<video>/<object id, 001>/<frame>.png, "
    "0 / non-zero, for results and ground truth.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def evaluate(results_dir, gt_dir, video_list_file, per_object_png, as_json):
    """Score result masks against ground truth with DAVIS 2017's semi-supervised J (region
    IoU), F (boundary accuracy) and J&F: first and last frames not scored, the means taken
    over all objects of all videos.

    \b
    Example:
      segpipe evaluate --results-dir out --gt-dir DAVIS/Annotations/480p
      segpipe evaluate --results-dir out --gt-dir DAVIS/Annotations/480p \\
          --video-list-file val.txt --json
    """
    from segpipe.vos.davis import evaluate as score
    from segpipe.vos.davis import read_video_list

    videos = read_video_list(video_list_file) if video_list_file is not None else None
    report = score(results_dir, gt_dir, videos=videos, per_object_png=per_object_png)
    click.echo(json.dumps(report.to_dict(), indent=1) if as_json else report.table())


def main():
    interrupt.install()
    log.RESULTS_ALWAYS = True
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:  # click's own usage errors
        e.show()
        sys.exit(e.exit_code)
    except SegpipeError as e:
        click.echo(f"Error: {e.message}", err=True)
        sys.exit(1)
    except (interrupt.Interrupted, KeyboardInterrupt) as e:
        interrupt.stop_now(getattr(e, "signum", 2))
    except OSError as e:
        click.echo(f"Error: {os_error_line(e)}", err=True)
        sys.exit(1)
    except MemoryError:
        click.echo(
            "Error: out of memory; finished chunks are kept: try a smaller --chunk-size "
            "or --batch-size and run again",
            err=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
