import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data"))
sys.path.insert(0, str(ROOT / "tests"))

import make_sample  # noqa: E402

from segpipe.store.ledger import DONE_RECORD  # noqa: E402

IMAGE_SIZE = 64  # SAM 2 at 64: every property tested holds at any size, and 64 is cheap
SEED = 0

# The tests' files (stores, videos, exports) go to a RAM disk where one has room: a store
# fsyncs every chunk and folder it commits, and on a virtual disk those waits are a large
# part of a test's time (one: 63 s there, 15 s on tmpfs, whose fsync returns at once). Every
# call is the same (writes, renames, fsyncs, kills); only power loss, which no test can cut,
# would tell the two apart. The folder goes when the run passes; a failed run's stays for a
# look until the next run (its process gone) removes it. SEGPIPE_TEST_DISK=1 keeps pytest's
# own temporary folder.
TMPFS, TMPFS_ROOM, TMPFS_PREFIX = Path("/dev/shm"), 8 * 2**30, "segpipe-tests-"


def pytest_configure(config):
    if hasattr(config, "workerinput") or config.option.basetemp is not None:
        return  # an xdist worker takes the controller's folder (a subfolder of it)
    if os.environ.get("SEGPIPE_TEST_DISK") or not TMPFS.is_dir():
        return
    import shutil
    import tempfile

    for old in TMPFS.glob(f"{TMPFS_PREFIX}*-*"):  # left by runs that failed or were killed
        pid = old.name[len(TMPFS_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    if shutil.disk_usage(TMPFS).free >= TMPFS_ROOM:
        folder = tempfile.mkdtemp(prefix=f"{TMPFS_PREFIX}{os.getpid()}-", dir=TMPFS)
        config.option.basetemp = config._segpipe_tmpfs = folder


def pytest_sessionfinish(session, exitstatus):
    folder = getattr(session.config, "_segpipe_tmpfs", None)
    if folder is not None and exitstatus == 0:  # it holds RAM
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


_forkcli = []  # this process's forking server (forkcli.py), made on first use
_ENVIRONMENT = dict(os.environ)  # the test process's, before any test changed it


def forkcli_server():
    """This process's `forkcli.Server` (commands forked from a process that has imported
    them), if it runs commands as a new process would: the environment is the one it
    started with. None under SEGPIPE_TEST_NO_FORK=1 (every command a new interpreter)."""
    if os.environ.get("SEGPIPE_TEST_NO_FORK"):
        return None
    if not _forkcli:
        import atexit
        import tempfile

        import forkcli

        folder = tempfile.mkdtemp(prefix="segpipe-forkcli-")
        _forkcli.append(forkcli.Server(folder, _ENVIRONMENT, ("sam2.1_hiera_t", IMAGE_SIZE, 0)))
        atexit.register(_forkcli[0].close)
    return _forkcli[0] if _forkcli[0].usable() else None


def shell_env() -> dict:
    """The environment of a shell in which `segpipe` is the command a user has: the
    installed one, forked by `forkcli_server()` where it may be."""
    path = [str(Path(sys.executable).parent), os.environ["PATH"]]
    server = forkcli_server()
    if server is not None:
        path.insert(0, server.shim())
    return {**os.environ, "PATH": os.pathsep.join(path)}


def segpipe(*args, check=False, env=None, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a new process: a fork of a process that has imported it
    (`forkcli_server`), or a new interpreter (with `env`, or where the server may not)."""
    argv = [*map(str, args)]
    server = forkcli_server() if env is None and not set(kw) - {"timeout"} else None
    if server is not None:
        proc = server.run(argv, cwd=ROOT, **kw)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "segpipe.cli", *argv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            **kw,
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"segpipe {' '.join(argv)} failed:\n{proc.stderr}")
    return proc


def spawn(argv, code=None, stdout=None, stderr=None):
    """`subprocess.Popen([python, -m, segpipe.cli, *argv])` (with `code`: `[python, -c, code,
    *argv]`) in segpipe's folder, text mode, stdin empty, stdout and stderr each PIPE, DEVNULL
    or None; forked by `forkcli_server` where it may."""
    argv = [*map(str, argv)]
    server = forkcli_server()
    if server is not None:
        return server.spawn(argv, ROOT, code, stdout, stderr)
    head = ["-c", code] if code is not None else ["-m", "segpipe.cli"]
    return subprocess.Popen(
        [sys.executable, *head, *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )


def run_code(code: str, *args, timeout=None) -> subprocess.CompletedProcess:
    """`python -c <code> <args>` in segpipe's folder, its output captured (text); forked by
    `forkcli_server` where it may."""
    argv = [*map(str, args)]
    server = forkcli_server()
    if server is not None:
        return server.run(argv, ROOT, timeout, code=code)
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def popen_segpipe(*args):
    """Start the real CLI (as `segpipe` does), its output discarded."""
    return spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tree_digest(path: Path) -> dict:
    """Every file under `path` with its content hash: equal digests mean nothing changed."""
    path = Path(path)
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def tree_mtimes(path: Path) -> dict:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in sorted(Path(path).rglob("*"))}


def assert_user_error(proc, *words):
    """One-line message naming the problem, non-zero exit, no traceback."""
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])


def require_root(reason: str) -> None:
    """Skip a test that needs root where it runs without; in CI (`.ci/run` sets SEGPIPE_CI,
    and runs as root) fail instead: there every test must run."""
    if os.geteuid() != 0:
        (pytest.fail if os.environ.get("SEGPIPE_CI") else pytest.skip)(f"{reason} needs root")


def wait_for(predicate, proc, timeout=120.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def freeze(proc) -> None:
    """SIGSTOP `proc` and return once every thread of it has stopped: kill() returns before a
    thread running on another core has taken the signal, so a write it has begun (a rename,
    a ledger record) could still land after a bare SIGSTOP. A process that has ended is left
    as it is (as `send_signal` leaves it)."""
    import signal
    import time

    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            states = [
                (t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()
            ]
        except (FileNotFoundError, ProcessLookupError):  # a thread ended while listed
            if not tasks.exists():
                return  # the process ended
            states = ["R"]
        if all(s in {"T", "t", "Z", "X"} for s in states):
            return
        time.sleep(0.001)
    proc.kill()
    raise AssertionError(f"process {proc.pid} did not stop within 30 s of SIGSTOP")


def ledger_records(store: Path, stage: str) -> dict[int, float]:
    """Chunk -> commit time (its record file's mtime) of the chunks `stage` has recorded,
    read from the files; a tracking pass's (one ledger per object, `ledger/<stage>/<slot>`):
    the chunks every object of the store's tracking has recorded, at the last object's time. (A record a kill
    interrupted is a temporary file, not counted; nor is a record undone.)"""
    folder = Path(store) / "ledger" / stage

    def records(chunks: Path) -> dict[int, float]:
        if not chunks.is_dir():
            return {}
        return {
            int(p.name): p.stat().st_mtime
            for p in chunks.iterdir()
            if p.name.isdigit() and p.read_bytes() == DONE_RECORD  # (undone: a record of 0)
        }

    if stage not in ("track_forward", "track_reverse"):
        return records(folder / "c")
    try:
        attrs = json.loads((Path(store) / "zarr.json").read_text())["attributes"]
    except (OSError, ValueError):  # no store yet (or its metadata mid-write): nothing done
        return {}
    objects = len((attrs.get("track") or {}).get("object_ids", ()))
    if not objects:
        return {}
    each = [records(folder / str(s) / "c") for s in range(objects)]
    common = set(each[0]).intersection(*each[1:])
    return {k: max(r[k] for r in each) for k in sorted(common)}


def ledger_count(store: Path, stage: str) -> int:
    return len(ledger_records(store, stage))


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory) -> Path:
    """A 40-frame H.264 clip with three objects, prompted on frames 9, 14 and 20."""
    out = tmp_path_factory.mktemp("clip")
    frames, masks = make_sample.make_clip(num_frames=40, width=160, height=120)
    make_sample.write_video(out / "clip.mp4", frames)
    make_sample.write_prompts(out, masks, frames=(9, 14, 20))
    np.save(out / "masks.npy", masks)
    return out


@pytest.fixture(scope="session")
def small(tmp_path_factory) -> Path:
    """A 24-frame clip for whole runs at `IMAGE_SIZE` in chunks of 4 (`run_args`), prompted
    on frames 5, 8 and 11."""
    root = tmp_path_factory.mktemp("small")
    frames, masks = make_sample.make_clip(num_frames=24, width=96, height=72, seed=1)
    make_sample.write_video(root / "clip.mp4", frames)
    make_sample.write_prompts(root, masks, frames=(5, 8, 11))
    return root


def run_args(small: Path, store: Path) -> tuple:
    return (
        "run",
        small / "clip.mp4",
        "--store",
        store,
        "--prompts",
        small / "prompts.json",
        "--chunk-size",
        4,
        "--image-size",
        IMAGE_SIZE,
        "--random-weights",
        0,
    )


def run_in_process(small: Path, store: Path, video: Path | None = None, **options):
    """`segpipe run` with `run_args` (and `--quiet`) in this process: `segpipe.run`, the call
    the command makes, with the same options; for reference stores and reruns (the commands
    a test is about stay commands). `video`: another video than the small clip; `options`:
    more settings, by the names the command line and `segpipe.settings` give them."""
    import segpipe as api
    from segpipe.settings import from_options

    settings = dict(chunk_size=4, image_size=IMAGE_SIZE, random_weights=0, progress=False)
    video = small / "clip.mp4" if video is None else video
    return api.run(video, store, small / "prompts.json", **from_options({**settings, **options}))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """Seeded random sam2.1_hiera_t weights saved as an official-style checkpoint file."""
    import torch

    from segpipe.model import Weights, build_model

    path = tmp_path_factory.mktemp("ckpt") / "random_sam2.1_hiera_t.pt"
    predictor = build_model("sam2.1_hiera_t", IMAGE_SIZE, Weights(random_seed=SEED))
    torch.save({"model": predictor.state_dict()}, path)
    return path


@pytest.fixture(scope="session")
def predictor():
    from segpipe.model import Weights, build_model

    return build_model("sam2.1_hiera_t", IMAGE_SIZE, Weights(random_seed=SEED))


class EncoderCalls:
    """Counts image-encoder forward calls on a predictor (the real model, observed)."""

    def __init__(self, predictor):
        self.count = 0
        self.handle = predictor.image_encoder.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def close(self):
        self.handle.remove()


# The files that take longest (measured: `make test PYTEST_ARGS=--durations=0`), first: `make
# test` hands whole files to its two workers in this order (`--dist loadfile
# --no-loadscope-reorder`), so the longest do not start last and leave one core idle.
LONGEST_FIRST = [
    "test_dask.py",
    "test_track.py",
    "test_first_minutes.py",
    "test_fault_matrix.py",
    "test_groups.py",
    "test_studio.py",
    "test_retention.py",
    "test_faults.py",
    "test_dataset.py",
    "test_dask_bits.py",
    "test_resume.py",
    "test_estimate.py",
    "test_sources.py",
    "test_precision.py",
    "test_untracked.py",
    "test_export.py",
]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable


def pytest_addoption(parser):
    parser.addoption(
        "--fault-kills",
        type=int,
        default=6,
        help="SIGKILLs the fault-injection test spreads over one pipeline run",
    )
    parser.addoption("--fault-seed", type=int, default=0, help="seed of the kill moments")
    parser.addoption("--fuzz-cases", type=int, default=12, help="hostile videos to try")


def store_arrays(store: Path) -> dict:
    """Every array of a store (values) and every attribute, for whole-store comparison."""
    import zarr

    group = zarr.open_group(str(store), mode="r")
    out = {}

    def walk(g, prefix=""):
        for name, node in g.members():
            path = f"{prefix}{name}"
            if isinstance(node, zarr.Group):
                walk(node, path + "/")
            else:
                out[path] = (node[...], dict(node.attrs))

    walk(group)
    return out


def chunk_files(store: Path, names) -> set[str]:
    """The chunk files of the arrays `names`, as paths relative to the store
    (`masks/c/3/0/0/0`): zarr reads a missing chunk as fill, so values alone cannot tell.
    zarr's temporary `*.partial` files (a kill during a write leaves one) are no chunks."""
    store = Path(store)
    return {
        str(f.relative_to(store))
        for name in names
        for f in (store / name / "c").rglob("*")
        if f.is_file() and f.suffix != ".partial"
    }


def read_checked(store: Path, name: str) -> np.ndarray:
    """A whole array as the pipeline reads it back: a missing or corrupt chunk file raises
    (`RunStore.read`) instead of reading as fill."""
    from segpipe.store.runstore import RunStore

    return RunStore.open(store).read(name)


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and values; floats compared bit for bit (NaN payloads, -0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        bits = np.dtype(f"u{a.dtype.itemsize}")
        return np.array_equal(
            np.ascontiguousarray(a).view(bits), np.ascontiguousarray(b).view(bits)
        )
    return np.array_equal(a, b)


def assert_same_store(a: Path, b: Path, skip=(), skip_attrs=()):
    """Identical arrays (values bit for bit, and the same chunk files), array attributes and
    group attributes; paths inside attributes compared relative to the store.
    `skip`: array name prefixes left out; `skip_attrs`: group attributes left out."""
    import zarr

    xa, xb = store_arrays(a), store_arrays(b)
    names = sorted(k for k in xa if not k.startswith(skip or "\0"))
    assert names == sorted(k for k in xb if not k.startswith(skip or "\0"))
    for name in names:
        (va, aa), (vb, ab) = xa[name], xb[name]
        assert va.dtype == vb.dtype and va.shape == vb.shape, name
        assert same_values(va, vb), name
        assert aa == ab, name
    fa, fb = chunk_files(a, names), chunk_files(b, names)
    assert fa == fb, f"chunk files only in {a}: {sorted(fa - fb)}; only in {b}: {sorted(fb - fa)}"
    ga = {k: v for k, v in zarr.open_group(str(a), mode="r").attrs.items() if k not in skip_attrs}
    gb = {k: v for k, v in zarr.open_group(str(b), mode="r").attrs.items() if k not in skip_attrs}
    # (in any order: a run that decodes alongside its tracking records the frame count last)
    text_a = json.dumps(ga, sort_keys=True).replace(str(Path(a).parent), "<dir>")
    text_b = json.dumps(gb, sort_keys=True).replace(str(Path(b).parent), "<dir>")
    assert text_a == text_b
