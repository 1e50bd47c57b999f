"""Dask workers compute the client's bits whatever the environment a user starts with: not
only under `make test`'s OMP_NUM_THREADS=1, but with no thread variable set at all (a new
user's shell), and a worker that would compute other bits is refused before any work."""

from __future__ import annotations

import os
import subprocess
import sys

import distributed  # noqa: F401 - `make test` installs the dask extra: missing, these fail
from conftest import (
    IMAGE_SIZE,
    ROOT,
    assert_same_store,
    assert_user_error,
    run_args,
    segpipe,
    tree_digest,
)
from test_dask import scheduler  # noqa: F401 - a fixture

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def segpipe_unset(*args) -> subprocess.CompletedProcess:
    """The CLI as a shell that sets no thread variable runs it (a new user's): torch at the
    cores' count. With OMP_WAIT_POLICY=PASSIVE, which changes how an idle OpenMP thread
    waits and nothing of what is computed: a waiting thread sleeps instead of spinning. On
    shared cores (the tests beside it, two Dask workers at the cores' count) spinning
    threads made this 6 times slower, and the other worker's tests with it."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return subprocess.run(
        [sys.executable, "-m", "segpipe.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )


def cores_count() -> int:
    """Torch's thread count in a process started without any thread variable: the cores'."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return int(out.stdout.split()[-1])


def test_workers_match_the_single_process_run_at_their_share_of_the_cores(small, tmp_path):
    """`run --workers 2` started without any thread variable (a new user's shell) runs each
    worker at the cores' count // 2, in processes started with it as OMP_NUM_THREADS, the
    objects in one group per worker: the same store, array for array, as the single-process
    run started with OMP_NUM_THREADS (MKL's, OpenBLAS's) at that count. (Dask's nanny starts workers with
    OMP_NUM_THREADS=1 and writes it into the client's own os.environ too, so the thread
    count the client sent was read after it as 1, while the single process ran at the
    cores' count: 18 of 38 arrays differed.)"""
    share = max(1, cores_count() // 2)
    alone, spread = tmp_path / "alone.zarr", tmp_path / "spread.zarr"
    started = {k: str(share) for k in THREAD_VARIABLES}  # as the workers are started
    proc = segpipe(*run_args(small, alone), "--export", "none", "--quiet", env=started)
    assert proc.returncode == 0, proc.stderr
    proc = segpipe_unset(*run_args(small, spread), "--export", "none", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"dask: 2 workers (cpu, {share} torch thread" in proc.stderr
    assert_same_store(alone, spread)


def test_a_worker_that_computes_other_bits_is_refused_in_one_line(small, scheduler, tmp_path):  # noqa: F811
    """A `dask worker` whose torch computes other bits than the client (here: started with
    ATEN_CPU_CAPABILITY=default, its vector kernels off, as on another CPU) fails the
    client's probe (SAM 2's image encoder on one small image, compared digest for digest)
    and is refused before anything is written."""
    address, worker = scheduler
    worker("env", "ATEN_CPU_CAPABILITY=default")
    store = tmp_path / "s.zarr"
    segpipe(
        "decode",
        small / "clip.mp4",
        "--store",
        store,
        "--chunk-size",
        4,
        "--image-size",
        IMAGE_SIZE,
        "--quiet",
        check=True,
    )
    before = tree_digest(store)
    proc = segpipe("encode", "--store", store, "--random-weights", 0, "--scheduler", address)
    assert_user_error(proc, "computes other bits than this process", "thread environment")
    assert tree_digest(store) == before


def test_local_workers_print_nothing_on_the_terminal(capfd):
    """segpipe's local workers and their nannies log nothing to the terminal they share with
    the client: a task's failure comes back to the client as its one-line error, and a
    worker whose client was killed -9 used to print, on its way out, a traceback for each
    heartbeat that found no scheduler ("Failed to communicate with scheduler during
    heartbeat", logged at ERROR) after the command had ended."""
    import logging

    from segpipe.dask.client import _client

    def log(name):
        logging.getLogger(name).exception("heartbeat failed, as after a kill of the client")

    with _client(2, None) as client:
        client.run(log, "distributed.worker")
        client.run(log, "distributed.nanny", nanny=True)
    _, err = capfd.readouterr()
    assert "heartbeat failed" not in err, err
