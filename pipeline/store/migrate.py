"""`segpipe migrate`: convert a store of an earlier schema to this segpipe's, in place, keeping
its frames, features, memory and masks (hours of encoding are too costly to throw away).

Each step rewrites the group's attributes (`zarr.json`) in one atomic write (`fsutil`'s:
the new file fsynced before it replaces the old, then its folder), so a kill or a power loss
at any moment leaves the store at the schema before the step or after it, never between; a
temp file a kill left is removed by the next `migrate`. Arrays are not touched. A store at
this segpipe's schema is left as it is.

- 4 -> 5: the decoding settings recorded as one `decoding` record (`chunk_size`,
  `image_size`, until 4 attributes of their own), the keep setting as an `output` record
  (`keep`; absent: "all").
"""

from __future__ import annotations

import json
from pathlib import Path

from segpipe import log
from segpipe.errors import BadInput
from segpipe.fsutil import atomic_write, fsync_path_dir
from segpipe.store.lock import store_lock

FORMAT_NAME = "segpipe"
SCHEMA_VERSION = 5  # what this segpipe reads and writes (`docs/store.md`)


def _four_to_five(attrs: dict) -> dict:
    attrs = dict(attrs)
    decoding = {"chunk_size": attrs.pop("chunk_size"), "image_size": attrs.pop("image_size")}
    keep = attrs.pop("keep", None)
    return {
        **attrs,
        "schema_version": 5,
        "decoding": decoding,
        **({"output": {"keep": keep}} if keep is not None else {}),
    }


STEPS = {4: _four_to_five}  # from schema N to N + 1, up to `SCHEMA_VERSION`


def migrate(store_path, quiet: bool = False) -> list[int]:
    """Convert the store at `store_path` to `SCHEMA_VERSION`, one step at a time, under the
    store's lock; the schema versions it went through (empty: it was current)."""
    path = Path(store_path)
    if not (path / "zarr.json").is_file():
        raise BadInput(f"no segpipe store at {path}")
    with store_lock(path):
        (path / ".zarr.json.tmp").unlink(missing_ok=True)  # what a killed write left
        meta = _metadata(path)
        version = meta["attributes"].get("schema_version")
        if version == SCHEMA_VERSION:
            log.info(f"migrate: {path} is at schema version {SCHEMA_VERSION} already", quiet)
            return []
        if version not in STEPS:
            raise BadInput(
                f"store {path} has schema version {version}, which segpipe cannot convert "
                f"(it converts {', '.join(map(str, STEPS))}): make a new store"
            )
        went = []
        while version != SCHEMA_VERSION:
            meta["attributes"] = STEPS[version](meta["attributes"])
            atomic_write(path / "zarr.json", json.dumps(meta, indent=2).encode())
            fsync_path_dir(path)
            went.append(version)
            version += 1
    log.result(
        f"migrate: {path} converted from schema version {went[0]} to {SCHEMA_VERSION}", quiet
    )
    return went


def _metadata(path: Path) -> dict:
    """The group's zarr.json, checked to be a segpipe store's (else one line)."""
    try:
        meta = json.loads((path / "zarr.json").read_text())
        attrs = meta.get("attributes") if meta.get("node_type") == "group" else None
    except (OSError, ValueError, AttributeError) as e:
        raise BadInput(f"store {path} cannot be read: {type(e).__name__}") from None
    if not isinstance(attrs, dict) or attrs.get("format") != FORMAT_NAME:
        raise BadInput(f"{path} is not a segpipe store (its zarr.json is not one's)")
    return meta
