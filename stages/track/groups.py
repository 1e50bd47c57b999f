"""Object groups: the units a tracking pass runs in.

In sam2 1.1.0 `propagate_in_video` tracks each object alone (`batch_size=1`, only the
image features shared), so a pass over O objects can run as groups of objects, each a
sequential pass over the chunks with its own memory, giving exactly the masks of the whole
at the thread count each group runs with. What couples objects is the output under
non-overlap (every object's logits of a frame), and under `--object-batch` the batches
(`stages.track.batch`): such a tracking runs as one group (`coupled`).

Everything a group writes is its objects' own (`memory/<dir>/<slot>/`, the objects' ledgers,
their zarr chunks of the results), so groups side by side never write one file, and each
resumes from its objects' ledgers whatever the grouping of the run that stopped.
"""

from __future__ import annotations

from segpipe.store.ledger import object_stage
from segpipe.store.runstore import RunStore


def split(slots: list[int], n: int) -> list[list[int]]:
    """`slots` in `n` contiguous parts, as even as can be (the first ones one larger)."""
    n = max(1, min(n, len(slots)))
    q, r = divmod(len(slots), n)
    parts, i = [], 0
    for g in range(n):
        size = q + (g < r)
        parts.append(slots[i : i + size])
        i += size
    return parts


def coupled(options: dict) -> bool:
    """Whether the tracking's objects are computed together, so run as one group: under
    non-overlap (each pixel's owner needs every object's logits) and under `--object-batch`
    (a batched step's bits depend on the batch: `stages.track.batch`)."""
    return bool(options["non_overlap"]) or options.get("object_batch", 1) > 1


def object_todo(store: RunStore, direction: str, slots: list[int], chunks: list[int]) -> list[int]:
    """The chunks of `chunks` (in their order) some object of `slots` has not done."""
    left = set()
    for s in slots:
        left.update(store.ledger(object_stage(direction, s)).todo(chunks))
    return [k for k in chunks if k in left]


def object_groups(
    store: RunStore,
    direction: str,
    chunks: list[int],
    groups: int,
    options: dict,
    together: bool = False,
) -> list[list[int]]:
    """The groups (object slots, contiguous) pass `direction` runs, those with chunks left:
    the tracking's objects in `groups` parts (one when `coupled`), each cut where its
    objects' ledgers differ (a kill between two objects' records, or a run in other groups
    stopped), so the objects of a group resume from one snapshot. When coupled the one
    group is every object, redoing a chunk for those that had it done (the same bits)."""
    n = len(store.attrs["track"]["object_ids"])
    if coupled(options) or together:  # (together: `--keep masks` in one process)
        every = list(range(n))
        return [every] if object_todo(store, direction, every, chunks) else []
    return [
        g for part in split(list(range(n)), groups) for g in cut(store, direction, chunks, part)
    ]


def cut(store: RunStore, direction: str, chunks: list[int], slots: list[int]) -> list[list[int]]:
    """`slots` (contiguous) cut where its objects' ledgers differ on `chunks`, leaving out
    the objects with nothing to do: each part's objects resume from one snapshot, and none
    redoes a chunk it has done (a Dask task run again after its worker died cuts its group
    so too)."""
    out, last = [], None
    for s in slots:
        todo = object_todo(store, direction, [s], chunks)
        if todo and todo == last:
            out[-1].append(s)
        elif todo:
            out.append([s])
        last = todo or None
    return out
