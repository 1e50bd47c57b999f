"""segpipe's exceptions. Each carries one line that names the problem; the CLI prints it as
`Error: <message>` and exits 1, and Python callers can catch the class they care about."""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` with every character that would break or hide a line (a newline in a file's
    name, say) written as its escape, so that a message quoting it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SegpipeError(Exception):
    """Every error segpipe raises on purpose: its `message` is one line (`one_line`)."""

    def __init__(self, message: str):
        message = one_line(message)
        super().__init__(message)
        self.message = message


class BadInput(SegpipeError):
    """What was given is wrong: a missing or unreadable video, a bad prompt, a bad option."""


class StoreNotReady(SegpipeError):
    """The store lacks what this step reads: an earlier stage has not finished."""


class StoreMismatch(SegpipeError):
    """The store was made from another video or with other settings."""


class DamagedStore(SegpipeError):
    """A chunk that the ledger says is done cannot be read back intact."""

    def __init__(self, store, name: str, chunk: int, reason: str):
        super().__init__(
            f"store {store} is damaged: array {name!r} chunk {chunk} {reason}; "
            f"run `segpipe repair --store {store}`"
        )
        self.store, self.name, self.chunk, self.reason = store, name, chunk, reason

    def __reduce__(self):  # raised on a Dask worker, it travels to the client pickled
        return type(self), (self.store, self.name, self.chunk, self.reason)


class StoreLocked(SegpipeError):
    """Another process is writing to the store (one writer per store)."""


class NotEnoughSpace(SegpipeError):
    """The store's file system has less free space than the command is estimated to need
    (`--no-space-check`, or `space_check=False`, starts it anyway)."""


class EnvironmentChanged(StoreMismatch):
    """The store was computed in another compute environment (device, library versions, CPU
    thread count or ISA level): its chunks would mix bits from two environments
    (`--allow-env-change`, or `allow_env_change=True`, continues anyway)."""


def os_error_line(e: OSError) -> str:
    """An OSError as the one line the CLI and the studio say: a full disk and a file system
    segpipe may not write are said as such (running again would fail again); any other
    error of the system keeps what is done, and running again continues."""
    import errno

    where = one_line(str(e.filename)) if e.filename else "while reading or writing"
    if e.errno == errno.ENOSPC:
        return (
            f"disk full ({where}): free some space and run the same command again; "
            f"finished chunks are kept"
        )
    if e.errno == errno.EROFS:
        return (
            f"{e.strerror} ({where}): segpipe cannot write there; give a store on a file "
            f"system it may write to"
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{e.strerror} ({where}): this user may not use that path"
    return one_line(
        f"{e.strerror or e} ({e.filename or 'while reading or writing'}); finished chunks "
        f"are kept: run the same command again"
    )
