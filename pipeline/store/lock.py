"""One writer per store: an advisory lock file beside the store, `.<store name>.lock`.

The lock is an open-file-description lock (`fcntl`'s `F_OFD_SETLK`, like `flock` tied to
the open file, not to the process) held while the work runs, so the kernel drops it when the
holder dies (kill -9, OOM, power loss): a lock file left behind is stale and is taken over.
Who holds it is asked with `F_OFD_GETLK`, which takes nothing, so asking never makes a writer
that tries at that moment fail. The file records who holds it (pid, host, start time) for the
refusal message, and is removed when the lock is released (unlinked while still locked; a
writer that locked a file since unlinked tries again on the new one). It lives beside the
store, not in it, so it can be taken before a new store is created. The path is resolved
first, so a symlink or a relative path to the store finds the same lock.

Every stage takes the lock itself (`holds_store_lock`), so work started from Python is
guarded like work started from the CLI. The lock is re-entrant for the thread that holds it
(`run` holds it across the stages it calls); another thread of the same process is refused
like another process.

Work dispatched to Dask workers (`segpipe.dask.client`) writes under the lock its client holds:
the lock file also records a random token, the task carries it, and the worker checks
(`check_lease`) that the lock is still held and still names that token when the task starts
and before every write to the store (`runstore.LeasedFiles`, inside zarr's store). A worker
that sees no such lock file does not share the client's file system; a task of a client
that has died or been replaced writes nothing more, beyond a write already under way when
the lock changed hands (a check and the write after it are not one step).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import inspect
import json
import os
import socket
import struct
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from segpipe.errors import StoreLocked
from segpipe.fsutil import resolved

_held: dict[Path, list] = {}  # lock path -> [fd, depth, owning thread, token], for this process
_guard = threading.Lock()


def lock_path(store: Path) -> Path:
    store = resolved(store)
    return store.with_name(f".{store.name}.lock")


@contextmanager
def store_lock(store: Path):
    path = lock_path(store)
    with _guard:
        if path in _held and _held[path][2] == threading.get_ident():
            _held[path][1] += 1
        else:
            _take(path, store, threading.get_ident())
    try:
        yield
    finally:
        with _guard:
            _held[path][1] -= 1
            if _held[path][1] == 0:
                _release(path, _held.pop(path)[0])


def _take(path: Path, store, owner) -> None:
    """Take the lock at `path` for the thread `owner` (None: a `Claim` not taken over yet),
    refused where another thread of this process holds it; under `_guard`."""
    if path in _held:
        raise StoreLocked(
            f"store {store} is in use by another thread of this process "
            f"(pid {os.getpid()}); one writer per store"
        )
    token = uuid.uuid4().hex
    _held[path] = [_acquire(path, store, token), 1, owner, token]


class Claim:
    """The store's lock taken now, in this thread, for work another thread will do: the
    studio takes it before it answers that a job started (so a second writer is refused
    then, not when the job gets to it), and the job's thread holds it (`held`) until the
    work ends; `release` gives back a claim no thread took over."""

    def __init__(self, store: Path):
        self.path = lock_path(store)
        with _guard:
            _take(self.path, store, None)

    @contextmanager
    def held(self):
        """This thread holds the claimed lock (re-entrantly, as `store_lock`) for the
        block, then releases it."""
        with _guard:
            _held[self.path][2] = threading.get_ident()
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        with _guard:
            entry = _held.pop(self.path, None)
        if entry is not None:
            _release(self.path, entry[0])


# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid, in native alignment
_FLOCK = "@hhqqi4x"


def _lock_request(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)


def _try_lock(fd: int) -> bool:
    """Take the whole file's write lock on `fd`'s open file description, if nobody holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock_request(fcntl.F_WRLCK))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _is_locked(fd: int) -> bool:
    """Whether another open file description holds a lock on the file (taking nothing)."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_request(fcntl.F_WRLCK))
    return struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK


def _release(path: Path, fd: int) -> None:
    """Remove the lock file, then release the lock (closing the file): a writer that locked
    the file in between finds it unlinked and tries again (`_acquire`)."""
    try:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def _acquire(path: Path, store: Path, token: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            holder = _holder(fd)
            os.close(fd)
            raise StoreLocked(
                f"store {store} is in use by {holder}; wait for it to finish (one writer per store)"
            )
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # the file at the path now: ours
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder removed it as we locked it: try the new one
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "token": token,
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except BaseException:  # a full disk, say: never keep a lock nobody will release
        _release(path, fd)
        raise
    return fd


def token(store: Path) -> str:
    """The token of the lock this process holds on `store` (see `check_lease`)."""
    with _guard:
        return _held[lock_path(store)][3]


def check_lease(store: Path, token: str) -> None:
    """Raise `StoreLocked` unless `store`'s lock is held (by another process: the client)
    and names `token`."""
    path = lock_path(store)
    if not path.exists() and not Path(store).exists():  # (the lock goes when its run ends)
        raise StoreLocked(
            f"store {store} is not visible here (no {path.name} beside it): Dask workers "
            f"need the client's file system, shared"
        )
    holder = _probe(path)
    if holder is None or holder.get("token") != token:
        raise StoreLocked(
            f"store {store} is no longer locked by the run that sent this work "
            f"(it stopped, or another run took over); this task writes nothing"
        )


def holder(store: Path) -> dict | None:
    """Who holds `store`'s lock now (pid, host, started), None when no live process does:
    the kernel drops a dead holder's lock, whatever its lock file says."""
    path = lock_path(store)
    return _probe(path) if path.exists() else None


def _probe(path: Path) -> dict | None:
    """The lock file's record while its lock is held, else None (asked, not taken)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _info(fd) if _is_locked(fd) else None
    finally:
        os.close(fd)


def holds_store_lock(fn):
    """Run a stage function under the lock of the store named by its `store_path` argument."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        store = signature.bind(*args, **kwargs).arguments["store_path"]
        with store_lock(store):
            return fn(*args, **kwargs)

    return locked


def _info(fd: int) -> dict:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _holder(fd: int) -> str:
    info = _info(fd)
    try:
        return f"pid {info['pid']} on {info['host']} (started {info['started']})"
    except KeyError:
        return "another segpipe process"
