"""Run a command in a fresh process and report its wall time and peak RSS (from wait4)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# A child's ru_maxrss counts the pages it shared with its parent before exec, so a big
# benchmark process would inflate every figure: a small launcher process starts the command.
LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:], stdout=sys.stdout, stderr=sys.stderr)
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"seconds": time.perf_counter() - start, "maxrss_kib": usage.ru_maxrss,
               "code": os.waitstatus_to_exitcode(status)}, f)
"""


def measure(argv: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB, stdout) of one process."""
    import json

    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile(suffix=".json") as report,
    ):
        subprocess.run(
            [sys.executable, "-c", LAUNCHER, report.name, *map(str, argv)],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=err,
        )
        result = json.loads(Path(report.name).read_text())
        out.seek(0)
        err.seek(0)
        if result["code"] != 0:
            raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{err.read().decode()[-3000:]}")
        return result["seconds"], result["maxrss_kib"] / 1024, out.read().decode()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def segpipe(*args) -> list[str]:
    return [sys.executable, "-m", "segpipe.cli", *map(str, args), "--quiet"]


def table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def looped_clip(path: Path, base, frames: int) -> Path:
    """A clip of `frames` frames cycling through `base` (generating thousands of distinct
    synthetic frames is slow and changes nothing that is measured)."""
    sys.path.insert(0, str(ROOT / "data"))
    import make_sample

    make_sample.write_video(path, base[[i % len(base) for i in range(frames)]])
    return path
