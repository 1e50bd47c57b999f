"""Disk space: what a store holds on disk, the file system's free space, and the check
before each stage writes (`SpaceGuard`, `--no-space-check`), which prints the estimate
(`segpipe.estimate`) and refuses, in one line, a command that would not fit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from segpipe.errors import NotEnoughSpace
from segpipe.estimate import (
    RESIDENT_CHUNKS,
    SAMPLE_FRAMES,
    Estimate,
    Later,
    before_decode,
    frame_rate_of,
    from_store,
    human,
)


def disk_usage(path: Path) -> tuple[dict[str, int], int]:
    """(bytes by array, bytes of the whole store) of the store at `path` ({}, 0 without one)."""
    from segpipe.store.runstore import RunStore

    if not RunStore.exists(path):
        return {}, 0
    store = RunStore.open(path, read_only=True)
    sizes = store.array_bytes()
    return sizes, store_total(store.path, sizes)


def store_total(path: Path, sizes: dict[str, int]) -> int:
    """Bytes of the whole store: its arrays (`RunStore.array_bytes`, one walk) and the
    metadata of the groups holding them (the root's and every folder's above an array)."""
    folders = {Path(".")} | {parent for name in sizes for parent in Path(name).parents}
    total = sum(sizes.values())
    for folder in folders:
        try:
            total += os.stat(Path(path) / folder / "zarr.json").st_size
        except OSError:
            pass
    return total


def sample_frame_bytes(video: Path, info, C: int, S: int) -> tuple[float, str] | None:
    """Compressed bytes per frame of the source at model size S, as the store will compress
    them: up to `SAMPLE_FRAMES` consecutive frames from the start and from the middle, each
    run compressed as one chunk (zstd level 3 and a crc32c, the store's codecs); the mean.
    None when no frame can be sampled (the estimate then uses the raw size)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from numcodecs import Zstd

    from segpipe.sources.frames import model_input, resize_workers
    from segpipe.sources.registry import sample

    n = max(1, min(C, SAMPLE_FRAMES))
    runs = []
    try:
        starts = [0]
        if info.claimed_frames and info.claimed_frames >= 3 * n:
            starts.append(info.claimed_frames // 2)
        # resized side by side, as decode resizes (PIL releases the GIL)
        with ThreadPoolExecutor(resize_workers()) as resizer:
            for start in starts:
                pictures = sample(Path(video), info, start, n)
                if pictures:
                    chunk = np.stack(list(resizer.map(lambda p: model_input(p, S), pictures)))
                    runs.append((len(Zstd(level=3).encode(chunk.tobytes())) + 4, len(chunk)))
    except Exception:  # noqa: BLE001 - a sample is a hint: damage is decode's to report
        pass
    if not runs:
        return None
    per_frame = sum(b for b, _ in runs) / sum(n for _, n in runs)
    frames = sum(n for _, n in runs)
    return per_frame, f"zstd, {human(per_frame)} a frame measured on {frames} sample frames"


def free_bytes(path: Path) -> tuple[int, Path]:
    """Free bytes (for this user) on the file system of `path` or of its nearest existing
    parent, and that folder."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free, path


def check(
    est: Estimate | None,
    store_path: Path,
    stages,
    command: str,
    quiet: bool,
    enabled: bool = True,
    present: int | None = None,
    keep: str = "all",
) -> None:
    """Print the estimate (unless `quiet`), then refuse with `NotEnoughSpace` when the store
    needs more bytes than its file system has free (under `keep="masks"`, frames and
    features counted as `RESIDENT_CHUNKS` chunks)."""
    from segpipe import log

    if est is None:
        log.info(
            f"{command}: no storage estimate (the source does not say how many frames it "
            f"has); free space not checked",
            quiet,
        )
        return
    if present is None:
        present = disk_usage(store_path)[1]
    need = max(0, est.bytes_for(stages, keep) - present)
    free, where = free_bytes(store_path)
    log.info(est.summary(), quiet)
    held = (
        f" (--keep masks: frames and features {RESIDENT_CHUNKS} chunks at a time)"
        if keep == "masks"
        else ""
    )
    log.info(
        f"{command} writes up to {human(est.bytes_for(stages, keep))} of it{held}"
        + (f" ({human(present)} already in the store)" if present else "")
        + f"; {human(free)} free on {where}",
        quiet,
    )
    if enabled and need > free:
        raise NotEnoughSpace(
            f"not enough space for {store_path}: {command} needs about {human(need)} more, "
            f"{where} has {human(free)} free; free some space, or pass --no-space-check to "
            f"start anyway"
        )


class SpaceGuard:
    """The estimate and the free-space check of one command, made once, just before the
    first stage that has work writes anything (decode, encode and track call it: track
    when decode and encode had nothing to do).

    `stages`: the stages the command runs ("decode", "encode", "track"), whose groups the
    check counts; `later`: what the later stages will use; `keep`: the retention the
    command works under (None: the store's setting, for a `run` that resumes it)."""

    def __init__(
        self,
        store_path,
        stages,
        command: str,
        later: Later | None = None,
        enabled: bool = True,
        quiet: bool = False,
        keep: str | None = "all",
    ):
        self.store_path, self.stages, self.command = Path(store_path), tuple(stages), command
        self.later, self.enabled, self.quiet = later or Later(), enabled, quiet
        self.keep, self.done = keep, False

    def before_decode(self, store, video: Path, info, C: int, S: int) -> None:
        """Decode is about to write: `store` is the store it resumes, or None (a new store,
        or one started over: `--force`)."""
        if self.done:
            return
        later = self._later(info.width, info.height)
        sizes = store.array_bytes() if store is not None else {}
        sample = None
        if store is None or frame_rate_of(store, sizes) is None:
            sample = sample_frame_bytes(video, info, C, S)
        if store is not None:
            est = from_store(store, later, sample, sizes)
        else:
            est = before_decode(info, C, S, later, sample)
        self._check(est, store)

    def before_encode(self, store, embedding_dtype: str, precision: str) -> None:
        """Encode is about to write, with these settings."""
        if self.done:
            return
        video = store.attrs["video"]
        later = self._later(video["width"], video["height"])
        later.embedding_dtype, later.precision = embedding_dtype, precision
        self._check(from_store(store, later), store)

    def before_track(self, store) -> None:
        """`run`, when decode and encode had nothing to do."""
        if not self.done:
            video = store.attrs["video"]
            self._check(from_store(store, self._later(video["width"], video["height"])), store)

    def _later(self, width: int, height: int) -> Later:
        """`later` with its prompts read (objects, frames, mask prompts: the frame range is
        track's to check once the frame count is known; prompts that cannot be read are
        reported by track, and the estimate is then per object) and the default precision
        of the device where it matters (bfloat16 embeddings)."""
        later = Later(**vars(self.later))
        if later.prompts is not None:
            from segpipe import prompts as prompt_file

            try:
                later.prompts = prompt_file.load(later.prompts, 1 << 62, width, height)
            except Exception:  # noqa: BLE001
                later.prompts = None
        if later.embedding_dtype == "bfloat16" and later.precision is None:
            from segpipe.model import pick_device, precision_of

            try:
                later.precision = precision_of(None, None, pick_device(later.device))
            except Exception:  # noqa: BLE001 - encode reports a bad device
                pass
        return later

    def _check(self, est: Estimate | None, store) -> None:
        from segpipe.store.retention import keep_setting

        self.done = True
        keep = self.keep or (keep_setting(store) if store is not None else "all")
        check(est, self.store_path, self.stages, self.command, self.quiet, self.enabled, keep=keep)
