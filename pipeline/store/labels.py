"""The names and classes of a store's objects (`segpipe.labels`): the `labels` attribute,
apart from what the store tracked, so that naming an object redoes no tracking (the
exports that show names are redone: their record holds the names)."""

from __future__ import annotations

from segpipe.errors import BadInput
from segpipe.labels import MAX_LABELS, Label, entries, parse
from segpipe.store.runstore import RunStore


def stored(store: RunStore) -> dict[int, Label]:
    """The store's labels by object id (none recorded: {})."""
    return parse(store.attrs.get("labels", []), f"store {store.path}")


def save(
    store: RunStore, labels: dict[int, Label], replace: bool = False, remove=()
) -> dict[int, Label]:
    """`labels` recorded over the store's (those of other ids kept but the ids in `remove`;
    `replace`: only `labels`), in one write; what the store then holds."""
    before = stored(store)
    gone = set(remove)
    kept = {} if replace else {i: v for i, v in before.items() if i not in gone}
    merged = {**kept, **labels}
    if len(merged) > MAX_LABELS:
        raise BadInput(f"{len(merged):,} objects named: segpipe takes at most {MAX_LABELS:,}")
    if merged != before:
        store.set_attrs(labels=entries(merged))
    return merged


def of_objects(store: RunStore, ids) -> dict[int, Label] | None:
    """The labels of objects `ids` (an export's), each id with one (unnamed: its id only);
    None where none of them has a name or a class (an object only listed, as "+ object"
    lists it, is not named), so that an export of a store without names is what it always
    was."""
    labels = stored(store)
    if not any(i in labels and (labels[i].name or labels[i].category) for i in ids):
        return None
    return {i: labels.get(i, Label(i)) for i in ids}
