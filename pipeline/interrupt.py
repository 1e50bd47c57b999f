"""Ctrl-C and SIGTERM: the first finishes the chunk in flight, the second abandons it.

Either way the store stays consistent (a chunk is done only once its ledger entry is
written), and the command exits 130 (SIGINT) or 143 (SIGTERM) saying how to resume.

The second signal (and any signal outside a writing command) ends the process at once with
`os._exit`, exactly as a kill would, which the stores survive by design: raising an
exception from wherever the signal lands (a thread pool's shutdown, a `finally`, the
interpreter's exit) could end in a traceback or in Python's own SIGINT exit instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

HINT = "interrupted: every finished chunk is kept; run the same command again to continue"

_requested: int | None = None
_graceful = 0  # how many writing sections are open: there the first signal is deferred


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)


@contextmanager
def finishing_chunks():
    """Inside this, a first signal lets the chunk in flight finish (see `check`)."""
    global _graceful
    _graceful += 1
    try:
        yield
    finally:
        _graceful -= 1


def _handler(signum, _frame):
    global _requested
    if _requested is not None or not _graceful:
        stop_now(signum)
    _requested = signum
    _say(
        f"\nwarning: {signal.Signals(signum).name}: finishing the chunk in flight "
        f"(send it again to stop at once)\n"
    )


def stop_now(signum: int) -> None:
    """Say how to resume and exit 128 + signum at once. Not through `sys.exit`: during the
    interpreter's shutdown Python restores the default handlers, and a second signal landing
    there would kill the process with the signal (exit -2) instead."""
    try:
        sys.stdout.flush()
        _say(f"\n{HINT}\n" if _graceful or _requested is not None else "\ninterrupted\n")
    except BaseException:  # noqa: BLE001 - a closed pipe, a re-entrant write: exit regardless
        pass
    os._exit(128 + signum)


def _say(text: str) -> None:
    # os.write, not print: the signal may land inside a write to the same buffered stream
    os.write(2, text.encode())


def check() -> None:
    """Called after each committed chunk (and before `run` encodes a chunk while the one
    before is written behind): stop here if a signal came."""
    if _requested is not None:
        raise Interrupted(_requested)


def request(signum: int = signal.SIGINT) -> None:
    """Ask the writing work of this process to stop after the chunk in flight, as a first
    Ctrl-C does (the studio's Cancel)."""
    global _requested
    _requested = signum


def clear() -> None:
    """Forget a stop asked for (the studio's next Track runs on)."""
    global _requested
    _requested = None
