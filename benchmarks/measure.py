"""Run a command in a fresh process and report its wall time and peak RSS (from wait4)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(argv: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB, stdout) of one process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # no pipe to fill
        start = time.perf_counter()
        proc = subprocess.Popen([str(a) for a in argv], cwd=ROOT,
                                env={**os.environ, **(env or {})}, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{err.read().decode()[-3000:]}")
        return seconds, usage.ru_maxrss / 1024, out.read().decode()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def segpipe(*args) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *map(str, args), "--quiet"]


def table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
