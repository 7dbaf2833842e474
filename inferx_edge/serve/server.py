"""Running the server: bind safely, load the repository, serve with uvicorn, and on SIGTERM/SIGINT stop
accepting, answer every accepted request, unload, and return.

Shutdown order: readiness turns 503 (load balancers stop sending), uvicorn closes the listening socket
and waits for in-flight HTTP requests (their batches still run: the batchers stop only after uvicorn
has finished), then every model version drains and unloads.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

from inferx_edge.errors import UsageError
from inferx_edge.serve.app import AppState, is_loopback, make_app
from inferx_edge.serve.metrics import ServerMetrics
from inferx_edge.serve.repository import Repository, ServeOptions, discover


class DecisionLog:
    """Every governor decision as a JSON line in ``path`` (when given); switches, reloads and failed
    reloads also as one short line on stderr."""

    def __init__(self, path: Path | None, stream=sys.stderr) -> None:
        self.path = path
        self.stream = stream
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - closed in close()

    def __call__(self, d: dict) -> None:
        with self._lock:
            if self._file:
                self._file.write(json.dumps(d, default=str) + "\n")
            if "event" in d:
                print(f"[serve] {d['model']}: {d['event']} {d.get('version') or d.get('error', '')}", file=self.stream)
            elif d.get("from") != d.get("choice"):
                print(f"[governor] {d['model']}: {d['from']} -> {d['choice']} ({d['reason']})", file=self.stream)

    def close(self) -> None:
        if self._file:
            self._file.close()


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --auth-token-file {path}: {exc.strerror}") from exc
    if len(token) < 16 or any(c.isspace() for c in token):
        raise UsageError(f"--auth-token-file {path} must hold one token of at least 16 characters without spaces")
    return token


def listen(host: str, port: int, auth_token: str | None, insecure_bind: bool) -> socket.socket:
    """The server's socket, refusing a non-loopback bind without a token unless told (``--insecure-bind``)."""
    if not is_loopback(host) and not auth_token and not insecure_bind:
        raise UsageError(
            f"binding {host} exposes the server beyond this machine: pass --auth-token-file FILE "
            "(clients send Authorization: Bearer TOKEN), or --insecure-bind to serve without authentication"
        )
    if not is_loopback(host) and not auth_token:
        print(f"warning: serving on {host} without authentication (--insecure-bind)", file=sys.stderr)
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    # accepted sockets inherit it: a response's header and body writes must not wait on Nagle
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Server:
    """The server on one socket. ``run()`` blocks until SIGTERM/SIGINT (or :meth:`stop`), then drains."""

    def __init__(
        self,
        paths: list[Path],
        options: ServeOptions,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        auth_token: str | None = None,
        insecure_bind: bool = False,
        max_request_bytes: int = 256 << 20,
        reload_interval_s: float = 2.0,
        decision_log: Path | None = None,
        shared_memory: bool = False,
        progress=print,
    ) -> None:
        self.sock = listen(host, port, auth_token, insecure_bind)
        self.log = DecisionLog(decision_log)
        self.metrics = ServerMetrics()
        sources = discover(paths)
        progress(f"loading {len(sources)} model(s): {', '.join(sorted(sources))} (probing every variant)")
        try:
            self.repository = Repository(sources, options, self.metrics, self.log)
        except BaseException:
            self.sock.close()
            raise
        from inferx_edge.serve.shm import SharedMemoryRegistry

        self.state = AppState(
            self.repository, self.metrics, max_request_bytes, shm=SharedMemoryRegistry() if shared_memory else None
        )
        self.app = make_app(self.state, auth_token)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.reload_interval_s = reload_interval_s
        self.options = options
        self._uvicorn = None
        self.started = threading.Event()
        for m in self.repository.models.values():
            points = ", ".join(m.governor.points)
            progress(
                f"  {m.name} version {m.version}: {', '.join(s.label for s in m.slots)}; operating points {points}"
            )

    def run(self) -> bool:
        """Serve until told to stop; True when every accepted request was answered."""
        import uvicorn

        state = self.state

        class _Uvicorn(uvicorn.Server):
            def handle_exit(self, sig, frame):  # a signal drains and returns (no re-raise after shutdown)
                state.draining = True
                if self.should_exit and sig == 2:
                    self.force_exit = True
                self.should_exit = True

            async def startup(self, sockets=None):
                await super().startup(sockets)
                outer.started.set()

        outer = self
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            limit_concurrency=self.options.batch.max_queue_size * 2 + 64,
            timeout_graceful_shutdown=int(self.options.batch.timeout_s) + 5,
            timeout_keep_alive=30,
        )
        self._uvicorn = _Uvicorn(config)
        self.repository.watch(self.reload_interval_s)
        # The event loop, the batcher and the workers share the GIL: at the default 5 ms switch interval
        # a request waits up to 5 ms at each hand-over between them (tens of ms at the tail).
        previous = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        try:
            self._uvicorn.run(sockets=[self.sock])
        finally:
            state.draining = True
            ok = self.repository.close(self.options.batch.timeout_s + 5)
            if state.shm is not None:
                state.shm.close()
            self.log.close()
            sys.setswitchinterval(previous)
        return ok

    def stop(self) -> None:
        """Begin a graceful shutdown (as SIGTERM does)."""
        self.state.draining = True
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
