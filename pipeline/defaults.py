"""The settings a store holds are the defaults of every later command on it: chunk and image
size, the model and its weights (a random seed), the embedding dtype and what is kept (the
precision: encode and track take the store's themselves). A command says once which of them it took from the store, where they are not
the command line's own defaults."""

from __future__ import annotations

from segpipe import log
from segpipe.model import trained_size
from segpipe.settings import DEFAULTS
from segpipe.store.runstore import RunStore

COMMAND_LINE = DEFAULTS  # the command line's defaults, where a store may hold another value
OPTION = {"random_weights": "--random-weights"}  # the rest: --name-with-dashes


def stored(store) -> dict:
    """The settings `store` records (empty: no store yet)."""
    if not RunStore.exists(store):
        return {}
    attrs = RunStore.open(store, read_only=True).attrs
    spec = attrs.get("model") or {}
    found = {
        "chunk_size": attrs.get("chunk_size"),
        "image_size": attrs.get("image_size"),
        "model": spec.get("name"),
        "random_weights": (spec.get("weights") or {}).get("random_seed"),
        "embedding_dtype": spec.get("embedding_dtype"),
        "keep": attrs.get("keep"),
    }
    return {k: v for k, v in found.items() if v is not None}


def fill(store, command: str, quiet: bool, checkpoint=None, **given) -> dict:
    """`given` (None: not given) with the store's settings in place of the missing ones; a
    store's random seed only where no `checkpoint` is given. Says in one line which it took
    that differ from the command line's defaults."""
    recorded = stored(store)
    if checkpoint is not None or given.get("model") not in (None, recorded.get("model")):
        recorded.pop("random_weights", None)  # the store's seed is for the store's model
    filled, taken = dict(given), []
    for name, value in given.items():
        if value is None and name in recorded:
            filled[name] = recorded[name]
            if recorded[name] != COMMAND_LINE.get(name):
                taken.append(f"{OPTION.get(name, '--' + name.replace('_', '-'))} {recorded[name]}")
    if taken:
        log.info(f"{command}: the store's settings: {' '.join(taken)}", quiet)
    return filled


def trained_image_size(weights, quiet: bool, command: str = "run") -> int | None:
    """The image size `weights` say they were trained at (segpipe_tiny's do; official
    checkpoints do not: None, the command line's 1024), said where it is not 1024."""
    size = trained_size(weights)
    if size is not None and size != COMMAND_LINE["image_size"]:
        log.info(f"{command}: --image-size {size}, the size these weights were trained at", quiet)
    return size
