"""The prompts' edit history in the store (`segpipe.store.edits`): undo and redo go back
and forth through whole steps, a change clears what could be redone, the history keeps its
last steps within its bounds, and a damaged history is dropped, never a reason to refuse."""

from segpipe.store import edits
from segpipe.store.runstore import RunStore


def entry(n: int, pad: int = 0) -> list[dict]:
    return [{"object": 1, "frame": n, "box": [0, 0, 4, 4], **({"mask": "x" * pad} if pad else {})}]


def test_undo_and_redo_move_whole_steps_and_a_change_clears_the_redo_list(tmp_path):
    store = RunStore.create(tmp_path / "s.zarr", {})
    assert edits.undo(store, entry(0)) is None and edits.redo(store, entry(0)) is None
    edits.changed(store, [])  # [] -> entry 1
    edits.changed(store, entry(1))  # -> entry 2
    assert edits.counts(store) == {"undo": 2, "redo": 0}
    assert edits.undo(store, entry(2)) == entry(1)
    assert edits.undo(store, entry(1)) == []
    assert edits.counts(store) == {"undo": 0, "redo": 2}
    assert edits.redo(store, []) == entry(1)
    edits.changed(store, entry(1))  # a new change: nothing to redo any more
    assert edits.counts(store) == {"undo": 2, "redo": 0}
    assert edits.counts(RunStore.open(store.path)) == {"undo": 2, "redo": 0}


def test_the_history_keeps_its_last_steps_within_its_bounds(tmp_path, monkeypatch):
    store = RunStore.create(tmp_path / "s.zarr", {})
    for n in range(edits.MAX_STEPS + 5):
        edits.changed(store, entry(n))
    assert edits.counts(store)["undo"] == edits.MAX_STEPS
    assert edits.undo(store, entry(-1)) == entry(edits.MAX_STEPS + 4)  # the latest kept
    monkeypatch.setattr(edits, "MAX_BYTES", 3000)
    for n in range(5):
        edits.changed(store, entry(n, pad=1000))  # about 1 kB each: the oldest go
    kept = edits.steps(store)["undo"]
    assert 1 <= len(kept) <= 2 and kept[-1] == entry(4, pad=1000)
    assert (store.path / edits.HISTORY).stat().st_size <= 3000


def test_a_damaged_history_is_dropped(tmp_path):
    store = RunStore.create(tmp_path / "s.zarr", {})
    for text in ("{not json", '{"undo": 3}', "[]"):
        (store.path / edits.HISTORY).write_text(text)
        assert edits.counts(store) == {"undo": 0, "redo": 0}
        edits.changed(store, entry(0))
        assert edits.counts(store) == {"undo": 1, "redo": 0}
