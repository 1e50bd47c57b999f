"""The studio served on uvicorn: bound first (so the URL printed is the one that answers),
then run in the foreground (`segpipe studio`) or in a thread (`StudioServer.start`)."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import signal
import socket
import threading

import uvicorn

from segpipe import log
from segpipe.errors import BadInput
from segpipe.settings import Encoding, Execution


def reachable(host: str, family: int) -> str:
    """An address a browser can open for `host`: itself, or for a wildcard (0.0.0.0, ::,
    every interface) this machine's address on its default route (a UDP socket's, connected
    without sending anything), else its host name."""
    try:
        if not ipaddress.ip_address(host).is_unspecified:
            return host
    except ValueError:  # a name
        return host
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect(("2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1", 9))
        return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()
    finally:
        probe.close()


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StudioServer:
    """The studio of `store` bound to host:port (0: a free port). A host other than
    loopback gets a token: the URL carries it, and a request without it gets 401.
    `encoding`, `execution`: `Studio`'s (the model a store not yet encoded gets; where Track
    computes); `source`: the video a store not yet decoded is decoded from (`Studio`)."""

    def __init__(
        self,
        store,
        host="127.0.0.1",
        port=8765,
        encoding: Encoding = Encoding(),
        execution: Execution = Execution(),
        source: tuple | None = None,
    ):
        from segpipe.web.app import make_app
        from segpipe.web.session import Studio

        self.studio = Studio(store, encoding, execution, source)
        self.token = None if loopback(host) else secrets.token_urlsafe(16)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(128)  # connections wait from now on, before uvicorn serves
        except OSError as e:
            self.socket.close()
            raise BadInput(f"cannot listen on {host}:{port}: {e.strerror}") from None
        self.studio.begin()  # a store not yet decoded: decoding, now that the URL will answer
        bound = self.socket.getsockname()[1]
        shown = reachable(host, family)
        shown = f"[{shown}]" if ":" in shown else shown
        self.url = f"http://{shown}:{bound}/" + (f"?token={self.token}" if self.token else "")
        config = uvicorn.Config(
            make_app(self.studio, self.token, lambda: self.server.should_exit),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = _Server(config)
        self.thread = None

    def run(self) -> None:
        """Serve until Ctrl-C (or SIGTERM); a tracking or export under way then stops as one
        Ctrl-C stops it: after the chunk in flight (a second signal stops at once)."""
        self.server.run(sockets=[self.socket])
        if self.studio.job.running():
            log.info("studio: stopping after the chunk in flight (Ctrl-C again: at once)")
            self.studio.cancel()
            self.studio.job.thread.join()

    def start(self) -> "StudioServer":
        """Serve in a background thread (returns once it answers)."""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the studio's server did not start")
            threading.Event().wait(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)
        self.studio.cancel()
        if self.studio.job.thread is not None:
            self.studio.job.thread.join()


class _Server(uvicorn.Server):
    """uvicorn's server, but a Ctrl-C stops it and nothing more: uvicorn raises the signal
    again once it has stopped, which would end the process (exit 130) before the studio's
    own work is left in order."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        before = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)


def serve(
    store,
    host="127.0.0.1",
    port=8765,
    encoding: Encoding = Encoding(),
    execution: Execution = Execution(),
    open_page=False,
    source=None,
):
    server = StudioServer(store, host, port, encoding, execution, source)
    log.result(f"studio: {server.url}")
    if server.studio.read_only:
        log.warn(server.studio.read_only)
    if open_page:
        import webbrowser

        webbrowser.open(server.url)
    server.run()
