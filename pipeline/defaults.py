"""The settings a store holds are the defaults of every later command on it: chunk and image
size, the model and its weights (a random seed), the embedding dtype and what is kept (the
precision: encode and track take the store's themselves). `resolve` fills them into the
settings objects given (`segpipe.settings`), and says once which it took from the store,
where they are not the command line's own defaults."""

from __future__ import annotations

from dataclasses import fields, replace

from segpipe import log
from segpipe.model import trained_size
from segpipe.models.registry import family_of
from segpipe.settings import DEFAULTS, Decoding, Encoding, Execution, Output, recorded
from segpipe.store.runstore import RunStore

COMMAND_LINE = DEFAULTS  # the command line's defaults, where a store may hold another value
OPTION = {"random_weights": "--random-weights"}  # the rest: --name-with-dashes


def stored(store) -> dict:
    """The settings `store` records, by name (empty: no store yet)."""
    if not RunStore.exists(store):
        return {}
    opened = RunStore.open(store, read_only=True)
    found = {}
    for kind in (Decoding, Encoding, Output):
        had = recorded(opened, kind)
        if had is not None:
            found.update({f.name: getattr(had, f.name) for f in fields(had)})
    return {k: v for k, v in found.items() if v is not None and k in NAMES}


def resolve(
    store,
    command: str,
    quiet: bool,
    decoding: Decoding | None = None,
    encoding: Encoding | None = None,
    output: Output | None = None,
) -> tuple[Decoding | None, Encoding | None, Output | None]:
    """The settings given, with the store's in place of those not given (a store's random
    seed only where neither a checkpoint nor another model is given), and `DEFAULTS` for the
    model and dtype still missing (the sizes stay None on a new store: the weights may say
    theirs, `sized`). Says in one line which it took from the store that differ
    from the command line's defaults. A settings object not given (None) is left alone."""
    recorded = stored(store)
    if encoding is not None and (
        encoding.checkpoint is not None or encoding.model not in (None, recorded.get("model"))
    ):
        recorded.pop("random_weights", None)  # the store's seed is for the store's model
    objects = {"decoding": decoding, "encoding": encoding, "output": output}
    taken = []
    for which, names in FROM_THE_STORE.items():
        if objects[which] is None:
            continue
        given = {n: getattr(objects[which], n) for n in names}
        found = {n: recorded[n] for n, v in given.items() if v is None and n in recorded}
        objects[which] = replace(objects[which], **found)
        taken += [
            f"{OPTION.get(n, '--' + n.replace('_', '-'))} {v}"
            for n, v in found.items()
            if v != COMMAND_LINE.get(n)
        ]
    if taken:
        log.info(f"{command}: the store's settings: {' '.join(taken)}", quiet)
    encoding = objects["encoding"]
    return objects["decoding"], encoding and encoding.filled(), objects["output"]


# the settings a later command takes from the store, by the settings object that holds them
FROM_THE_STORE = {
    "decoding": ("chunk_size", "image_size"),
    "encoding": ("model", "random_weights", "embedding_dtype"),
    "output": ("keep",),
}
NAMES = {name for names in FROM_THE_STORE.values() for name in names}


def sized(decoding: Decoding, encoding: Encoding, execution: Execution, command: str) -> Decoding:
    """`decoding` with a new store's image size, where none is given: the size the weights
    (`encoding`, filled) say they were trained at (segpipe_tiny's do, and a transformers
    checkpoint's config; SAM 2's official checkpoints do not), else the family's native
    one (None: the command line's 1024), said where it is not 1024."""
    from segpipe.model import resolve_weights

    if decoding.image_size is not None:
        return decoding
    weights = resolve_weights(encoding.model, encoding.checkpoint, encoding.random_weights)
    native = family_of(encoding.model or DEFAULTS["model"]).native_size
    size, why = trained_size(weights), "the size these weights were trained at"
    if size is None and native is not None:
        size, why = native, f"{encoding.model}'s own input size"
    if size is not None and size != COMMAND_LINE["image_size"]:
        log.info(f"{command}: --image-size {size}, {why}", execution.quiet)
    return replace(decoding, image_size=size)
