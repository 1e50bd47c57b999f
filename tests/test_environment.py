"""The compute environment a store's bits come from (`segpipe.environment`): recorded in the
model record when the store is first computed, shown by `status`, and any other one refused
on a resume (another thread count, a `--workers 2` resume of a single-process store) in one
line naming the difference, before anything is written; `--allow-env-change` goes on and
says the results are no longer bit-identical to an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import (
    ROOT,
    assert_user_error,
    ledger_count,
    run_args,
    segpipe,
    tree_digest,
    wait_for,
)


def threads_env(n: int) -> dict:
    """A shell's environment with torch at `n` threads (OMP_NUM_THREADS and its kin)."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    return {**os.environ, **{k: str(n) for k in names}, "OMP_WAIT_POLICY": "PASSIVE"}


def test_a_resume_at_another_thread_count_is_refused_then_allowed(small, tmp_path):
    """`segpipe run` at 2 torch threads, killed -9 while tracking; resumed at 1 thread it is
    refused (the store unchanged), and so is a `--workers 2` resume (each worker at 1
    thread); with --allow-env-change it finishes, says so, and `status` shows both."""
    store = tmp_path / "run.zarr"
    argv = [sys.executable, "-m", "segpipe.cli", *map(str, run_args(small, store))]
    proc = subprocess.Popen(
        [*argv, "--export", "none"],
        cwd=ROOT,
        env=threads_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: ledger_count(store, "track_forward") >= 1, proc, timeout=300)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    model = json.loads((store / "zarr.json").read_text())["attributes"]["model"]
    assert model["environment"]["threads"] == 2, model
    forward = ledger_count(store, "track_forward")
    assert 1 <= forward < 5, forward  # the kill landed mid-tracking (5 forward chunks)

    before = tree_digest(store)
    proc = segpipe(*run_args(small, store), "--export", "none", env=threads_env(1))
    assert_user_error(proc, "another environment", "torch threads 2 in the store, 1 here")
    assert "--allow-env-change" in proc.stderr
    assert tree_digest(store) == before
    proc = segpipe(*run_args(small, store), "--export", "none", "--workers", 2, env=threads_env(2))
    assert_user_error(proc, "torch threads 2 in the store, 1 on the Dask workers")
    assert tree_digest(store) == before

    proc = segpipe(
        *run_args(small, store), "--export", "none", "--allow-env-change", env=threads_env(1)
    )
    assert proc.returncode == 0, proc.stderr
    assert "no longer bit-identical to an uninterrupted run" in proc.stderr
    assert ledger_count(store, "track_forward") == 5
    status = segpipe("status", "--store", store, env=threads_env(1))
    assert status.returncode == 0, status.stderr
    assert "2 torch threads" in status.stdout and "then (--allow-env-change)" in status.stdout
    assert "not bit-identical to an uninterrupted run" in status.stdout + status.stderr
    report = json.loads(segpipe("status", "--store", store, "--json").stdout)
    assert [e["threads"] for e in report["model"]["environment_changes"]] == [1]


def test_the_environment_check_on_a_real_store(small, tmp_path):
    """`environment.check` against a store's record: the first computation records it, the
    same one passes, another (a GPU's name, a CUDA version) is refused naming each
    difference, and allowed it is recorded once among the changes, then accepted."""
    import segpipe as api
    from segpipe import environment
    from segpipe.errors import EnvironmentChanged, StoreMismatch
    from segpipe.store.runstore import RunStore

    store = tmp_path / "s.zarr"
    api.decode(small / "clip.mp4", store, chunk_size=4, image_size=64, progress=False)
    api.encode(store, random_weights=0, progress=False)
    here = environment.current("cpu")
    opened = RunStore.open(store)
    assert opened.attrs["model"]["environment"] == here
    environment.check(opened, here)  # the same: nothing said, nothing written

    gpu = {"device": "cuda", "torch": here["torch"], "name": "NVIDIA H200", "cuda": "13.0"}
    gpu["cudnn"] = 91000
    with pytest.raises(EnvironmentChanged) as refused:
        environment.check(opened, gpu)
    assert isinstance(refused.value, StoreMismatch)  # the CLI's one line, the studio's 409
    for said in ("device cpu in the store, cuda here", "device name", "CUDA none in the store"):
        assert said in refused.value.message, refused.value.message
    assert "environment_changes" not in RunStore.open(store).attrs["model"]
    environment.check(opened, gpu, allow=True)
    environment.check(RunStore.open(store), gpu)  # computed there already: mixes nothing new
    model = RunStore.open(store).attrs["model"]
    assert model["environment_changes"] == [gpu] and environment.mixed(model)
    assert environment.said(gpu) == "cuda (NVIDIA H200), torch " + here["torch"] + (
        ", CUDA 13.0, cuDNN 91000"
    )
