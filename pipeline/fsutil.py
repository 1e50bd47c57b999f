"""Files made durable: fsync of files, trees and directory entries, and the one atomic
write (a temp file beside the target, fsynced, renamed over it)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory tree (files first, then each directory)."""
    if path.is_dir():
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                _fsync_one(Path(root) / name, os.O_RDONLY)
            _fsync_one(Path(root), os.O_RDONLY)
    elif path.exists():
        _fsync_one(path, os.O_RDONLY)


def fsync_path_dir(path: Path) -> None:
    """fsync one directory entry list (after a rename into it), not its contents."""
    _fsync_one(Path(path), os.O_RDONLY)


def fsync_entry(path: Path, root: Path) -> None:
    """Make `path` (a file or a tree) durable together with its directory entries: the
    path itself, then every directory from its parent up to `root`. A new file (zarr writes
    a temp file and renames it) survives a power loss only once the directory holding its
    name is fsynced too."""
    fsync_path(path)
    fsync_parents(path, root)


def fsync_parents(path: Path, root: Path) -> None:
    """fsync every directory from `path`'s parent up to `root` (their entry lists only)."""
    path, root = Path(path), Path(root)
    for folder in path.parents:
        fsync_path_dir(folder)
        if folder == root:
            break


@contextmanager
def replacing(path: Path, suffix: str = ""):
    """Write `path` so that it exists complete or not at all: the body writes the temp file
    this yields (`.<name>.tmp<suffix>` beside it, `suffix` for writers that go by the
    extension), which is then fsynced and renamed over `path`. Nothing is renamed if the
    body raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{suffix}")
    yield tmp
    fsync_path(tmp)
    os.replace(tmp, path)


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file's bytes so that it exists complete or not at all."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def tree_bytes(folder) -> int:
    """Total size of the files under `folder`."""
    total, stack = 0, [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file():
                    total += entry.stat().st_size
    return total


def _fsync_one(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
