"""segpipe's command line in a fresh process without its imports' cost: a process that has
imported what a command imports (torch, SAM 2, segpipe: about 3 s of a core, half of what
a small test run costs) forks a child for each command, and the child runs
`segpipe.cli.main()` with the test's arguments, folder, environment and output files, then
exits as `python -m segpipe.cli` does (atexit handlers, flushed files, a traceback on an
uncaught exception). The child is a real process: its own memory, locks, signals and exit.

What a fork cannot give is a different start: a command run with an environment other than
the one this server started with (another thread count, another cache) runs as a new
interpreter instead (`conftest.segpipe` decides), and the server refuses to start where
importing wrote anything (a warning at import would be hidden from the tests' stderr).

Run as `python forkcli.py SOCKET [MODEL SIZE SEED]` by `Server`; one server per test
process, one command at a time (a test process runs one test at a time). With a model, the
server builds that predictor once (segpipe keeps a thread's predictors:
`model.shared_predictor`), and the commands that use it find it built.
"""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys

PRELOAD = (  # what a command imports (not Dask: runs without it must not import it)
    "torch",
    "av",
    "zarr",
    "numcodecs",
    "PIL.Image",
    "sam2.build_sam",
    "sam2.sam2_video_predictor",
    "segpipe.cli",
    "segpipe.api",
    "segpipe.model",
    "segpipe.stages.decode",
    "segpipe.stages.encode",
    "segpipe.stages.track",
    "segpipe.stages.export",
)


def _send(conn: socket.socket, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    conn.sendmsg([len(data).to_bytes(4, "big") + data], ancillary)


def _exactly(conn: socket.socket, n: int, head: bytes = b"") -> bytes:
    data = head
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise EOFError
        data += more
    return data


def _recv(conn: socket.socket, nfds: int = 0):
    """One message (and the files sent with it), read to its end and no further: the next
    may have come already."""
    head, anc, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(nfds * 4) if nfds else 0)
    if not head:
        raise EOFError
    size = int.from_bytes(_exactly(conn, 4, head), "big")
    data = _exactly(conn, size)
    fds = array.array("i")
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _serve(path: str) -> dict:
    """Accept commands until an empty one comes; returns only in a forked child, with its
    command. Each command gets a watcher process (a fork) that forks the command, says its
    pid, waits for it and says how it ended, so the server takes the next at once."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # watchers that ended
                pass
        except ChildProcessError:
            pass
        try:
            request, fds = _recv(conn, 3)
        except EOFError:
            conn.close()
            return {}
        sys.stdout.flush()
        sys.stderr.flush()
        if _settled(request["env"]) != STARTED_WITH:  # it would start otherwise
            _send(conn, {"refused": "another environment"})
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if os.fork() == 0:  # the watcher
            server.close()
            pid = os.fork()
            if pid == 0:  # the command
                conn.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            try:
                _send(conn, {"pid": pid})
                _watch(conn, pid)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()


def _watch(conn: socket.socket, pid: int) -> None:
    """Wait for the command to end and say how; kill it if the caller goes first (a test
    process that died, a shim killed): nothing runs on that nobody waits for."""
    import select

    try:
        done = os.pidfd_open(pid)
    except (AttributeError, OSError):  # (Linux before 5.3: the command is waited for only)
        done = None
    if done is not None:
        try:
            while True:
                ready, _, _ = select.select([done, conn], [], [])
                if done in ready:
                    break
                if not conn.recv(1, socket.MSG_PEEK):  # the caller closed its end
                    os.kill(pid, 9)
                    break
        finally:
            os.close(done)
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, {"status": status})
    except OSError:
        pass


# What may differ from the server's environment, and is passed on: what changes as the tests
# go and no import reads. Pytest's name of the test running; what a shell sets for a command
# it runs (PATH, PWD, SHLVL, "_": the command's path); what Dask leaves in the environment of
# a process that started a LocalCluster (for its workers: one thread for BLAS, which torch's
# one thread here already is, a hash seed, a malloc setting, its pid).
PASSED_ON = ("PYTEST_CURRENT_TEST", "PATH", "PWD", "OLDPWD", "SHLVL", "_")
PASSED_ON += ("__DASK_PARENT_PID", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
PASSED_ON += ("MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED")


def _settled(env) -> dict:
    """The environment but for `PASSED_ON` (which the command gets as it was sent)."""
    return {k: v for k, v in env.items() if k not in PASSED_ON}


class Refused(Exception):
    """The server does not run a command with another environment than its own."""


class Forked:
    """A command running in a forked child: `subprocess.Popen`'s pid, poll, wait,
    send_signal, terminate, kill and returncode."""

    def __init__(self, path: str, request: dict, fds: list[int]):
        self.args, self.returncode = request["argv"], None
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(path)
        _send(self.conn, request, fds)
        answer = _recv(self.conn)[0]
        if "refused" in answer:
            self.conn.close()
            raise Refused(answer["refused"])
        self.pid = answer["pid"]

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            import select

            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            status = _recv(self.conn)[0]["status"]
            self.conn.close()
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        """Read what `stdout` and `stderr` (pipes `spawn` made) hold to their end, wait."""
        import threading

        found, readers = {}, []
        for name in ("stdout", "stderr"):
            f = getattr(self, name, None)
            if f is not None:
                t = threading.Thread(target=lambda n=name, f=f: found.update({n: f.read()}))
                t.daemon = True
                t.start()
                readers.append(t)
        self.wait(timeout)
        for t in readers:
            t.join(timeout)
        for name in ("stdout", "stderr"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        return found.get("stdout"), found.get("stderr")

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (as Popen: not to a process that has ended)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended since, its end not yet told
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


class Server:
    """The forking server of one test process, started on first use with that process's
    environment."""

    def __init__(self, folder: str, env: dict, warm: tuple[str, int, int] | None = None):
        self.folder, self.path = folder, os.path.join(folder, "forkcli.sock")
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path, *map(str, warm or ())],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if line != "ready\n":
            err = self.proc.stderr.read()
            self.proc.kill()
            raise RuntimeError(f"forkcli did not start: {line!r} {err[-2000:]}")

    def usable(self, env: dict | None = None) -> bool:
        env = os.environ if env is None else env
        return self.proc.poll() is None and _settled(env) == _settled(self.env)

    def popen(self, argv: list[str], cwd: str, fds: list[int], code: str | None = None):
        """`segpipe <argv>` (with `code`: `python -c <code> <argv>`) in a forked child with
        the files `fds` as its stdin, stdout and stderr."""
        request = {"argv": [*map(str, argv)], "cwd": str(cwd), "env": dict(os.environ)}
        if code is not None:
            request["code"] = code
        return Forked(self.path, request, fds)

    def spawn(self, argv, cwd, code=None, stdout=None, stderr=None, text=True):
        """`subprocess.Popen` of `segpipe <argv>` (with `code`: `python -c <code> <argv>`):
        stdin empty; stdout and stderr each `subprocess.PIPE`, `subprocess.DEVNULL` or None
        (this process's)."""
        mine, theirs = {}, []
        with open(os.devnull, "rb") as nothing_in, open(os.devnull, "wb") as nothing_out:
            fds = [nothing_in.fileno()]
            for n, how in ((1, stdout), (2, stderr)):
                if how == subprocess.PIPE:
                    r, w = os.pipe()
                    mine[n] = open(r, "r" if text else "rb")
                    theirs.append(w)
                    fds.append(w)
                else:
                    fds.append(nothing_out.fileno() if how == subprocess.DEVNULL else n)
            try:
                proc = self.popen(argv, cwd, fds, code)
            finally:
                for w in theirs:
                    os.close(w)
        proc.stdout, proc.stderr = mine.get(1), mine.get(2)
        return proc

    def run(self, argv: list[str], cwd: str, timeout: float | None = None, code=None):
        """`subprocess.run([python, -m, segpipe.cli, *argv], capture_output=True, text=True)`
        (with `code`: `[python, -c, code, *argv]`) in a forked child; its output as written
        (a carriage return stays one)."""
        proc = self.spawn(argv, cwd, code, subprocess.PIPE, subprocess.PIPE, text=False)
        try:
            out, err = proc.communicate(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out, err = (b.decode(errors="replace") for b in (out, err))
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def shim(self) -> str:
        """A folder holding a `segpipe` command that runs here (for a shell's PATH)."""
        folder = os.path.join(self.folder, "bin")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "segpipe")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec {sys.executable} {__file__} --client {self.path} "$@"\n')
        os.chmod(path, 0o755)
        return folder

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.connect(self.path)  # an empty request: the server ends
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _client(path: str, argv: list[str]) -> None:
    """The shim's side: this process's files, folder and environment to a forked command;
    the signals it gets passed on; its exit is the command's."""
    import signal

    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        proc = Forked(path, request, [0, 1, 2])
    except (Refused, OSError):  # another environment, or no server: as `segpipe` would
        os.execv(sys.executable, [sys.executable, "-m", "segpipe.cli", *argv])

    def forward(sig, _):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__" and sys.argv[1] == "--client":
    _client(sys.argv[2], sys.argv[3:])
elif __name__ == "__main__":
    import importlib

    STARTED_WITH = _settled(os.environ)
    import io

    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = said = io.StringIO()
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout, sys.stderr = real_out, real_err
    if said.getvalue():
        sys.exit(f"importing wrote: {said.getvalue()[:500]}")
    import torch

    # the predictor most commands build, kept (`shared_predictor`) for every child; not where
    # building would start OpenMP's threads or CUDA, which a forked child cannot use
    if len(sys.argv) > 2 and torch.get_num_threads() == 1 and not torch.cuda.is_available():
        from segpipe.model import Weights, shared_predictor

        state = torch.random.get_rng_state()  # put back: nothing reads it, but as it was
        name, size, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        shared_predictor(name, size, Weights(random_seed=seed), "cpu")
        torch.random.set_rng_state(state)
    import gc

    gc.freeze()  # what the imports made stays put: a child's collections pass it by (and
    # do not write to its pages, which the children share with this process)
    request = _serve(sys.argv[1])
    if not request:
        sys.exit(0)
    sys.path[0] = request["cwd"]  # not this file's folder: `python -m` puts its folder first
    os.chdir(request["cwd"])
    for name in PASSED_ON:  # the rest is this process's: the same, or no fork
        if name in request["env"]:
            os.environ[name] = request["env"][name]
        else:
            os.environ.pop(name, None)
    code = 0
    try:
        if "code" in request:  # python -c
            sys.argv = ["-c", *request["argv"]]
            sys.path[0] = ""
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        else:  # python -m segpipe.cli
            sys.argv = ["segpipe", *request["argv"]]
            from segpipe.cli import main

            main()
    except SystemExit as end:  # as the interpreter reads it
        code = end.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    # the interpreter's exit (its exit functions, a collection of what is left, flushed
    # files) but for tearing down every module torch and SAM 2 loaded: a second of a core,
    # after the command has ended
    import atexit
    import threading

    threading._shutdown()  # (joins the threads that are not daemons, as an exit does)
    atexit._run_exitfuncs()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
