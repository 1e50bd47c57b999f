"""One writer per store: an advisory lock file beside the store, `.<store name>.lock`.

The lock is an `flock` held for the life of the process, so the kernel drops it when the
holder dies (kill -9, OOM, power loss): a lock file left behind is stale and is taken over.
The file records who holds it (pid, host, start time) for the refusal message. It lives
beside the store, not in it, so it can be taken before a new store is created.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


def lock_path(store: Path) -> Path:
    store = Path(store).absolute()
    return store.with_name(f".{store.name}.lock")


@contextmanager
def store_lock(store: Path):
    path = lock_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"store {store} is in use by {_holder(fd)}; "
                            f"wait for it to finish (one writer per store)") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']} (started {info['started']})"
    except (ValueError, KeyError):
        return "another segpipe process"
