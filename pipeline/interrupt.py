"""Ctrl-C and SIGTERM: the first finishes the chunk in flight, the second abandons it.

Either way the store stays consistent (a chunk is done only once its ledger entry is
written), and the command exits 130 (SIGINT) or 143 (SIGTERM) saying how to resume.
"""
from __future__ import annotations

import signal
import threading

from . import log

_requested: int | None = None


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)


def _handler(signum, _frame):
    global _requested
    if _requested is not None:  # the second signal: abandon the chunk in flight now
        raise Interrupted(signum)
    _requested = signum
    log.warn(f"{signal.Signals(signum).name}: finishing the chunk in flight "
             f"(send it again to stop at once)")


def check() -> None:
    """Called after each committed chunk: stop here if a signal came."""
    if _requested is not None:
        raise Interrupted(_requested)
