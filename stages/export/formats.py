"""The export formats: one registry, from which the CLI's choices, the API's checks, `run`'s
default exports, the output names and the studio's export menu all come. A new format is a
writer (`start`, `chunk`, `finish`: see `writers.py`) and one `register(ExportFormat(...))`
(the built-in ones register at the end of `writers.py`); its ledger (`export_<name>`) and
its record in the store come with it. A format is registered in the process that imports
its module: the command line and Dask workers offer those segpipe's own modules register
(no plugin discovery yet)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportFormat:
    """One export format and what it can do (its capabilities as flags)."""

    name: str  # as `--format` takes it ("davis")
    writer: type  # made from a `writers.Job`: start(), chunk(k, lo, hi, batches), finish(chunks)
    output: str  # its file or folder name in `<store name>.export/` ("masks.json")
    single_file: bool = False  # one file (given a folder, `output` is written into it)
    needs_source: bool = False  # reads the source video again (an overlay)
    label: str | None = None  # the studio's menu entry (None: not offered there)
    in_run: bool = False  # exported by `run` unless told otherwise
    named: bool = False  # shows the objects' names and classes (`segpipe.labels`)


FORMATS: dict[str, ExportFormat] = {}


def register(fmt: ExportFormat) -> ExportFormat:
    """Add `fmt` to the formats every command, the API and the studio offer (a name taken
    is refused: a format never silently replaces another)."""
    if fmt.name in FORMATS:
        raise ValueError(f"export format {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    return fmt


def run_formats() -> list[str]:
    """What `run` exports unless told."""
    return [name for name, fmt in FORMATS.items() if fmt.in_run]
