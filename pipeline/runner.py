"""The pipelined run (`segpipe run`, `segpipe.run`): decode, then, with prompts, each chunk
encoded just before a pass tracks it and exported as soon as its masks are final. Where the
source claims its frame count, the tracking starts as the video decodes
(`stages.alongside`), not once it is decoded.

The whole run holds the store's lock (Dask's workers write under it), and each stage it
calls resumes where the store stopped, so a rerun after a crash redoes at most the chunks
that were in flight.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from segpipe import defaults, log
from segpipe import prompts as prompt_file
from segpipe.errors import BadInput
from segpipe.models.registry import family_of
from segpipe.settings import DEFAULTS, Output, Settings
from segpipe.sources.registry import named, probe
from segpipe.stages.alongside import CountChanged
from segpipe.stages.alongside import start as start_alongside
from segpipe.stages.decode import decode as decode_stage
from segpipe.stages.decode import recorded_kind
from segpipe.stages.export.as_tracked import ExportsAsTracked
from segpipe.stages.export.stage import FORMATS
from segpipe.stages.track.stage import check_family
from segpipe.stages.track.stage import track as track_stage
from segpipe.store.layout import export_folder
from segpipe.store.retention import keep_setting, refuse_on_dask, set_keep
from segpipe.store.runstore import RunStore


def settled(video, store, prompts, settings: Settings) -> Settings:
    """`settings` checked (and the prompts against the source), before anything is
    written; then resolved (`defaults.resolve`: the store's where not given) and sized
    (`defaults.sized`: a new store at the size the weights were trained at)."""
    from segpipe.model import resolve_weights, trained_size
    from segpipe.stages.export.formats import run_formats

    decoding, encoding = settings.decoding.check(), settings.encoding.check()
    execution, output = settings.execution.check(), settings.output.check(FORMATS)
    formats = run_formats()
    if settings.tracking.concepts:  # instance ids grow past DAVIS's 255
        formats = [f for f in formats if f != "davis"]
    output = Output(output.keep, tuple(output.formats(formats)))
    if execution.on_dask:
        refuse_on_dask(output.keep)
    loaded = None
    if settings.tracking.concepts:
        check_concepts(settings.tracking, execution)
    if prompts is not None:
        args = (decoding.stream, decoding.fps, store)
        loaded = check_prompts(video, prompts, output.exports, *args)
    decoding, encoding, output = defaults.resolve(
        store, "run", execution.quiet, decoding, encoding, output
    )
    model = encoding.model
    if settings.tracking.concepts and not family_of(model).detects:
        raise BadInput(f"{model} has no detector: concept prompts need --model sam3-video")
    if loaded is not None:  # what the family's tracking refuses, said before the decode
        t = settings.tracking
        asked = {"non_overlap": t.non_overlap, "object_start": t.object_start}
        options = {**asked, "object_batch": t.object_batch or 1}
        check_family(model, loaded, options, concepts=bool(t.concepts))
    if decoding.image_size is not None:  # before any download
        family_of(model).check_size(model, decoding.image_size)
    # (`sized` finds the weights: none, said now, before anything is written)
    weights = resolve_weights(model, encoding.checkpoint, encoding.random_weights)
    decoding = defaults.sized(decoding, encoding, execution, "run")
    size = decoding.image_size or DEFAULTS["image_size"]
    family_of(model).check_size(model, size)
    # (a transformers checkpoint's config says its size; SAM 2's checkpoint is not opened)
    if settings.tracking.concepts:  # its tokenizer counts them (no model built)
        family_of(model).check_concepts(model, settings.tracking.check_concepts(), weights)
    made_at = trained_size(weights) if family_of(model).session_tracker else None
    if made_at not in (None, size):
        raise BadInput(f"{model}'s checkpoint is made for --image-size {made_at}, not {size}")
    return Settings(decoding, encoding, settings.tracking, output, execution)


def run(video, store, prompts, settings: Settings, space, cluster) -> None:
    """Every stage on `store` with `settings` (resolved: `defaults.resolve`); `space` is
    asked before each stage writes, `cluster` (or None) runs chunks on Dask."""
    from segpipe.stages.encode import encode as encode_stage  # torch: once there is work

    output, execution = settings.output, settings.execution
    quiet = execution.quiet
    tracking = prompts is not None or bool(settings.tracking.concepts)
    write_frames = _frames_written(output.keep) if tracking else None
    alongside = _decoded(video, store, settings, prompts, cluster, space, write_frames)
    try:
        set_keep(RunStore.open(store), output.keep)
        if prompts is not None:  # the frame range too, now that it is known, before encoding
            alongside = _frames_checked(store, prompts, alongside, quiet)
        encoding = (settings.encoding, settings.execution)
        if not tracking:
            encode_stage(store, *encoding, space=space, cluster=cluster)
            return
        # the model, checked and recorded (on Dask, every chunk encoded: the workers have
        # nothing else to do yet)
        chunks = [] if cluster is None else None
        encode_stage(store, *encoding, chunks=chunks, space=space, cluster=cluster)
        if alongside is not None:  # (once the prompts and model are checked: see alongside)
            alongside.begin()
        args = (store, prompts, settings, cluster, space)
        exporting = _tracked_to_the_count(video, args, alongside, encode_stage)
        exporting.finish(quiet)
        if keep_setting(RunStore.open(store)) == "all" and cluster is None:  # the chunks no
            encode_stage(store, *encoding, space=space)  # pass needed: re-prompting is then free
    finally:
        if alongside is not None:
            alongside.close()


def check_concepts(tracking, execution) -> None:
    """A concept tracking's settings checked before anything is written."""
    tracking.check_concepts()
    if execution.on_dask:
        raise BadInput("concept prompts are tracked in one process so far (no --workers)")


def _decoded(video, store, settings: Settings, prompts, cluster, space, write_frames):
    """The video decoded; or, for a tracking in this process, its decode to run alongside
    (returned, to `begin`) where the source claims its count (`stages.alongside`)."""
    execution = settings.execution
    how = dict(force=execution.force, space=space, write_frames=write_frames, quiet=execution.quiet)
    if prompts is not None and cluster is None:
        alongside = start_alongside(Path(video), Path(store), settings.decoding, **how)
        if alongside is not None:
            return alongside
    decode_stage(Path(video), Path(store), settings.decoding, **how)
    return None


def _frames_checked(store, prompts, alongside, quiet: bool):
    """The prompts' frames checked against the count the tracking works to. A prompt past a
    count claimed (`alongside`) may be within the frames the video decodes to: the video
    is then decoded before the tracking (None returned: nothing decodes alongside)."""
    try:
        _check_frames(store, prompts)
        return alongside
    except BadInput:
        if alongside is None:
            raise
        _check_frames(store, prompts, 1 << 62)  # (only the frames were refused)
    log.info(
        f"run: a prompt past the {alongside.claimed} frames {alongside.claimant}: "
        "decoding the video before the tracking",
        quiet,
    )
    alongside.begin()
    alongside.finish()
    alongside.close()
    _check_frames(store, prompts)
    return None


def _tracked_to_the_count(video, args, alongside, encode_stage) -> ExportsAsTracked:
    """`_tracked(*args)`; where the video decodes to another count than the one claimed,
    which the tracking worked to (`alongside`), the tracking again on the count decoded
    (its features made for the other count too)."""
    try:
        exporting = _tracked(*args)
        if alongside is not None and alongside.finish() != alongside.claimed:
            raise CountChanged("the video decodes past its container's count")
        return exporting
    except CountChanged:
        T = alongside.finish()
        store, prompts, settings, _, space = args
        quiet = settings.execution.quiet
        log.info(
            f"run: {video} decodes to {T} frames, not the {alongside.claimed} "
            f"{alongside.claimant}: tracking again on {T}",
            quiet,
        )
        _check_frames(store, prompts)
        encode_stage(store, settings.encoding, settings.execution, chunks=[], space=space)
        return _tracked(*args, force=True)


def _check_frames(store, prompts, count: int | None = None) -> None:
    """The prompts against the frame count (the one the tracking works to), or `count`."""
    opened = RunStore.open(store)
    video = opened.attrs["video"]
    count = opened.frame_count if count is None else count
    prompt_file.load(prompts, count, video["width"], video["height"])


def _tracked(store, prompts, settings: Settings, cluster, space, force=False) -> ExportsAsTracked:
    """The tracking, its chunks exported as they are committed (`force`: tracked anew); the
    exports, to finish."""
    formats = settings.output.exports
    exporting = ExportsAsTracked(
        store, [dict(fmt=f, out=export_folder(store) / FORMATS[f].output) for f in formats], cluster
    )
    track_stage(
        store,
        prompts,
        settings.tracking,
        settings.encoding,
        replace(settings.execution, force=force),  # (run's --force is decode's and encode's)
        # (a concept tracking's instances are known at its end: exported at the finish)
        on_commit=None if settings.tracking.concepts else exporting.committed,
        cluster=cluster,
        space=space,
    )
    return exporting


def _frames_written(keep: str | None):
    """decode's `write_frames`: under `--keep masks` its first pass only counts, times and
    digests the frames (the passes decode again each chunk they encode), so none is
    written."""

    def written(store) -> bool:
        return (keep or keep_setting(store)) != "masks"

    return written


def check_prompts(video, prompts, exports: list[str], stream=None, fps=None, store=None) -> list:
    """The prompts read and checked against the source before anything is written: points,
    boxes and masks against the frame size, object ids against the exports (DAVIS PNGs hold
    ids 1..255), frames against the frame count known before decoding: a frame folder's,
    or the count a video's container records, where it records one (a frame past it, and
    past what its duration claims, is refused before an hour of decoding; on a store decoded
    already, past its frames too). The container's count is its claim, so `run` checks the
    frames again against the count it tracks to, before anything is encoded."""
    info = probe(Path(video), stream, fps, None if store is None else recorded_kind(store))
    known = (
        info.claimed_frames
        if named(info.kind).counted
        else max(info.container_frames, info.claimed_frames)  # the container's two claims
        if info.container_frames
        else 1 << 62
    )
    if store is not None and RunStore.exists(store):  # decoded already: the frames decoded
        known = max(known, RunStore.open(store, read_only=True).attrs.get("frame_count") or 0)
    loaded = prompt_file.load(prompts, known, info.width, info.height)
    ids = prompt_file.object_ids(loaded)
    if "davis" in exports and any(not 1 <= i <= 255 for i in ids):
        raise BadInput(
            f"davis PNGs hold object ids 1..255; the prompts have ids {ids}: "
            f"renumber them, or leave davis out of --export"
        )
    return loaded
