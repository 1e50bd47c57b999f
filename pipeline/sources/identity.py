"""How a store recognises a source file (or a weights file): its size, modification time
and sha256, checked cheaply on every run. A folder's identity is its listing
(`folder.identity`); `registry.identity` picks the one for a source."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_identity(path: Path) -> dict:
    """Size, modification time and sha256 of a file."""
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
    stat = Path(path).stat()
    size, mtime = stat.st_size, stat.st_mtime_ns
    if size != recorded["size"]:
        return False
    if mtime == recorded.get("mtime_ns"):
        return True
    return file_identity(path)["sha256"] == recorded["sha256"]
