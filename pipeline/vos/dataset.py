"""Dataset mode: SAM 2's `tools/vos_inference.py` over a VOS dataset, chunked and resumable.

Each video gets its own store under the work folder and goes through decode, encode and a
forward track, with the tool's settings (postprocessing off unless asked, non-overlapping
masks unless per-object PNGs, the score threshold) and its prompts (`segpipe.vos`). Output
PNGs are written chunk by chunk as the forward pass commits each chunk, atomically, so they
appear while the run goes on and a crash loses at most the chunk in flight. A rerun skips
finished videos and resumes the others where they stopped. A video that fails for a reason
of its own (an unreadable frame, a missing first mask) is reported and the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from segpipe import log
from segpipe.errors import BadInput, SegpipeError
from segpipe.settings import Decoding, Encoding, Execution, Tracking
from segpipe.stages.export.writers import make_folder
from segpipe.vos.inputs import Layout, VideoInputs, read_inputs, video_names


@dataclass(frozen=True)
class VosInference:
    """SAM 2's tools/vos_inference.py's options, with its names and defaults: the videos
    (`video_list_file`: one name a line; None: every folder), the mask threshold, every
    mask as a prompt or only the first frame's, SA-V's per-object PNGs, its postprocessing,
    objects that appear later tracked from their own first mask."""

    video_list_file: str | None = None
    score_thresh: float = 0.0
    use_all_masks: bool = False
    per_obj_png_file: bool = False
    apply_postprocessing: bool = False
    track_object_appearing_later_in_video: bool = False

    def tracking(self) -> Tracking:
        """The tracking the tool does: forward, with its mask settings."""
        return Tracking(
            direction="forward",
            postprocessing=self.apply_postprocessing,
            non_overlap=not self.per_obj_png_file,
            score_threshold=self.score_thresh,
            object_start="own" if self.track_object_appearing_later_in_video else "earliest",
        )


@dataclass(frozen=True)
class Options:
    """Every video's settings: the tool's, the decoding and encoding (the model filled in),
    and where it runs (`execution`: its device and environment setting)."""

    vos: VosInference = VosInference()
    decoding: Decoding = Decoding()
    encoding: Encoding = Encoding().filled()
    execution: Execution = Execution()


@dataclass
class VideoResult:
    video: str
    frames: int | None = None
    objects: int | None = None
    seconds: float = 0.0
    status: str = "done"  # "done", "already done", or "failed: <reason>"

    @property
    def failed(self) -> bool:
        return self.status.startswith("failed")


def run_dataset(
    base_video_dir,
    input_mask_dir,
    output_mask_dir,
    work_dir,
    options: Options = Options(),
    quiet: bool = False,
    cluster=None,
) -> list[VideoResult]:
    """Every video, one after the other; with `cluster` (`segpipe.dask.client`), side by side on
    Dask workers, one task per video (`segpipe.dask.tasks`)."""
    layout = Layout(Path(base_video_dir), Path(input_mask_dir), options.vos.per_obj_png_file)
    listed = options.vos.video_list_file
    names = video_names(layout.base_video_dir, None if listed is None else Path(listed))
    if not names:
        raise BadInput(f"no videos in {layout.base_video_dir}")
    output_mask_dir, work_dir = Path(output_mask_dir), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    total = sum(frame_count(layout, v) for v in names)
    if cluster is not None:
        return cluster.videos(layout, names, options, output_mask_dir, work_dir, total, quiet)
    runner = VideoRunner(options, output_mask_dir, work_dir, quiet)
    results = []
    with log.progress("dataset", total, quiet) as bar:
        for n, video in enumerate(names):
            bar.set_description(f"dataset: video {n + 1}/{len(names)}")
            results.append(run_video(runner, layout, video))
            bar.update(frame_count(layout, video))
    return results


def run_video(runner: "VideoRunner", layout: Layout, video: str) -> VideoResult:
    """One video; a failure of its own (`SegpipeError`) is its result, and the others go on."""
    began = time.perf_counter()
    result = VideoResult(video)
    try:
        result = runner.run(layout, video)
    except SegpipeError as e:
        result.status = f"failed: {e.message}"
        log.info(f"{video}: {e.message}", runner.quiet)
    result.seconds = time.perf_counter() - began
    return result


class VideoRunner:
    """The stages for one video after another; the model is built once, when first needed
    (`model.shared_predictor`)."""

    def __init__(self, options: Options, output_mask_dir: Path, work_dir: Path, quiet: bool):
        self.options, self.out, self.work, self.quiet = options, output_mask_dir, work_dir, quiet
        # each stage's: quiet where the table is the result, resuming, one group of objects
        self.execution = replace(options.execution, progress=not quiet, force=False, groups=None)

    def model(self, image_size: int, device: str):
        """One predictor per image size (stores made earlier may have another)."""
        from segpipe.model import predictor_for, resolve_weights

        e, vos = self.options.encoding, self.options.vos
        return predictor_for(
            {"name": e.model, "image_size": image_size},
            resolve_weights(e.model, e.checkpoint, e.random_weights),
            device,
            {"postprocessing": vos.apply_postprocessing, "non_overlap": not vos.per_obj_png_file},
        )

    def run(self, layout: Layout, video: str) -> VideoResult:
        from segpipe.store.lock import store_lock

        vos = self.options.vos
        inputs = read_inputs(
            layout, video, vos.use_all_masks, vos.track_object_appearing_later_in_video
        )
        store = self.work / f"{video}.zarr"
        out = self.out / video
        result = VideoResult(video, len(inputs.frame_names), len(inputs.object_ids))
        if not inputs.prompts:  # per-object PNGs, objects appearing later, and none ever does
            make_folder(out)  # all the tool writes then
            return result
        with store_lock(store), log.results_hidden():  # one writer; the table is the result
            predictor = self._decode_encode(inputs, store)
            exporting = self._exports(store, out, inputs)
            self._track(store, inputs, predictor, exporting)
            exporting.finish(self.quiet)
        if not exporting.worked:
            result.status = "already done"
        return result

    def _decode_encode(self, inputs: VideoInputs, store: Path):
        """Decode and encode the video's frames into `store`; the predictor that encoded them."""
        from segpipe.model import pick_device
        from segpipe.stages.decode import decode
        from segpipe.stages.encode import encode

        o = self.options
        decoded = decode(inputs.frames, store, o.decoding, quiet=self.quiet)
        predictor = self.model(decoded.image_size, pick_device(o.execution.device))
        encode(store, o.encoding, self.execution, predictor=predictor)
        return predictor

    def _exports(self, store: Path, out: Path, inputs: VideoInputs):
        """The video's PNGs in `out`, exported as the tracking commits each chunk."""
        from segpipe.stages.export.as_tracked import ExportsAsTracked
        from segpipe.stages.export.writers import davis_palette

        return ExportsAsTracked(
            store,
            [
                dict(
                    fmt="davis",
                    out=out,
                    frames=f"{inputs.first_output}:",
                    name="vos",
                    palette=inputs.palette or davis_palette(),
                    per_object=self.options.vos.per_obj_png_file,
                )
            ],
        )

    def _track(self, store: Path, inputs: VideoInputs, predictor, exporting) -> None:
        """Track the video forward from its prompts with the tool's settings, exporting."""
        from segpipe.stages.track.stage import track

        o = self.options
        tracking = o.vos.tracking()
        track(
            store,
            inputs.prompts,
            tracking,
            o.encoding,
            self.execution,
            predictor=predictor,
            on_commit=exporting.committed,
        )


def frame_count(layout: Layout, video: str) -> int:
    from segpipe.sources.folder import frame_files

    try:
        return len(frame_files(layout.base_video_dir / video))
    except (SegpipeError, OSError):
        return 0


def table(results: list[VideoResult]) -> str:
    rows = [("video", "frames", "objects", "seconds", "status")]
    rows += [
        (
            r.video,
            "-" if r.frames is None else str(r.frames),
            "-" if r.objects is None else str(r.objects),
            f"{r.seconds:.1f}",
            r.status,
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows
    )
