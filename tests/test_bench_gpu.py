"""The GPU benchmark script runs unchanged on the CPU, small: a smoke test of its code path
(the table it prints on a GPU machine is the real measurement)."""

import json
import subprocess
import sys

from conftest import ROOT


def test_gpu_benchmark_runs_on_cpu_and_finds_parity(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_gpu.py"),
            "--device",
            "cpu",
            "--size",
            "128",
            "--frames",
            "6",
            "--chunk-size",
            "4",
            "--models",
            "sam2.1_hiera_t",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["device"] == "cpu" and row["precision"] == "float32"
    for key in (
        "segpipe encode fps",
        "segpipe track fps",
        "segpipe end-to-end fps",
        "official fps",
    ):
        assert row[key] > 0, key
    assert row["official mask pixels differing"] == 0 and row["official scores differing"] == 0
    assert "official fps" in proc.stdout and "segpipe track fps" in proc.stdout
