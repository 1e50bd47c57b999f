"""How a store recognises its source: size, modification time and sha256 of a file (or a
frame folder's listing), checked cheaply on every run."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_identity(path: Path) -> dict:
    """Size, modification time and sha256 of a file (or a frame folder): how a store
    recognises its source."""
    if Path(path).is_dir():
        from segpipe.sources.folder import identity

        return identity(Path(path))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def same_file(recorded: dict, path: Path) -> bool:
    """Whether `path` is still the file `recorded` describes. Hashing hours of video on every
    run costs seconds to minutes, so an unchanged size and modification time are trusted;
    anything else is decided by the sha256."""
    if Path(path).is_dir():
        from segpipe.sources.folder import identity, listing

        if listing(Path(path)) == recorded.get("listing"):
            return True
        return identity(Path(path))["sha256"] == recorded["sha256"]
    stat = Path(path).stat()
    size, mtime = stat.st_size, stat.st_mtime_ns
    if size != recorded["size"]:
        return False
    if mtime == recorded.get("mtime_ns"):
        return True
    return file_identity(path)["sha256"] == recorded["sha256"]
