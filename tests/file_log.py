"""Which files a process opens, for tests that must see what a run reads and writes:
`record(part, log)`, installed in a subprocess before its work (as `kill_points` is),
appends a line "<mode> <path>" to the file `log` for each file the process opens (zarr's
local store opens every chunk file through `pathlib.Path.open`) whose path holds `part`.

Used as `python -c "import file_log, kill_points; file_log.record(...); kill_points.cli(...)"`
with tests/ on sys.path.
"""

import pathlib


def record(part: str, log: str) -> None:
    opened = pathlib.Path.open

    def recording_open(self, mode="r", *args, **kwargs):
        if part in str(self):
            with open(log, "a") as f:
                f.write(f"{mode} {self}\n")
        return opened(self, mode, *args, **kwargs)

    pathlib.Path.open = recording_open


def chunks_opened(log: pathlib.Path, mode: str) -> set[int]:
    """The chunks (the first index of a chunk file's key, `.../c/<k>/...`) of the files the
    log shows opened in a mode that starts with `mode` ("r" or "w")."""
    found = set()
    for line in pathlib.Path(log).read_text().splitlines():
        how, path = line.split(" ", 1)
        parts = pathlib.Path(path).parts
        if how.startswith(mode) and "c" in parts:
            found.add(int(parts[parts.index("c") + 1].split(".")[0]))
    return found
