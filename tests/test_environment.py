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
    difference, and allowed it is recorded once among the changes, then accepted; a store
    made before segpipe recorded one takes the first it sees, marked as recorded late."""
    import segpipe as api
    from segpipe import environment
    from segpipe.errors import EnvironmentChanged, StoreMismatch
    from segpipe.store.runstore import RunStore

    store = tmp_path / "s.zarr"
    api.decode(
        small / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=4, image_size=64),
        execution=api.Execution(progress=False),
    )
    api.encode(
        store, encoding=api.Encoding(random_weights=0), execution=api.Execution(progress=False)
    )
    here = environment.Work(environment.current("cpu"))
    opened = RunStore.open(store)
    assert opened.attrs["model"]["environment"] == here.env
    environment.check(opened, here)  # the same: nothing said, nothing written

    gpu = {"device": "cuda", "torch": here.env["torch"], "name": "NVIDIA H200", "cuda": "13.0"}
    gpu["cudnn"] = 91000
    with pytest.raises(EnvironmentChanged) as refused:
        environment.check(opened, environment.Work(gpu))
    assert isinstance(refused.value, StoreMismatch)  # the CLI's one line, the studio's 409
    for said in ("device cpu in the store, cuda here", "device name", "CUDA none in the store"):
        assert said in refused.value.message, refused.value.message
    assert "environment_changes" not in RunStore.open(store).attrs["model"]
    for _ in range(2):
        environment.check(RunStore.open(store), environment.Work(gpu), allow=True)
    environment.check(RunStore.open(store), environment.Work(gpu))  # mixes nothing new now
    model = RunStore.open(store).attrs["model"]
    assert model["environment_changes"] == [gpu] and environment.mixed(model)
    assert environment.said(gpu) == "cuda (NVIDIA H200), torch " + here.env["torch"] + (
        ", CUDA 13.0, cuDNN 91000"
    )

    old = {k: v for k, v in model.items() if not k.startswith("environment")}
    RunStore.open(store).set_attrs(model=old)  # as a store made before the record
    environment.check(RunStore.open(store), here)
    model = RunStore.open(store).attrs["model"]
    assert model["environment"] == here.env and model["environment_late"] is True
    status = segpipe("status", "--store", store)
    assert "recorded on a resume" in status.stdout, status.stdout


def other_environment(store) -> None:
    """Record in `store` that it was computed at 7 torch threads (no test runs at 7), and
    in no other environment."""
    from segpipe.store.runstore import RunStore

    opened = RunStore.open(store)
    model = {k: v for k, v in opened.attrs["model"].items() if k != "environment_changes"}
    opened.set_attrs(model={**model, "environment": {**model["environment"], "threads": 7}})


def test_repair_and_the_studio_refuse_another_environment_before_writing(small, tmp_path):
    """`repair` of a damaged chunk in another environment is refused before anything is
    deleted or redone; the studio's Track is refused with a 409 before its job starts (it
    would have answered 202 and failed in the job). `--allow-env-change` repairs, and the
    studio started with it tracks."""
    from test_studio import fetch

    import segpipe as api
    from segpipe.settings import Execution
    from segpipe.web.server import StudioServer

    store = tmp_path / "s.zarr"
    api.decode(
        small / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=4, image_size=64),
        execution=api.Execution(progress=False),
    )
    api.encode(
        store, encoding=api.Encoding(random_weights=0), execution=api.Execution(progress=False)
    )
    other_environment(store)
    (store / "features" / "level0" / "c" / "2" / "0" / "0" / "0").unlink()
    before = tree_digest(store)
    assert_user_error(segpipe("repair", "--store", store), "torch threads 7 in the store")
    assert tree_digest(store) == before
    proc = segpipe("repair", "--store", store, "--allow-env-change")
    assert proc.returncode == 0 and "recomputed 1 chunk of encode" in proc.stdout, proc.stderr

    body = {"prompts": [{"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}]}
    other_environment(store)
    server = StudioServer(store, port=0).start()
    try:
        assert fetch(server.url + "api/prompts", "PUT", body)[0] == 200
        before = tree_digest(store)
        status, data, _ = fetch(server.url + "api/track", "POST", {})
        assert status == 409 and "torch threads 7 in the store" in json.loads(data)["error"]
        assert tree_digest(store) == before
    finally:
        server.stop()
    server = StudioServer(store, port=0, execution=Execution(allow_env_change=True)).start()
    try:
        assert fetch(server.url + "api/track", "POST", {})[0] == 202
    finally:
        server.studio.job.thread.join(120)
        server.stop()
    assert ledger_count(store, "track_forward") >= 1
