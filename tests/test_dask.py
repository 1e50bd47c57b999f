"""Dask distributed (`--workers`, `--scheduler`): the same stores and exports as one process,
through worker deaths and a client death, on real clusters on loopback.

The clusters are real: `LocalCluster(n_workers=2, processes=True, threads_per_worker=1)`
(made by segpipe for `--workers 2`, or by the test, which then watches and kills its worker
processes), and a `dask scheduler` with two `dask worker` processes started as commands.
Torch runs on one thread everywhere (`make test` sets OMP_NUM_THREADS=1, which segpipe hands
to its workers), so every comparison is bit for bit with the single-process run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import distributed  # noqa: E402,F401 - `make test` installs the dask extra: missing, these fail
import pytest
from conftest import (  # noqa: E402
    IMAGE_SIZE,
    ROOT,
    assert_same_store,
    assert_user_error,
    ledger_count,
    ledger_records,
    require_root,
    run_args,
    segpipe,
    tree_digest,
    tree_mtimes,
    wait_for,
)
from test_dataset import VIDEOS, assert_same_pngs, dataset  # noqa: E402,F401 - a fixture

from segpipe.stages.export.stage import RUN_FORMATS

CHUNKS = 6  # the small clip: 24 frames in chunks of 4; prompted from frame 5 (chunk 1)


def exports(store: Path) -> dict:
    return tree_digest(store.with_name("clip.export"))


def assert_same_run(reference: Path, store: Path) -> None:
    assert_same_store(reference, store)
    assert exports(store) == exports(reference) and len(exports(reference)) > 24


@pytest.fixture(scope="module")
def reference(small, tmp_path_factory) -> Path:
    """The single-process run; it never imports Dask."""
    store = tmp_path_factory.mktemp("reference") / "clip.zarr"
    code = (
        "import sys; from segpipe.cli import main; sys.argv[0] = 'segpipe'; main(); "
        "print('dask imported' if {'dask', 'distributed'} & set(sys.modules) else 'no dask')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, run_args(small, store)), "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "no dask"
    return store


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster the tests watch (which worker runs what) and whose workers they kill;
    its nannies start a new worker process for each one killed."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as local,
        Client(local) as client,
    ):
        yield client


def running(client, prefix: str) -> dict[str, int]:
    """The process ids of the workers executing a task named `prefix` right now (asked of
    the workers themselves, not of the scheduler's plan)."""

    def executing(dask_worker):
        return os.getpid(), [str(ts.key) for ts in dask_worker.state.executing]

    return {
        w: pid
        for w, (pid, keys) in client.run(executing).items()
        if any(k.startswith(prefix) for k in keys)
    }


def kill_held_worker(store: Path, stage: str, total: int, hold: Path, proc):
    """SIGKILL the worker process that holds (`kill_points.hold_at_next_record`) before
    committing its second chunk of `stage` (it has committed one), then let the other
    workers go on. Returns (the chunks committed at the kill, the time of the kill)."""
    claim, release = hold / "claim", hold / "release"

    def held():
        return claim.exists() and claim.read_text() != ""

    assert wait_for(held, proc, timeout=180), "no worker held mid-stage"
    os.kill(int(claim.read_text()), signal.SIGKILL)
    killed_at = time.time()
    done = committed(store, stage)
    release.touch()
    assert_mid_stage(store, stage, total)
    return done, killed_at


def assert_mid_stage(store: Path, stage: str, total: int) -> None:
    """Some chunk of `stage` committed (for some object, in a pass), not every chunk (for
    every object): the kill landed mid-stage."""
    if stage.startswith("track_"):
        each = [len(committed(store, f"{stage}/{s}")) for s in range(3)]
    else:
        each = [len(committed(store, stage))]
    assert max(each) >= 1 and min(each) < total, (stage, each)


def committed(store: Path, stage: str) -> dict[int, float]:
    """Chunk -> commit time (its ledger entry's mtime) of the chunks `stage` has committed."""
    return ledger_records(store, stage)


HOLD_PRELOAD = """
import os, sys

sys.path.insert(0, os.environ["HOLD_TESTS"])
import kill_points

kill_points.hold_at_next_record(*(os.environ[f"HOLD_{v}"] for v in ("PART", "CLAIM", "RELEASE")))
"""


def kill_client(args: list[str], stage: str, hold: Path, when, ctrl_c: bool = False) -> None:
    """Start `segpipe <args>` whose workers hold (`kill_points.hold_at_next_record`) before
    recording their second chunk of `stage`, and kill -9 it once a worker holds and `when()`
    holds (with `ctrl_c`: Ctrl-C at a terminal instead, SIGINT to the command's process
    group, its workers too, and it exits 130 by itself); its worker processes end with it
    (nothing writes behind a rerun's back), and nothing of theirs reaches the terminal: no
    traceback, no "leaked semaphore objects" from multiprocessing's resource tracker (which
    speaks when its parent is gone)."""
    import psutil

    hold.mkdir()
    (hold / "preload.py").write_text(HOLD_PRELOAD)
    env = {
        **os.environ,
        "DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(hold / "preload.py")]),
        "HOLD_TESTS": str(ROOT / "tests"),
        "HOLD_PART": stage,
        "HOLD_CLAIM": str(hold / "claim"),
        "HOLD_RELEASE": str(hold / "release"),
    }
    stderr = hold / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "segpipe.cli", *args, "--quiet"],
            cwd=ROOT,
            stderr=err,
            env=env,
            start_new_session=ctrl_c,  # its own process group, as a shell's job
        )
    try:
        held = lambda: (hold / "claim").exists() and when()  # noqa: E731
        assert wait_for(held, proc, timeout=180), "no worker held mid-stage"
        workers = psutil.Process(proc.pid).children(recursive=True)
        if ctrl_c:  # (it stops at once: a client that waited for the held task never would)
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=120)
            assert code == 130, (code, stderr.read_text())
        else:
            proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert len(workers) >= 2
    _, alive = psutil.wait_procs(workers, timeout=30)  # the tracker too
    assert not alive, alive
    said = stderr.read_text()
    assert "leaked" not in said and "resource_tracker" not in said, said
    assert "Traceback" not in said, said


def test_run_on_two_workers_stopped_mid_encode_killed_mid_pass_and_export_then_rerun_is_the_same(
    small, reference, tmp_path
):
    """`run --workers 2` (segpipe's own LocalCluster), stopped by Ctrl-C mid-encode, then the
    rerun killed -9 mid-tracking, then the next rerun killed -9 mid-export (a chunk exported
    by a task, not every chunk): the same command again continues from the ledgers to the
    same store and exports, bit for bit, without redoing a committed chunk.

    The chunk of the first prompt (chunk 1: frames 4..7; the forward pass writes 5..7, the
    reverse pass 4) is written by the reverse pass only after the forward pass committed
    it: the reverse pass starts (writes its prompted memory) after that commit."""
    store = tmp_path / "clip.zarr"
    args = [*map(str, run_args(small, store)), "--workers", "2"]
    kill_client(args, "encode", tmp_path / "hold1", lambda: True, ctrl_c=True)
    encoded = committed(store, "encode")
    assert_mid_stage(store, "encode", CHUNKS)
    forward = CHUNKS - 1  # chunks 1..5
    kill_client(args, "track_forward", tmp_path / "hold2", lambda: True)
    tracked = committed(store, "track_forward")
    assert_mid_stage(store, "track_forward", forward)
    formats = [f"export_{f}" for f in RUN_FORMATS]

    def exports_done():
        return sum(len(committed(store, f)) for f in formats)

    before = exports_done()  # (exports follow the forward pass: some may be done)
    kill_client(args, "export_", tmp_path / "hold3", lambda: exports_done() > before)
    exported = {f: committed(store, f) for f in formats}
    assert before < sum(map(len, exported.values())) < 3 * CHUNKS  # mid-export
    rerun = segpipe(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert "dask: 2 workers (cpu, 1 torch thread each); dashboard" in rerun.stderr
    assert_same_run(reference, store)
    for stage, before in (("encode", encoded), ("track_forward", tracked), *exported.items()):
        assert all(committed(store, stage)[k] == t for k, t in before.items()), stage
    for s in range(3):  # each group's reverse pass waited for its objects' forward chunk 1
        forward_commit = committed(store, f"track_forward/{s}")[1]
        prompted = store / "memory" / "reverse" / str(s) / "prompted_frame" / "zarr.json"
        assert prompted.stat().st_mtime >= forward_commit
        assert committed(store, f"track_reverse/{s}")[1] >= forward_commit


def test_a_task_whose_run_was_taken_over_writes_nothing(reference, tmp_path, request):
    """Another run took the store's lock (released, then taken again: a new token) while
    tasks of the first were on the workers. Those tasks write nothing: refused at their
    start, and, for those past their start (the store opened under the old lease, as a task
    opens it), before the data of the chunk they were doing (and its done-record). Tasks of the new run then
    finish the store as the single-process run made it. An export task whose export is not
    the recorded one (here another folder) is refused and leaves the record and ledger as
    they were. In process, on a real store: the lock is held by this test."""
    import torch

    from segpipe.dask import tasks as units
    from segpipe.errors import StoreLocked, StoreMismatch
    from segpipe.store.lock import store_lock, token
    from segpipe.store.runstore import RunStore

    # the tasks set this process's torch thread count to theirs (1): given back after, so
    # the tests after this one in this process compute at the count it started with
    request.addfinalizer(lambda threads=torch.get_num_threads(): torch.set_num_threads(threads))

    store = tmp_path / "clip.zarr"
    shutil.copytree(reference, store)
    shutil.copytree(reference.with_name("clip.export"), store.with_name("clip.export"))
    copy = RunStore.open(store)
    # the copy's exports are its own (their record names the folder they were written to)
    copy.set_attrs(
        exports=json.loads(
            json.dumps(copy.attrs["exports"]).replace(str(reference.parent), str(tmp_path))
        )
    )
    todo = {"encode": 2, "track_forward": 5, "export_davis": 3}
    for stage, k in todo.items():
        copy.ledger(stage).undo(k)
    path, davis = str(store), {"fmt": "davis", "out": str(store.with_name("clip.export") / "davis")}
    with store_lock(store):
        old = units.Work(token(store), None, "cpu", 1, 1)
        begun = [units._store(path, old) for _ in range(3)]
    with store_lock(store):
        new = units.Work(token(store), None, "cpu", 1, 1)
        written = tree_mtimes(tmp_path)
        for stale in (
            lambda: units.encode_task(path, 2, old),
            lambda: units.encode_on(begun[0], 2, old),
            lambda: units.pass_on(begun[1], "forward", [0, 1, 2], old),
            lambda: units.export_on(begun[2], davis, 3),
            lambda: begun[1].commit_objects("forward", 5, [0, 1, 2], [], []),
        ):  # data written, say
            with pytest.raises(StoreLocked, match="no longer locked by the run that sent"):
                stale()
        assert tree_mtimes(tmp_path) == written  # not a chunk's data, not a done-record
        record = RunStore.open(store).attrs["exports"]
        with pytest.raises(StoreMismatch, match="export davis is not the recorded one .its out."):
            units.export_task(path, {**davis, "out": str(tmp_path / "elsewhere")}, 3, new)
        after = RunStore.open(store)
        assert after.attrs["exports"] == record
        assert [after.ledger(stage).is_done(k) for stage, k in todo.items()] == [False] * 3
        units.encode_task(path, 2, new)
        units.pass_task(path, "forward", [0, 1, 2], new)
        units.export_task(path, davis, 3, new)
    assert_same_run(reference, store)


def test_a_stale_pass_task_from_the_first_chunk_writes_nothing(reference, tmp_path, request):
    """A tracking-pass task whose run was taken over, started before (its store opened under
    the old lease) and resuming the pass from its first chunk: the first thing it writes is
    the pass's prompted memory (`memory/forward/<slot>/prompted_*`), which every later resume reads.
    The lease inside the store refuses that write too; no file of the store changes."""
    import torch

    from segpipe.dask import tasks as units
    from segpipe.errors import StoreLocked
    from segpipe.store.lock import store_lock, token
    from segpipe.store.runstore import RunStore

    # a task's store opening sets this process's torch thread count to the task's: given back
    request.addfinalizer(lambda threads=torch.get_num_threads(): torch.set_num_threads(threads))

    store = tmp_path / "clip.zarr"
    shutil.copytree(reference, store)
    copy = RunStore.open(store)
    for k in range(6):
        copy.ledger("track_forward").undo(k)  # the pass starts over from its first chunk
    path = str(store)
    with store_lock(store):
        old = units.Work(token(store), None, "cpu", 1, 1)
        begun = units._store(path, old)
    with store_lock(store):  # another run took the store over
        written = tree_mtimes(store)
        with pytest.raises(StoreLocked, match="no longer locked by the run that sent"):
            units.pass_on(begun, "forward", [0, 1, 2], old)
        assert tree_mtimes(store) == written


def test_workers_run_one_task_at_a_time_at_the_clients_thread_count(monkeypatch):
    """The torch thread count sent to the workers is the client's OMP_NUM_THREADS, else the
    client's own torch count (never the workers' default); a worker running two tasks at a
    time is refused in one line (two would race on torch's thread count)."""
    import torch
    from distributed import LocalCluster

    from segpipe import BadInput
    from segpipe.dask.client import connect, worker_threads
    from segpipe.settings import Execution

    mine = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    try:
        torch.set_num_threads(2)
        assert worker_threads() == 2
    finally:
        torch.set_num_threads(mine)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as two,
        pytest.raises(
            BadInput, match="runs 2 tasks at a time; segpipe needs one .dask worker --nthreads 1.$"
        ),
    ):
        with connect(Execution(scheduler=two.scheduler_address, device="cpu", progress=False)):
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask_command(*args) -> list[str]:
    return [sys.executable, "-m", "dask", *args]


@pytest.fixture
def scheduler(tmp_path):
    """`dask scheduler` on loopback; yields its address and a function that starts a
    `dask worker` for it (a command line prefix may wrap the worker)."""
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            dask_command(
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                address.rsplit(":", 1)[1],
                "--no-dashboard",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]

    def worker(*wrap):
        procs.append(
            subprocess.Popen(
                [
                    *wrap,
                    *dask_command(
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--no-dashboard",
                        "--host",
                        "127.0.0.1",
                        "--local-directory",
                        str(tmp_path / "dask"),
                    ),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    try:
        yield address, worker
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_dataset_on_a_scheduler_and_two_worker_processes(dataset, scheduler, tmp_path):
    """`segpipe.dataset(..., scheduler=)` against `dask scheduler` and two `dask worker`
    commands: one task per video, the PNGs of SAM 2's vos_inference (its oracle, run here
    in memory); a video that fails for a reason of its own is reported, the others go on,
    and a rerun finds them done."""
    from vos_oracle import oracle_predictor, oracle_video

    import segpipe

    address, worker = scheduler
    worker()
    worker()
    root = tmp_path / "ds"
    shutil.copytree(dataset / "JPEGImages", root / "JPEGImages")
    (root / "JPEGImages" / "cows" / "00010.jpg").write_bytes(b"not a jpeg")
    (root / "list.txt").write_text("bear\ncows\n")
    args = dict(
        vos=segpipe.VosInference(video_list_file=root / "list.txt"),
        encoding=segpipe.Encoding(random_weights=0),
        decoding=segpipe.Decoding(image_size=IMAGE_SIZE, chunk_size=4),
        execution=segpipe.Execution(device="cpu", progress=False, scheduler=address),
    )
    out, work = tmp_path / "out", tmp_path / "work"
    results = segpipe.dataset(root / "JPEGImages", dataset / "Annotations", out, work, **args)
    status = {r.video: r.status for r in results}
    assert [r.video for r in results] == ["bear", "cows"]
    assert status["bear"] == "done", status
    assert status["cows"].startswith("failed: ") and "unreadable image" in status["cows"]
    oracle_video(
        oracle_predictor(IMAGE_SIZE, 0, postprocessing=False, per_obj=False),
        dataset / "JPEGImages",
        dataset / "Annotations",
        tmp_path / "theirs",
        "bear",
    )
    assert assert_same_pngs(out / "bear", tmp_path / "theirs" / "bear") == VIDEOS["bear"][0]
    again = segpipe.dataset(root / "JPEGImages", dataset / "Annotations", out, work, **args)
    assert [r.status for r in again][0] == "already done"


def test_workers_that_cannot_see_the_store_are_refused(small, scheduler, tmp_path):
    """A worker whose file system is not the client's (here: a private mount namespace with
    an empty tmpfs over the test's folder) is refused before anything is written."""
    require_root("a private mount namespace")  # as root no unshare fails the test
    address, worker = scheduler
    hidden = tmp_path / "here"
    hidden.mkdir()
    worker(
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs none "{hidden}" && exec "$0" "$@"',
    )
    store = hidden / "clip.zarr"
    proc = segpipe(*run_args(small, store), "--scheduler", address)
    assert_user_error(proc, "dask worker", "not visible here", "shared")
    assert not store.exists()


@pytest.mark.parametrize("command", ["run", "encode", "track", "dataset"])
def test_help_has_workers_and_scheduler_with_an_example(command):
    text = segpipe(command, "--help", check=True).stdout
    assert "--workers N" in text and "--scheduler ADDRESS" in text
    example = text.split("Example")[1]
    assert f"segpipe {command}" in example
    assert "--workers 2" in example or "--workers 4" in example or "--scheduler tcp://" in example


def test_segpipes_local_workers_run_without_dasks_malloc_trim_threshold():
    """Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in its workers, which made a chunk
    encode 40% slower here (`bench_dask.py`); segpipe's `--workers` cluster leaves it out.
    In a fresh process, as a command starts: a nanny also sets it in its parent's
    environment, so this test process has it once another test made a cluster."""
    code = (
        "import os\n"
        "from segpipe.dask.client import _client\n"
        "if __name__ == '__main__':\n"
        "    with _client(1, None) as client:\n"
        "        print(set(client.run(os.environ.get, 'MALLOC_TRIM_THRESHOLD_').values()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{None}", proc.stdout


# A Dask worker preload (`distributed.worker.preload`) for the test below: the first time a
# task on this worker finds `features/levelN` (RACE_LEVEL) missing, it waits (a few seconds
# at most) for a task on the other worker to find it missing too, as long as the scheduler
# holds another encode task (one the other worker runs, or will: none, and no task can come
# while this one waits, the client sending the rest only after it); the second to arrive
# then looks on after the first had time to create it. This forces the interleaving of a
# race two tasks making the same array could only sometimes hit, every time; `arrived/`
# tells how many tasks ever found the array missing.
RACE_PRELOAD = """
import os, time
from pathlib import Path

from distributed import get_client, get_worker

from segpipe.store.runstore import RunStore

MEET, LEVEL = Path(os.environ["RACE_DIR"]), os.environ["RACE_LEVEL"]
look, waited = getattr(RunStore, "race_look", RunStore.array), []  # reloaded: the first


def others() -> bool:  # whether the scheduler holds an encode task other than this one
    mine = str(get_worker().get_current_task())
    keys = get_client().run_on_scheduler(lambda dask_scheduler: [*map(str, dask_scheduler.tasks)])
    return any(k.startswith("encode-") and k != mine for k in keys)


def array(self, name):
    found = look(self, name)
    if found is None and name == LEVEL and not waited:
        waited.append(True)
        (MEET / "arrived" / str(os.getpid())).touch()
        try:
            os.close(os.open(MEET / "first", os.O_CREAT | os.O_EXCL))
            first = True
        except FileExistsError:
            first = False
        deadline = time.monotonic() + 8
        if others():
            while len(os.listdir(MEET / "arrived")) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        if not first:
            time.sleep(1.5)  # the first has made the array meanwhile
    return found


if not hasattr(RunStore, "race_look"):  # Dask may import a preload more than once
    RunStore.race_look, RunStore.array = look, array
"""


class Killed(BaseException):
    """What a kill -9 at that point leaves: nothing after it runs."""


def test_resume_after_a_kill_between_the_feature_levels_on_two_workers(
    small, tmp_path, monkeypatch
):
    """A single-process encode killed after making `features/level0` (and writing its chunk
    0) but before making level1: `encode --workers 2` on that store, and on one where
    level0 is gone while level1 and level2 exist. However the tasks' timing falls (the
    preload above makes two tasks find the missing level missing together, whenever the
    client lets them), the command ends in the single-process encode's store, bit for bit,
    and only one task ever finds a level missing: the client sends a chunk alone until
    every level exists."""
    import segpipe as api
    from segpipe.settings import Encoding, Execution
    from segpipe.stages.encode import encode
    from segpipe.store.features import LEVELS
    from segpipe.store.runstore import RunStore

    # decoded and encoded in this process, by what `segpipe decode` and `encode` call
    decoded = tmp_path / "decoded.zarr"
    api.decode(
        small / "clip.mp4",
        decoded,
        decoding=api.Decoding(chunk_size=8, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    reference = tmp_path / "reference.zarr"  # 3 chunks, encoded in one process
    shutil.copytree(decoded, reference)
    api.encode(
        reference, encoding=api.Encoding(random_weights=0), execution=api.Execution(progress=False)
    )

    def killed_at(store: Path, where: str, name: str) -> None:
        real = getattr(RunStore, where)

        def cut(self, arg, *a, **kw):
            if arg == name:
                raise Killed
            return real(self, arg, *a, **kw)

        with monkeypatch.context() as m:
            m.setattr(RunStore, where, cut)
            with pytest.raises(Killed):
                encode(store, Encoding(random_weights=0), Execution(progress=False))

    preload = tmp_path / "race_preload.py"
    preload.write_text(RACE_PRELOAD)
    for case, missing, present in (
        ("level0_only", LEVELS[1], [True, False, False]),
        ("level0_gone", LEVELS[0], [False, True, True]),
    ):
        store = tmp_path / f"{case}.zarr"
        shutil.copytree(decoded, store)
        if case == "level0_only":  # made, its chunk 0 written; killed making level1
            killed_at(store, "create_array", LEVELS[1])
        else:  # every level made and chunk 0 written, killed before its commit; level0 lost
            killed_at(store, "commit", "encode")
            shutil.rmtree(store / LEVELS[0])
        assert [RunStore.open(store).array(n) is not None for n in LEVELS] == present
        meet = tmp_path / f"meet-{case}"
        (meet / "arrived").mkdir(parents=True)
        env = {
            "DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(preload)]),
            "RACE_DIR": str(meet),
            "RACE_LEVEL": missing,
        }
        args = ("encode", "--store", store, "--random-weights", 0, "--workers", 2)
        proc = segpipe(*args, env=env, timeout=300)
        assert proc.returncode == 0, (case, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert_same_store(reference, store)
        assert len(os.listdir(meet / "arrived")) == 1, case  # the first chunk went alone


def test_a_feature_level_is_made_alike_by_whichever_task_makes_it(tmp_path, monkeypatch):
    """`level_array`, as two encode tasks side by side call it on a level neither found: the
    one that makes it second (it looked before the first made it, and zarr then refuses to
    make it again) uses the first's array, unchanged; an array that exists otherwise than
    this encode makes it is refused in one line. In process, on a real store."""
    import numpy as np

    from segpipe.errors import StoreMismatch
    from segpipe.store.features import LEVELS, level_array
    from segpipe.store.runstore import RunStore

    path = tmp_path / "clip.zarr"
    RunStore.create(path, {"frame_count": 6, "decoding": {"chunk_size": 4, "image_size": 64}})
    kind = ("contiguous", "float32", "float32")
    winner, loser = RunStore.open(path), RunStore.open(path)
    name = LEVELS[1]
    looked = loser.array(name)  # the loser looks first: nothing yet
    assert looked is None
    level_array(winner, name, (2, 3), np.float32, kind)[0:4] = 1.0
    made = (path / name / "zarr.json").read_bytes()
    real, seen = RunStore.array, []

    def stale(self, n):  # the loser's look, as it was before the winner made the array
        seen.append(n)
        return looked if len(seen) == 1 else real(self, n)

    monkeypatch.setattr(RunStore, "array", stale)
    arr = level_array(loser, name, (2, 3), np.float32, kind)
    monkeypatch.undo()
    assert len(seen) == 2  # it tried to make the array, and took the winner's
    arr[4:6] = 2.0
    assert (path / name / "zarr.json").read_bytes() == made
    again = RunStore.open(path).array(name)
    assert again.shape == (6, 2, 3) and again.chunks == (4, 2, 3)
    assert np.array_equal(again[...], np.repeat([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], 6).reshape(6, 2, 3))
    assert dict(again.attrs) == {
        "embedding_dtype": "float32",
        "torch_dtype": "float32",
        "memory_format": "contiguous",
    }
    for shape, dtype, other in (
        ((2, 4), np.float32, kind),
        ((2, 3), np.float16, kind),
        ((2, 3), np.float32, ("channels_last", "float32", "float32")),
    ):
        with pytest.raises(
            StoreMismatch, match=f"{name} is float32 .6, 2, 3. in chunks .4, 2, 3. "
        ):
            level_array(RunStore.open(path), name, shape, dtype, other)


# The tests on the module's `cluster` come last: it is torn down at the end of the module,
# and until then its idle processes (scheduler, nannies, workers) keep a share of a core busy.


def test_workers_killed_mid_encode_and_mid_pass_are_replaced_and_the_run_is_the_same(
    small, reference, cluster, tmp_path
):
    """`run --scheduler` on a LocalCluster: SIGKILL a worker while it encodes a chunk, and
    again while it runs the forward pass (of one of the two groups of objects, one per
    worker). Dask runs the lost tasks again on a worker that lives; the encode task encodes
    its chunk, the group's pass resumes from its objects' last committed chunk; the store
    and exports are the single-process run's."""
    from dask_holds import HoldAtNextRecord

    store = tmp_path / "clip.zarr"
    holds = {stage: tmp_path / f"hold-{stage}" for stage in ("encode", "track_forward")}
    for stage, hold in holds.items():  # in the workers the cluster has and those it starts
        hold.mkdir()
        plugin = HoldAtNextRecord(stage, str(hold / "claim"), str(hold / "release"))
        cluster.register_plugin(plugin, name=f"hold-{stage}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "segpipe.cli",
            *map(str, run_args(small, store)),
            "--scheduler",
            cluster.scheduler.address,
            "--quiet",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        encoded, encode_kill = kill_held_worker(store, "encode", CHUNKS, holds["encode"], proc)
        forward = CHUNKS - 1  # chunks 1..5
        tracked, pass_kill = kill_held_worker(
            store, "track_forward", forward, holds["track_forward"], proc
        )
        objects = {s: committed(store, f"track_forward/{s}") for s in range(3)}  # 2 groups
        _, err = proc.communicate(timeout=300)
    finally:
        for stage, hold in reversed(holds.items()):  # (the last one patched, undone first)
            (hold / "release").touch()
            cluster.unregister_worker_plugin(f"hold-{stage}")
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert_same_run(reference, store)
    for s, before in objects.items():  # each group resumed from its objects' own records
        assert all(committed(store, f"track_forward/{s}")[k] == t for k, t in before.items()), s
    for stage, before, killed_at in (
        ("encode", encoded, encode_kill),
        ("track_forward", tracked, pass_kill),
    ):
        after = committed(store, stage)
        # the chunks not committed at the kill were committed after it, by the tasks Dask
        # ran again; those committed before were not done again
        assert all(after[k] > killed_at for k in set(after) - set(before)), stage
        assert all(after[k] == t for k, t in before.items()), stage


def test_dataset_on_two_workers_is_the_single_process_run(
    dataset, checkpoint, cluster, tmp_path, monkeypatch
):
    """`segpipe.dataset` on the LocalCluster (a task per video) and in one process: the same
    PNGs byte for byte and the same stores. The dataset, the video list and the checkpoint
    are given relative to the client's working directory, which is not the workers'."""
    import segpipe

    (tmp_path / "ckpt.pt").symlink_to(checkpoint)
    (tmp_path / "list.txt").write_text("bear\ncows\n")
    (tmp_path / "vos").symlink_to(dataset)
    monkeypatch.chdir(tmp_path)
    args = dict(
        vos=segpipe.VosInference(video_list_file="list.txt"),
        encoding=segpipe.Encoding(checkpoint="ckpt.pt"),
        decoding=segpipe.Decoding(image_size=IMAGE_SIZE, chunk_size=4),
    )
    runs = {}
    for name, where in (("here", None), ("dask", cluster.scheduler.address)):
        work = tmp_path / name
        out = work / "out"  # in the stores' folder: their records of it compare as the same
        execution = segpipe.Execution(device="cpu", progress=False, scheduler=where)
        results = segpipe.dataset(
            "vos/JPEGImages", "vos/Annotations", out, work, **args, execution=execution
        )
        assert [(r.video, r.status) for r in results] == [("bear", "done"), ("cows", "done")]
        runs[name] = out, work
    (here, here_work), (there, there_work) = runs["here"], runs["dask"]
    assert tree_digest(here) == tree_digest(there)
    assert len(tree_digest(here)) == VIDEOS["bear"][0] + VIDEOS["cows"][0]
    for video in ("bear", "cows"):
        assert_same_store(here_work / f"{video}.zarr", there_work / f"{video}.zarr")


def test_a_user_error_in_a_task_is_one_line(small, cluster, tmp_path):
    """A chunk of frames gone: the worker that meets it raises `DamagedStore`, which the
    client reports as the single-process run would."""
    import segpipe as api

    store = tmp_path / "clip.zarr"
    api.decode(
        small / "clip.mp4",
        store,
        decoding=api.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        execution=api.Execution(progress=False),
    )
    (store / "frames" / "c" / "2" / "0" / "0" / "0").unlink()
    proc = segpipe(
        "encode", "--store", store, "--random-weights", 0, "--scheduler", cluster.scheduler.address
    )
    assert_user_error(proc, "damaged", "'frames' chunk 2 is missing", "segpipe repair")
    assert ledger_count(store, "encode") < CHUNKS
    import dask

    from segpipe import BadInput, Encoding, Execution, encode

    seeded = Encoding(random_weights=0)
    with pytest.raises(BadInput, match="not both"):
        both = Execution(workers=2, scheduler=cluster.scheduler.address)
        encode(store, encoding=seeded, execution=both)
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "1s"}),
        pytest.raises(BadInput, match="cannot reach the Dask scheduler at tcp://"),
    ):
        away = Execution(scheduler=f"tcp://127.0.0.1:{free_port()}")
        encode(store, encoding=seeded, execution=away)
