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

from segpipe.errors import BadInput
from segpipe.fsutil import fsync_path_dir
from segpipe.store.runstore import RunStore

KEEPS = ("all", "masks")
DROPPABLE = {
    "frames": ("frames",),
    "features": ("features/level0", "features/level1", "features/level2"),
}
MADE_BY = {"frames": "decode", "features": "encode"}


def keep_setting(store: RunStore) -> str:
    """What the store keeps ("all" where nothing was said): its `output` record's."""
    return (store.attrs.get("output") or {}).get("keep", "all")


def check_keep(keep: str | None) -> None:
    """None (the store's setting) or one of `KEEPS`."""
    if keep is not None and keep not in KEEPS:
        raise BadInput(f"--keep must be one of {', '.join(KEEPS)}, got {keep!r}")


def refuse_on_dask(keep: str, store=None) -> None:
    """`--keep masks` runs in one process (a chunk's features come and go with the pass that
    reads them): refused on Dask (`--workers`, `--scheduler`), before anything starts.
    `store`: the store whose setting it is (else the command line's)."""
    if keep == "masks":
        whose = f"store {store} keeps only masks (--keep masks), which" if store else "--keep masks"
        raise BadInput(f"{whose} runs in one process: run it without --workers or --scheduler")


def set_keep(store: RunStore, keep: str | None) -> None:
    check_keep(keep)
    if keep is not None and keep != keep_setting(store):
        store.set_attrs(output={"keep": keep})


def dropped(store: RunStore, what: str):
    return store.ledger(f"dropped_{what}")


def has(store: RunStore, what: str, k: int) -> bool:
    """Whether chunk k of `what` ("frames" or "features") is on disk: made and not dropped."""
    return store.ledger(MADE_BY[what]).is_done(k) and not dropped(store, what).is_done(k)


def on_disk(store: RunStore, what: str) -> set[int]:
    """The chunks of `what` on disk: made and not dropped."""
    import numpy as np

    here = store.ledger(MADE_BY[what]).done()  # a fresh array
    gone = dropped(store, what).done()
    n = min(len(here), len(gone))
    here[:n] &= ~gone[:n]
    return set(np.nonzero(here)[0].tolist())


def drop(store: RunStore, what: str, k: int) -> None:
    """Record chunk k of `what` dropped, then delete its files (a crash in between leaves
    files that are ignored, and deleted by the next `sweep`)."""
    dropped(store, what).mark_done(k)
    for name in DROPPABLE[what]:
        arr = store.array(name)
        if arr is None:
            continue
        _unlink(store.chunk_file(name, k, arr.ndim))


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_path_dir(path.parent)


def restored(store: RunStore, what: str, k: int) -> None:
    """Chunk k of `what` was made again (its stage committed it): no longer dropped."""
    ledger = dropped(store, what)
    if ledger.is_done(k):
        ledger.undo(k)


def sweep(store: RunStore) -> None:
    """Under `--keep masks`, once tracking is complete: drop every chunk of frames and
    features still on disk (a crash may have left some between their last use and their
    drop), and delete the files of dropped chunks that a crash left behind (between a
    drop's record and its deletes)."""
    if keep_setting(store) != "masks":
        return
    for what in DROPPABLE:
        for k in sorted(on_disk(store, what)):
            drop(store, what, k)
        gone = dropped(store, what).done()
        for name in DROPPABLE[what]:
            arr = store.array(name)
            folder = store.path / name / "c"
            if arr is None or not folder.is_dir():
                continue
            for entry in os.listdir(folder):  # the chunks with files: few, unlike the dropped
                if entry.isdigit() and int(entry) < len(gone) and gone[int(entry)]:
                    _unlink(store.chunk_file(name, int(entry), arr.ndim))
