"""What each stage owns in the store (the reset table: resetting a stage resets every
later one), and where its outputs go."""

from __future__ import annotations

from pathlib import Path

from segpipe.errors import StoreNotReady
from segpipe.store.runstore import RunStore

# What each stage owns in the store: resetting a stage resets every later one too.
# (decode owns the whole store: starting it over means a new store.)
# The tracking results, one chunk per pipeline chunk (written with the memory snapshots).
TRACK_ARRAYS = ("masks", "object_scores", "object_areas", "tracked")

# A pass's memory, per object (its slot): `memory/<direction>/<slot>/prompted_*` (its prompted
# frames' outputs) and `.../recent_*` (a snapshot per chunk boundary): `stages.track.memory`.
RECENT = ("maskmem_frame", "maskmem", "ptr_frame", "ptr", "score")
PROMPTED = ("frame", "maskmem", "ptr", "score", "logits")


def memory_arrays(direction: str, slot: int, kind: str) -> list[str]:
    """An object's memory arrays of a pass: `kind` "recent" (the snapshots) or "prompted"."""
    names = RECENT if kind == "recent" else PROMPTED
    return [f"memory/{direction}/{slot}/{kind}_{n}" for n in names]


def session_arrays(store: RunStore, direction: str, kind: str) -> list[str]:
    """A pass's memory of a family tracked in its own session (`stages.track.session`):
    every object's, under `memory/<direction>/session/`, its `kind` ("recent" or
    "prompted") arrays the store holds."""
    root = f"memory/{direction}/session"
    try:
        names = sorted(store.group[root].array_keys())
    except KeyError:
        return []
    return [f"{root}/{n}" for n in names if n.startswith(f"{kind}_")]


STAGE_OUTPUTS = {
    "encode": {
        "arrays": ["features"],
        "ledgers": ["encode", "dropped_features"],
        "attrs": ["model"],
    },
    "track": {
        "arrays": [
            "masks",
            "object_scores",
            "object_areas",
            "tracked",
            "memory",
            "prompt_masks",
            "instances",
        ],
        "ledgers": ["track_forward", "track_reverse"],
        "attrs": ["track"],
    },
    "export": {
        "arrays": [],
        "ledgers": [],  # each export's, `export_<name>`: those the store records (`ledgers`)
        "attrs": ["exports"],
    },
}


def ledgers(store: RunStore, stage: str) -> list[str]:
    """The ledgers `stage` owns in `store`: its own, and for the exports one per export,
    `export_<name>` (any registered format, and the dataset command's `vos`): those the
    store records, and any on disk without a record."""
    if stage == "export":
        folder = store.path / "ledger"
        on_disk = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        recorded = [f"export_{name}" for name in store.attrs.get("exports", {})]
        return sorted({*recorded, *(n for n in on_disk if n.startswith("export_"))})
    return STAGE_OUTPUTS[stage]["ledgers"]


def reset_from(store: RunStore, stage: str) -> None:
    """Start `stage` and every later stage over. Crash-safe order: done-records go first,
    then the data, then the settings that say what the data was made with."""
    stages = list(STAGE_OUTPUTS)[list(STAGE_OUTPUTS).index(stage) :]
    for s in stages:
        for ledger in ledgers(store, s):
            store.ledger(ledger).reset()
    for s in stages:
        for name in STAGE_OUTPUTS[s]["arrays"]:
            store.delete(name)
    store.drop_attrs(*(key for s in stages for key in STAGE_OUTPUTS[s]["attrs"]))


def require_decoded(store: RunStore) -> int:
    """The store's frame count (`RunStore.frame_count`: while a run decodes alongside its
    tracking, the count it works to); a store not decoded yet is refused."""
    T = store.frame_count
    if T is None:
        raise StoreNotReady(f"store {store.path} is not fully decoded yet (run `segpipe decode`)")
    return T


def export_folder(store) -> Path:
    """Where `run` exports: `<store name>.export/` beside the store."""
    store = Path(store)
    return store.with_name(store.name.removesuffix(".zarr") + ".export")
