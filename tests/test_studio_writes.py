"""The studio where the store cannot be written, and two studios on one store: a read-only
file system makes the studio read-only (writes 409, in one line), a full disk answers 507
in one line, and neither changes the store; two studios take turns (one Track runs, the
other's is refused with 409 before it starts) and both pages end up showing the store's
prompts. Real servers on loopback, real stores, real mounts (root, as CI runs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import IMAGE_SIZE, require_root, spawn, tree_digest
from test_studio import fetch

POINT = {"object": 1, "frame": 5, "points": [[30, 30]], "labels": [1]}


@pytest.fixture(scope="module")
def made(small, tmp_path_factory) -> Path:
    """The small clip decoded and encoded (random weights, chunks of 4), nothing tracked."""
    import segpipe

    store = tmp_path_factory.mktemp("writes") / "clip.zarr"
    segpipe.decode(
        small / "clip.mp4",
        store,
        decoding=segpipe.Decoding(chunk_size=4, image_size=IMAGE_SIZE),
        execution=segpipe.Execution(progress=False),
    )
    segpipe.encode(
        store,
        encoding=segpipe.Encoding(random_weights=0),
        execution=segpipe.Execution(progress=False),
    )
    return store


def mount(*argv) -> None:
    """`mount argv` as root; else skip (fail in CI, where every test must run)."""
    try:
        proc = subprocess.run(["mount", *map(str, argv)], capture_output=True, text=True)
        error = proc.returncode and (proc.stderr.strip() or f"mount exited {proc.returncode}")
    except OSError as e:
        error = str(e)
    if error:
        require_root(f"mount ({error})")
        pytest.fail(f"cannot mount: {error}")


@contextmanager
def read_only_copy(made: Path, tmp_path: Path):
    """A copy of the store `made` on a read-only bind mount: its path, for the block."""
    writable, ro = tmp_path / "rw", tmp_path / "ro"
    writable.mkdir()
    ro.mkdir()
    shutil.copytree(made, writable / made.name)
    mount("--bind", writable, ro)
    try:
        mount("-o", "remount,ro,bind", ro)
        yield ro / made.name
    finally:
        subprocess.run(["umount", str(ro)])


def one_line_error(status_and_body, status: int, *words) -> str:
    got, data, _ = status_and_body
    error = json.loads(data)["error"]
    assert got == status, (got, error)
    assert "\n" not in error and "Traceback" not in error, error
    for w in words:
        assert w in error, error
    return error


def test_a_read_only_file_system_makes_the_studio_read_only(made, tmp_path):
    """The store on a read-only bind mount: `/api/info` says why the studio is read-only, and
    saving prompts, Track and Export are each refused with 409 and that line (they were a
    500 from the lock file, and a 202 whose job then failed); looking still works; the store
    is unchanged."""
    from segpipe.web.server import StudioServer

    with read_only_copy(made, tmp_path) as store:
        digest = tree_digest(store)
        server = StudioServer(store, port=0).start()
        try:
            info = json.loads(fetch(server.url + "api/info")[1])
            assert "cannot be written here" in (info["read_only"] or ""), info
            for method, path, body in (
                ("PUT", "api/prompts", {"prompts": [POINT]}),
                ("POST", "api/track", {}),
                ("POST", "api/export", {"format": "davis"}),
            ):
                one_line_error(fetch(server.url + path, method, body), 409, "read-only")
            assert fetch(server.url + "api/frames/3.jpg")[0] == 200
        finally:
            server.stop()
        assert tree_digest(store) == digest


def test_a_full_disk_is_a_507_in_one_line_and_the_store_is_left_intact(made, tmp_path):
    """The store on a 3 MB tmpfs filled to the last byte: saving prompts and Track are each
    a 507 with one line naming the full disk (the lock file's write fails). With one page
    left, the lock is written but the saved prompts are not: a 507 too, and the draft half
    written is removed. No lock is left, and the store is unchanged. Freed, the same
    request saves."""
    from segpipe.web.server import StudioServer

    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=3m", "tmpfs", disk)
    try:
        store = disk / "clip.zarr"
        shutil.copytree(made, store)
        server = StudioServer(store, port=0).start()
        try:
            assert fetch(server.url + "api/prompts", "PUT", {"prompts": [POINT]})[0] == 200
            filler = disk / "filler"
            with open(filler, "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError:
                    pass
            digest = tree_digest(store)
            many = [[30 + i % 60, 30] for i in range(1000)]
            body = {"prompts": [{**POINT, "points": many, "labels": [1] * 1000}]}
            one_line_error(fetch(server.url + "api/prompts", "PUT", body), 507, "disk full")
            one_line_error(fetch(server.url + "api/track", "POST", {}), 507, "disk full")
            assert tree_digest(store) == digest
            assert sorted(p.name for p in disk.iterdir()) == ["clip.zarr", "filler"]

            with open(filler, "r+b") as f:  # one page free: the lock file's, not the draft's
                f.truncate(filler.stat().st_size - 4096)
            one_line_error(fetch(server.url + "api/prompts", "PUT", body), 507, "disk full")
            assert tree_digest(store) == digest  # no .prompts.json.tmp left in it
            assert sorted(p.name for p in disk.iterdir()) == ["clip.zarr", "filler"]
            filler.unlink()
            assert fetch(server.url + "api/prompts", "PUT", body)[0] == 200
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", str(disk)])


def studio(store: Path) -> tuple[subprocess.Popen, str]:
    """`segpipe studio STORE --port 0` in its own process, each job's thread slowed to start
    (`kill_points.slow_job_start`: the moment after a 202, when a second writer must already
    be refused); (the process, its URL)."""
    code = "import sys\nsys.path.insert(0, 'tests')\nimport kill_points\n"
    code += "kill_points.slow_job_start(0.5)\nkill_points.cli(sys.argv[1:])"
    proc = spawn(["studio", store, "--port", 0], code, subprocess.PIPE, subprocess.PIPE)
    line = proc.stdout.readline()
    assert line.startswith("studio: http://"), proc.stderr.read()
    return proc, line.split()[1]


def test_two_studios_on_one_store_take_turns_and_converge(made, tmp_path):
    """Two studio processes on one store, 20 requests interleaved in pairs sent at once
    (both look at the prompts, then both Track them, then each saves its own): Tracks sent
    together start one job (202)
    and the other is refused with 409 before any work (it used to be a second 202 whose job
    then failed); a save while the other's job runs is refused too. No two jobs ever run at
    once, and at the end both pages show the same prompts: the store's."""
    store = tmp_path / "clip.zarr"
    shutil.copytree(made, store)
    (a, url_a), (b, url_b) = studio(store), studio(store)
    try:
        mine = {
            url_a: {"prompts": [POINT]},
            url_b: {"prompts": [{"object": 2, "frame": 8, "box": [10, 10, 50, 40]}]},
        }
        for url in (url_a, url_b):
            assert fetch(url + "api/prompts", "PUT", mine[url])[0] in (200, 409)
        answers = []

        def send(url, what):
            if what == "track":
                answers.append((url, what, fetch(url + "api/track", "POST", {})[0]))
            elif what == "look":  # the page reloads: it shows the store's prompts
                answers.append((url, what, fetch(url + "api/prompts")[0]))
            else:
                answers.append((url, what, fetch(url + "api/prompts", "PUT", mine[url])[0]))

        started = job = 0
        for n in range(10):
            what = ("look", "track", "save")[n % 3]  # both look, then both Track the same
            pair = [threading.Thread(target=send, args=(u, what)) for u in (url_a, url_b)]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            last = answers[-2:]
            codes = sorted(code for _, _, code in last)
            if what == "track":
                assert codes in ([202, 409], [409, 409]), last  # never two jobs
                job = codes.count(202)
                started += job
            if what == "save" and job:  # sent as the job runs: neither may change the prompts
                assert codes == [409, 409], last
            running = [
                json.loads(fetch(u + "api/progress")[1])["state"] == "running"
                for u in (url_a, url_b)
            ]
            assert sum(running) <= 1, running
            if what == "save":
                wait_idle(url_a, url_b)
        assert started >= 1, answers
        for url in (url_a, url_b):
            progress = json.loads(fetch(url + "api/progress")[1])
            assert "store in use" not in progress["message"], progress
        shown = [json.loads(fetch(u + "api/prompts")[1]) for u in (url_a, url_b)]
        assert shown[0] == shown[1], shown
        import segpipe.store.tracking as tracking
        from segpipe.store.runstore import RunStore

        opened = RunStore.open(store, read_only=True)
        draft = tracking.draft_prompts(opened)
        stored = draft if draft is not None else tracking.stored_prompts(opened)
        from segpipe import prompts as prompt_file

        assert shown[0]["prompts"] == prompt_file.to_file(stored)
    finally:
        for proc in (a, b):
            proc.terminate()
            proc.wait(30)


def wait_idle(*urls, timeout=120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        states = [json.loads(fetch(u + "api/progress")[1])["state"] for u in urls]
        if "running" not in states:
            return
        time.sleep(0.1)
    raise AssertionError("a studio job did not end")
