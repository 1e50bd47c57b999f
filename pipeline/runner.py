"""The pipelined run (`segpipe run`, `segpipe.run`): decode, then, with prompts, each chunk
encoded just before a pass tracks it and exported as soon as its masks are final.

The whole run holds the store's lock (Dask's workers write under it), and each stage it
calls resumes where the store stopped, so a rerun after a crash redoes at most the chunks
that were in flight.
"""

from __future__ import annotations

from pathlib import Path

from segpipe import prompts as prompt_file
from segpipe.errors import BadInput
from segpipe.settings import Decoding, Tracking
from segpipe.sources.registry import named, probe
from segpipe.stages.decode import decode as decode_stage
from segpipe.stages.decode import recorded_kind
from segpipe.stages.export.as_tracked import ExportsAsTracked
from segpipe.stages.export.stage import FORMATS
from segpipe.stages.track.stage import track as track_stage
from segpipe.store.layout import export_folder
from segpipe.store.retention import keep_setting, set_keep


def run(
    video,
    store,
    prompts,
    *,
    decoding: Decoding,
    encoding: dict,
    tracking: Tracking,
    groups: int | None,
    exports: list[str],
    keep: str | None,
    space,
    cluster,
    quiet: bool,
) -> None:
    """Every stage on `store`, with the settings of each (`encoding`: encode's keywords; decode
    takes its `force`, track its device, weights and environment setting); `space`
    is asked before each stage writes, `cluster` (or None) runs chunks on Dask."""
    from segpipe.stages.encode import encode as encode_stage  # torch: once there is work

    decoded = decode_stage(
        Path(video),
        Path(store),
        decoding,
        quiet=quiet,
        force=encoding["force"],
        space=space,
        write_frames=_frames_written(keep) if prompts is not None else None,
    )
    set_keep(decoded, keep)
    if prompts is not None:  # the frame range too, now that it is known, before encoding
        video_attrs = decoded.attrs["video"]
        prompt_file.load(
            prompts, decoded.attrs["frame_count"], video_attrs["width"], video_attrs["height"]
        )
    encoding = dict(encoding, quiet=quiet, space=space)
    if prompts is None:
        encode_stage(store, **encoding, cluster=cluster)
        return
    # the model, checked and recorded (on Dask, every chunk encoded: the workers have
    # nothing else to do yet)
    encode_stage(store, **encoding, chunks=[] if cluster is None else None, cluster=cluster)
    exporting = ExportsAsTracked(
        store, [dict(fmt=f, out=export_folder(store) / FORMATS[f].output) for f in exports], cluster
    )
    track_stage(
        store,
        prompts,
        tracking,
        device=encoding["device"],
        checkpoint=encoding["checkpoint"],
        quiet=quiet,
        on_commit=exporting.committed,
        batch_size=encoding["batch_size"],
        cluster=cluster,
        space=space,
        groups=groups,
        allow_env_change=encoding["allow_env_change"],
    )
    exporting.finish(quiet)
    if keep_setting(decoded) == "all" and cluster is None:  # the chunks no pass needed:
        encode_stage(store, **encoding)  # re-prompting is then free


def _frames_written(keep: str | None):
    """decode's `write_frames`: under `--keep masks` its first pass only counts, times and
    digests the frames (the passes decode again each chunk they encode), so none is
    written."""

    def written(store) -> bool:
        return (keep or keep_setting(store)) != "masks"

    return written


def check_prompts(video, prompts, exports: list[str], stream=None, fps=None, store=None) -> None:
    """The prompts read and checked against the source before anything is written: points,
    boxes and masks against the frame size, object ids against the exports (DAVIS PNGs hold
    ids 1..255), frames against the frame count known before decoding: a frame folder's,
    or the count a video's container records, where it records one (a frame past it, and
    past what its duration claims, is refused before an hour of decoding). The container's
    count is its claim, so `run` checks the frames again once the video is decoded, before
    anything is encoded."""
    info = probe(Path(video), stream, fps, None if store is None else recorded_kind(store))
    known = (
        info.claimed_frames
        if named(info.kind).counted
        else max(info.container_frames, info.claimed_frames)  # the container's two claims
        if info.container_frames
        else 1 << 62
    )
    loaded = prompt_file.load(prompts, known, info.width, info.height)
    ids = prompt_file.object_ids(loaded)
    if "davis" in exports and any(not 1 <= i <= 255 for i in ids):
        raise BadInput(
            f"davis PNGs hold object ids 1..255; the prompts have ids {ids}: "
            f"renumber them, or leave davis out of --export"
        )
