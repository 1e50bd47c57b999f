"""Retention: which chunks of model-input frames and image features a store keeps.

`keep="all"` keeps everything (re-prompting then costs no encoding). `keep="masks"` drops a
chunk's frames once it is encoded and its features once every tracking pass that reads
them has committed it: a long video then never has more than a few chunks of either on
disk, and the masks, the memory snapshots, the pts and timestamps stay. A dropped chunk is
recorded before its files go (ledgers `dropped_frames` / `dropped_features`), so neither a
crash nor `repair` takes a dropped chunk for a damaged one. When tracking needs a dropped
chunk again, `ChunkSupply` decodes it again from the source (found by its stored pts and
proven by its frame digest) and encodes it again: the features are those first computed,
bit for bit (same frames, same model, same precision).
"""
from __future__ import annotations

import os

from .errors import BadInput
from .store import RunStore, fsync_path_dir

KEEPS = ("all", "masks")
DROPPABLE = {"frames": ("frames",),
             "features": ("features/level0", "features/level1", "features/level2")}
MADE_BY = {"frames": "decode", "features": "encode"}


def keep_setting(store: RunStore) -> str:
    return store.attrs.get("keep", "all")


def set_keep(store: RunStore, keep: str | None) -> None:
    if keep is None:
        return
    if keep not in KEEPS:
        raise BadInput(f"--keep must be one of {', '.join(KEEPS)}, got {keep!r}")
    if keep != keep_setting(store):
        store.set_attrs(keep=keep)


def dropped(store: RunStore, what: str):
    return store.ledger(f"dropped_{what}")


def has(store: RunStore, what: str, k: int) -> bool:
    """Whether chunk k of `what` ("frames" or "features") is on disk: made and not dropped."""
    return k in on_disk(store, what)


def on_disk(store: RunStore, what: str) -> set[int]:
    """The chunks of `what` on disk: made and not dropped."""
    import numpy as np
    made = store.ledger(MADE_BY[what]).done()
    gone = dropped(store, what).done()
    here = made.copy()
    n = min(len(made), len(gone))
    here[:n] &= ~gone[:n]
    return set(np.nonzero(here)[0].tolist())


def drop(store: RunStore, what: str, k: int) -> None:
    """Record chunk k of `what` dropped, then delete its files (a crash in between leaves
    files that are ignored and deleted again next time)."""
    if what == "frames" and store.array("frame_digests") is None:
        return  # a store from before digests: its frames could not be found again
    dropped(store, what).mark_done(k)
    for name in DROPPABLE[what]:
        arr = store.array(name)
        if arr is None:
            continue
        path = store.chunk_file(name, k, arr.ndim)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        fsync_path_dir(path.parent)


def restored(store: RunStore, what: str, k: int) -> None:
    """Chunk k of `what` was made again (its stage committed it): no longer dropped."""
    gone = dropped(store, what).done()
    if k < len(gone) and gone[k]:
        dropped(store, what).undo(k)


def sweep(store: RunStore) -> None:
    """Drop every chunk of frames and features still on disk (a run under `--keep masks`
    that is complete: a crash may have left some between their last use and their drop)."""
    for what in DROPPABLE:
        for k in sorted(on_disk(store, what)):
            drop(store, what, k)
