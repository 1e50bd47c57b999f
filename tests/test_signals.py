"""A second Ctrl-C (or SIGTERM) always ends the command at once with 130 (143) and the
one-line resume hint, wherever it lands; the store then resumes to the same result."""

import random
import signal
import subprocess
import sys
import time

from conftest import (
    ROOT,
    assert_same_store,
    ledger_count,
    run_args,
    run_in_process,
    spawn,
    wait_for,
)

STAGES = ("decode", "encode", "track_forward", "track_reverse")


def args(small, store):
    return run_args(small, store) + ("--export", "none")


def progress(store):
    return sum(ledger_count(store, s) for s in STAGES)


def test_second_signal_always_exits_with_the_hint(small, tmp_path):
    reference = tmp_path / "ref.zarr"
    run_in_process(small, reference, exports=[])  # uninterrupted, in this process
    total = progress(reference)
    store = tmp_path / "s.zarr"
    rng = random.Random(3)
    outcomes = []
    for trial in range(4):
        signum = signal.SIGTERM if trial % 3 == 2 else signal.SIGINT
        proc = spawn(args(small, store), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        floor = progress(store) + 1
        if not wait_for(lambda: progress(store) >= floor, proc, timeout=300):
            proc.communicate()
            break  # finished
        proc.send_signal(signum)
        time.sleep(rng.choice([0, 0.001, 0.01, 0.05, 0.2]))
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        outcomes.append((proc.returncode, err))
        assert proc.returncode == 128 + signum, (trial, proc.returncode, err)
        assert "run the same command again to continue" in err, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(outcomes) >= 3 and progress(store) < total or len(outcomes) == 4
    run_in_process(small, store, exports=[])  # the same run again, to the end (in this process)
    assert_same_store(reference, store)


def test_a_signal_outside_writing_ends_quietly(small, tmp_path):
    """`status` has no chunk to finish: one signal ends it, no traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; sys.path.insert(0, '.'); sys.argv = ['segpipe', 'status', '--store', 'x'];"
                "from segpipe import cli, interrupt; interrupt.install(); print('ready', flush=True); "
                "time.sleep(30)"
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
