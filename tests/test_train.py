"""data/train_tiny.py resumes: a run killed -9 between saves and run again ends with the same
weights, bit for bit, as a run never stopped (the training's data, dropout and schedule all
continue from the saved state), with the image-level prompt task on (`--prompt-frames`)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

TRAIN = Path(__file__).resolve().parents[1] / "data" / "train_tiny.py"


def _command(out: Path, state: Path) -> list[str]:
    return [sys.executable, str(TRAIN), "--out", str(out), "--state", str(state), "--steps", "6",
            "--frames", "2", "--size", "64", "--log-every", "2", "--prompt-frames", "1"]  # fmt: skip


def test_a_killed_training_continues_to_the_same_weights(tmp_path):
    straight = tmp_path / "straight.pt"
    subprocess.run(_command(straight, tmp_path / "s.state.pt"), check=True, capture_output=True)
    out, state = tmp_path / "resumed.pt", tmp_path / "r.state.pt"
    proc = subprocess.Popen(_command(out, state), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not state.exists():  # the first save (step 2 of 6) has landed
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = torch.load(state, weights_only=False)["step"]
    assert saved < 6 and not out.exists(), "the kill did not land mid-run"
    again = subprocess.run(_command(out, state), check=True, capture_output=True, text=True)
    assert f"resuming at step {saved}" in again.stdout
    assert not state.exists()
    a, b = torch.load(straight, weights_only=True), torch.load(out, weights_only=True)
    assert a["steps"] == b["steps"] == 6
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
