"""The prompts' edit history: what undo and redo go back and forth through, kept in the
store's folder (`prompts.history.json`) so that it outlives a reload, a tab and the studio.

Each step is the whole list of prompt entries before a change (masks inline, as the draft
holds them). A change pushes the entries it replaces on the undo list and clears the redo
list; undo and redo move the entries between the two. The history keeps its last
`MAX_STEPS` steps within `MAX_BYTES` (the oldest go first), and is written atomically: a
crash leaves the history before or after a change, never half of one."""

from __future__ import annotations

import json

from segpipe.fsutil import atomic_write, fsync_path_dir
from segpipe.limits import read_json_file
from segpipe.store.runstore import RunStore

HISTORY = "prompts.history.json"
MAX_STEPS = 100
MAX_BYTES = 16 << 20


def steps(store: RunStore) -> dict[str, list]:
    """{"undo": [entries, ...], "redo": [...]}, the latest last (empty without a history, or
    where the file is not one: a history is a convenience, never a reason to refuse)."""
    path = store.path / HISTORY
    empty = {"undo": [], "redo": []}
    if not path.is_file():
        return empty
    try:
        doc = read_json_file(path, "prompts history")
    except Exception:  # noqa: BLE001 - a damaged history is dropped, the prompts are not
        return empty
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list) for k in empty):
        return empty
    return {k: doc[k] for k in empty}


def counts(store: RunStore) -> dict[str, int]:
    return {k: len(v) for k, v in steps(store).items()}


def changed(store: RunStore, before: list[dict]) -> None:
    """A change replaced `before`: it can be undone, and nothing redone."""
    history = steps(store)
    _write(store, {"undo": [*history["undo"], before], "redo": []})


def peek(store: RunStore, which: str) -> list | None:
    """The entries `which` ("undo" or "redo") would give, without moving them (None: none)."""
    history = steps(store)[which]
    return history[-1] if history else None


def drop(store: RunStore, which: str) -> None:
    """Drop the step `which` would take (one found not to be prompts)."""
    history = steps(store)
    history[which] = history[which][:-1]
    _write(store, history)


def undo(store: RunStore, now: list[dict]) -> list[dict] | None:
    """The entries before the last change (None: nothing to undo); `now` can be redone."""
    return _move(store, now, "undo", "redo")


def redo(store: RunStore, now: list[dict]) -> list[dict] | None:
    """The entries the last undo replaced (None: nothing to redo); `now` can be undone."""
    return _move(store, now, "redo", "undo")


def _move(store: RunStore, now: list[dict], source: str, target: str) -> list[dict] | None:
    history = steps(store)
    if not history[source]:
        return None
    *rest, entries = history[source]
    _write(store, {source: rest, target: [*history[target], now]})
    return entries


def _write(store: RunStore, history: dict[str, list]) -> None:
    undo_steps, redo_steps = history.get("undo", []), history.get("redo", [])
    undo_steps = undo_steps[-MAX_STEPS:]
    while True:
        data = json.dumps({"undo": undo_steps, "redo": redo_steps}).encode()
        if len(data) <= MAX_BYTES or not (undo_steps or redo_steps):
            break
        if undo_steps:  # the oldest step goes first
            undo_steps = undo_steps[1:]
        else:
            redo_steps = redo_steps[1:]
    atomic_write(store.path / HISTORY, data)
    fsync_path_dir(store.path)
