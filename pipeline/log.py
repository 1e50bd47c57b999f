"""What a command says. Results (what was written where) go to stdout, even under `--quiet`;
notes, warnings and progress go to stderr, so a script can read the results and a log file
stays readable. Progress bars are drawn on a terminal (and as widgets in Jupyter); elsewhere
each stage says one plain line when it ends."""

import sys
import threading
import time
from contextlib import contextmanager

import click

RESULTS_ALWAYS = False  # the command line's: `--quiet` hides notes and bars, not results


_hidden = 0  # inside `results_hidden`: a command that reports its results itself


def result(message: str, quiet: bool = False) -> None:
    """What a command made, and where: on stdout (from Python, not with `progress=False`)."""
    if not _hidden and (RESULTS_ALWAYS or not quiet):
        click.echo(message)


@contextmanager
def results_hidden():
    """The stages' result lines hidden: the dataset command's table is its result."""
    global _hidden
    _hidden += 1
    try:
        yield
    finally:
        _hidden -= 1


def count(n: int, thing: str, verb: str = "") -> str:
    """`1 chunk has`, `2 chunks have`: `n` things, and `verb` ("has" or "is") to agree."""
    plural = n != 1
    said = f"{n} {thing}{'s' if plural else ''}"
    if verb:
        said += " " + {"has": "have", "is": "are"}[verb] if plural else " " + verb
    return said


def info(message: str, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


_watch = threading.local()  # this thread's `watching` callback


@contextmanager
def watching(callback):
    """Every progress bar made in this thread meanwhile (drawn or not) also reports to
    `callback(desc, n, total, initial)` as it moves: how segpipe studio shows a stage's
    progress in the page."""
    before = getattr(_watch, "callback", None)
    _watch.callback = callback
    try:
        yield
    finally:
        _watch.callback = before


def progress(desc: str, total: int | None, quiet: bool, initial: int = 0):
    """A progress bar of frames for a stage, used as a context manager (closed, ending its
    line, also when the stage stops with an error): tqdm's on a terminal or in Jupyter,
    else a plain line at the end (reporting to a `watching` callback too)."""
    bar = _bar(desc, total, quiet, initial)
    callback = getattr(_watch, "callback", None)
    return bar if callback is None else _Watched(bar, callback, initial)


def _bar(desc: str, total: int | None, quiet: bool, initial: int):
    if quiet:
        return _Plain(desc, total, initial, say=False)
    if not _drawn():
        return _Plain(desc, total, initial, say=True)
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="frame",
        desc=desc,
        dynamic_ncols=True,
        mininterval=0.5,
    )


def _drawn() -> bool:
    """Whether a bar can be drawn: stderr is a terminal, or this is a Jupyter kernel."""
    if sys.stderr.isatty():
        return True
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and shell.get_ipython().__class__.__name__ == "ZMQInteractiveShell"
    except AttributeError:
        return False


class _Watched:
    """A bar that also reports its count to a `watching` callback (from whichever thread
    moves it)."""

    def __init__(self, bar, callback, initial: int):
        self.bar, self.callback, self.initial = bar, callback, initial

    def _say(self) -> None:
        self.callback(self.bar.desc, self.bar.n, self.bar.total, self.initial)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        self._say()

    def set_description(self, desc: str) -> None:
        self.bar.set_description(desc)
        self._say()

    def __enter__(self):
        self.bar.__enter__()
        self._say()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __getattr__(self, name):  # the rest of the bar's interface, as it is
        return getattr(self.bar, name)


class _Plain:
    """A progress bar's interface that draws nothing: `say` prints one line at the end (the
    frames done, of how many, in how long)."""

    def __init__(self, desc: str, total: int | None, initial: int, say: bool):
        self.desc, self.total, self.n, self.say = desc, total, initial, say
        self.began = time.monotonic()
        self.start = initial

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.say and self.n > self.start:
            of = f"/{self.total}" if self.total is not None else ""
            click.echo(
                f"{self.desc}: {self.n}{of} frames ({time.monotonic() - self.began:.1f} s)",
                err=True,
            )
