"""Files made durable: fsync of files, trees and directory entries, the one atomic write (a
temp file beside the target, fsynced, renamed over it) and the one atomic removal (a tree
renamed into a trash folder, the rename made durable, then deleted there)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from contextlib import contextmanager
from pathlib import Path

from segpipe.errors import BadInput


def resolved(path) -> Path:
    """`path` made absolute with its links followed (`Path.resolve`), or a one-line
    `BadInput` where they loop (Path.resolve raises RuntimeError there)."""
    try:
        return Path(path).resolve()
    except RuntimeError:
        raise BadInput(f"{path} is a symbolic link loop: it leads nowhere") from None


def regular_file(path: Path, what: str, give: str, fail=None) -> os.stat_result:
    """`path`'s stat, where it is a regular file; else a one-line `BadInput` (by `fail`,
    where given) naming `what` it is instead: not there, a folder, or not a regular file (a
    FIFO or a device, which would be read for ever), or unreadable (a symbolic link loop).
    `give` says what to give instead ("a JSON file")."""

    def refuse(message):
        if fail is not None:
            fail(message)
        raise BadInput(message)

    try:
        st = os.stat(path)
    except FileNotFoundError:
        refuse(f"{what} not found: {path}")
    except OSError as e:
        refuse(f"{what} {path} cannot be read: {e.strerror}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        refuse(f"{what} {path} is {kind}: give {give}")
    return st


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
    body (or the fsync) raises, and the temp file goes: a full disk leaves no half file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{suffix}")
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:  # never made, or a folder (writers that fill one): left as it is
            pass
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file's bytes so that it exists complete or not at all."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def remove_tree(path: Path, trash: Path) -> None:
    """Remove the tree (or file) at `path` so that no reader ever sees it half removed: it
    is renamed into `trash` (a folder on the same file system, made if missing), the rename
    is made durable (its parent fsynced), then it is deleted there. A kill after the rename
    leaves only the trash, which `empty_trash` clears; before it, the tree is whole. Where
    `trash` is on another file system, the tree is deleted in place."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    trash = Path(trash)
    aside = trash / f"{path.name}.{uuid.uuid4().hex[:12]}"
    try:
        trash.mkdir(exist_ok=True)
        os.rename(path, aside)
    except FileNotFoundError:  # the trash emptied meanwhile (by another opening): again
        trash.mkdir(exist_ok=True)
        os.rename(path, aside)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.rmtree(path)  # another file system: no rename there
        fsync_path_dir(path.parent)
        return
    fsync_path_dir(path.parent)
    fsync_path_dir(trash)
    _delete(aside)


def empty_trash(trash: Path) -> None:
    """Delete what a removal killed after its rename left in `trash` (and the folder)."""
    trash = Path(trash)
    if trash.is_dir():
        for entry in list(trash.iterdir()):
            _delete(entry)
        try:
            trash.rmdir()
        except OSError:
            pass


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


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
