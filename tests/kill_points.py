"""Kills at chosen points inside a process, for crash tests that must land mid-work: the
process installs one of these, then does its work, and kills itself (SIGKILL) there.

- `mid_write(part, nth, chunks=True)`: halfway through writing the bytes of the `nth` chunk
  file (a write opened by zarr's atomic writer) whose path contains `part`; with `chunks`
  False, of any file (a `zarr.json`: zarr writes it as `zarr.<uuid>.partial` first).
- `wait_before_write(part, nth, flag)`: before opening the `nth` such chunk file, wait
  until the file `flag` exists (the process holds whatever it holds meanwhile: a test
  acts then, at a known point of the work).
- `at_unlink(nth, under)`: at the `nth` file removal (of a path under the folder `under`,
  when given), and folders listed with their zarr.json first (as some file systems list
  them), so a removal interrupted there has removed a node's metadata before its chunks.
- `hold_at_next_record(part, claim, release)`: before this process records done a second
  chunk in a ledger `ledger/<part>...` (a stage, a pass's objects, `export_`), hold until the file `release` exists, if it
  is the first process to get there (it creates `claim`, holding its pid); the others go
  on. A kill of the claimant then lands mid-task, one chunk or more committed before it.

Used in a subprocess: `python -c "import kill_points; kill_points.mid_write(...); ..."`
with tests/ on sys.path (`cli(argv)` runs segpipe's command line after installing).
"""

import os
import pathlib
import signal
import sys


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _Half:
    """A file that writes half of what it is given, then kills the process."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(bytes(data)[: len(data) // 2])
        self.f.flush()
        _die()


def mid_write(part: str, nth: int = 1, chunks: bool = True) -> None:
    opened, seen = pathlib.Path.open, [0]

    def killing_open(self, mode="r", *args, **kwargs):
        f = opened(self, mode, *args, **kwargs)
        if "w" in mode and part in str(self) and ("/c/" in str(self) or not chunks):
            seen[0] += 1
            if seen[0] == nth:
                return _Half(f)
        return f

    pathlib.Path.open = killing_open


def wait_before_write(part: str, nth: int, flag: str) -> None:
    import time

    opened, seen = pathlib.Path.open, [0]

    def waiting_open(self, mode="r", *args, **kwargs):
        if "w" in mode and part in str(self) and "/c/" in str(self):
            seen[0] += 1
            if seen[0] == nth:
                while not os.path.exists(flag):
                    time.sleep(0.01)
        return opened(self, mode, *args, **kwargs)

    pathlib.Path.open = waiting_open


def hold_at_next_record(part: str, claim: str, release: str):
    """(Returns a function that takes the hold away again.)"""
    import time

    opened, first = pathlib.Path.open, []

    def holding_open(self, mode="r", *args, **kwargs):
        path = str(self)
        if "w" in mode and f"/ledger/{part}" in path and "/c/" in path:
            chunk = path.rsplit("/c/", 1)[1].split(".")[0]  # (zarr writes c/<k>.<id>.partial)
            first.append(chunk) if not first else None
            if chunk != first[0] and not os.path.exists(claim):
                try:
                    fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    fd = None
                if fd is not None:
                    os.write(fd, str(os.getpid()).encode())
                    os.close(fd)
                    while not os.path.exists(release):
                        time.sleep(0.01)
        return opened(self, mode, *args, **kwargs)

    pathlib.Path.open = holding_open

    def undo():
        pathlib.Path.open = opened

    return undo


class _ZarrJsonFirst:
    """`os.scandir` with a folder's zarr.json listed before the rest."""

    def __init__(self, *args, **kwargs):
        self.it = _scandir(*args, **kwargs)
        self.entries = iter(sorted(self.it, key=lambda e: e.name != "zarr.json"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.it.close()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.entries)

    def close(self):
        self.it.close()


_scandir = os.scandir


def at_unlink(nth: int, under: str | None = None) -> None:
    unlink, count = os.unlink, [0]

    def counting(path, *args, dir_fd=None, **kwargs):
        # (shutil.rmtree removes a folder's files by name, relative to its open folder)
        folder = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.getcwd()
        if under is None or os.path.join(folder, path).startswith(under):
            count[0] += 1
            if count[0] == nth:
                _die()
        return unlink(path, *args, dir_fd=dir_fd, **kwargs)

    os.unlink = counting
    os.scandir = _ZarrJsonFirst


def hold_redecoding(k: int, flag: str) -> None:
    """Decoding chunk `k` again (`Redecoder.frames`: what a `--keep masks` pass reads ahead
    while it tracks the chunk before) waits until the file `flag` exists; the name of the
    thread that decodes it is written to `flag`.thread first."""
    import time

    from segpipe.stages import decode

    frames = decode.Redecoder.frames

    def held(self, n, *args, **kwargs):
        if n == k:
            import threading

            with open(flag + ".thread", "w") as f:  # who decodes it: the read-ahead's thread
                f.write(threading.current_thread().name)
            while not os.path.exists(flag):
                time.sleep(0.01)
        return frames(self, n, *args, **kwargs)

    decode.Redecoder.frames = held


def slow_job_start(seconds: float) -> None:
    """A studio job's thread waits `seconds` before its work: the moment between a job's
    202 and its first step, made long enough for another request to land in it."""
    import time

    from segpipe.web import session

    run = session.Job._run

    def slow(self, *args):
        time.sleep(seconds)
        return run(self, *args)

    session.Job._run = slow


def cli(argv: list[str]) -> None:
    from segpipe.cli import main

    sys.argv = ["segpipe", *argv]
    main()
