"""One writer per store: an advisory lock file beside the store, `.<store name>.lock`.

The lock is an `flock` held for the life of the process, so the kernel drops it when the
holder dies (kill -9, OOM, power loss): a lock file left behind is stale and is taken over.
The file records who holds it (pid, host, start time) for the refusal message. It lives
beside the store, not in it, so it can be taken before a new store is created. The path is
resolved first, so a symlink or a relative path to the store finds the same lock.

Every stage takes the lock itself (`holds_store_lock`), so work started from Python is
guarded like work started from the CLI. The lock is re-entrant for the thread that holds it
(`run` holds it across the stages it calls); another thread of the same process is refused
like another process.
"""
from __future__ import annotations

import fcntl
import functools
import inspect
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import StoreLocked

_held: dict[Path, list] = {}  # lock path -> [fd, depth, owning thread], for this process
_guard = threading.Lock()


def lock_path(store: Path) -> Path:
    store = Path(store).resolve()
    return store.with_name(f".{store.name}.lock")


@contextmanager
def store_lock(store: Path):
    path = lock_path(store)
    with _guard:
        if path in _held:
            if _held[path][2] != threading.get_ident():
                raise StoreLocked(f"store {store} is in use by another thread of this process "
                                  f"(pid {os.getpid()}); one writer per store")
            _held[path][1] += 1
        else:
            _held[path] = [_acquire(path, store), 1, threading.get_ident()]
    try:
        yield
    finally:
        with _guard:
            _held[path][1] -= 1
            if _held[path][1] == 0:
                os.close(_held.pop(path)[0])  # releases the flock


def _acquire(path: Path, store: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StoreLocked(f"store {store} is in use by {holder}; "
                        f"wait for it to finish (one writer per store)") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except BaseException:  # a full disk, say: never keep a lock nobody will release
        os.close(fd)
        raise
    return fd


def holds_store_lock(fn):
    """Run a stage function under the lock of the store named by its `store_path` argument."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        store = signature.bind(*args, **kwargs).arguments["store_path"]
        with store_lock(store):
            return fn(*args, **kwargs)
    return locked


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']} (started {info['started']})"
    except (ValueError, KeyError):
        return "another segpipe process"
