"""``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, served from a daemon thread with bounded
threads, connections and timeouts (:class:`MetricsServer`).

:class:`MetricsServer` serves a ``CollectorRegistry`` (the one :class:`PrometheusObserver`
writes); :func:`metrics_endpoint` builds both from ``[metrics]`` (docs/observability.md).
"""

from __future__ import annotations

import contextlib
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from streamfilter.engine.params import PrivacyParams

if TYPE_CHECKING:
    from streamfilter.config import Settings
from streamfilter.runtime.observe.prometheus import PrometheusObserver

log = logging.getLogger("streamfilter.metrics")

#: connections held open at once (idle ones included); past it the oldest is closed
MAX_OPEN_CONNECTIONS = 64
#: threads that answer complete requests (the selector thread reads every request's bytes)
WORKER_THREADS = 2
#: a request must arrive whole within this long after its connection opened
REQUEST_TIMEOUT_S = 5.0
#: a response must be written within this long (a reader that stops reading is dropped)
WRITE_TIMEOUT_S = 10.0
#: the longest request head accepted (a scrape's request line and headers are a few hundred)
MAX_REQUEST_BYTES = 8192


class _SendAll(io.BufferedIOBase):
    """The response stream: each write is one ``sendall`` (whole, or an error within the
    socket's timeout, which bounds the whole call)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)


class _Request:
    """A connection whose whole request head has arrived, with those bytes."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self.sock = sock
        self.head = head


class _Handler(BaseHTTPRequestHandler):
    """Answers one request already read by the selector loop (``HTTP/1.0``: then closes)."""

    request: _Request
    server: _Server  # type: ignore[assignment]

    def setup(self) -> None:
        self.connection = self.request.sock
        self.connection.settimeout(WRITE_TIMEOUT_S)
        self.rfile = io.BytesIO(self.request.head)
        self.wfile = _SendAll(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.close()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(HTTPStatus.OK, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n")
        elif path == "/readyz":
            ready, why = self.server.readiness()
            status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(status, f"{why}\n".encode())
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found: try /metrics, /healthz, /readyz\n")

    def _send(
        self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log: scrapes every few seconds would drown the daemon's own log


@dataclass
class _Server:
    """What a handler reads from its ``server``."""

    registry: CollectorRegistry
    readiness: Callable[[], tuple[bool, str]]


class _Pending:
    """A connection whose request head is still arriving."""

    __slots__ = ("deadline", "head")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.head = b""


class MetricsServer:
    """``/metrics`` (the registry), ``/healthz`` (200 while the process serves) and ``/readyz``
    (200 only when ``readiness()`` says so, else 503) over HTTP.

    Bounded whatever the clients do: one selector thread accepts connections and reads request
    heads (an idle connection costs a socket, not a thread), at most
    :data:`MAX_OPEN_CONNECTIONS` are held (a new one closes the oldest still waiting), a head
    must arrive within :data:`REQUEST_TIMEOUT_S` and fit :data:`MAX_REQUEST_BYTES`, and
    :data:`WORKER_THREADS` threads answer complete requests, each write bounded by
    :data:`WRITE_TIMEOUT_S`. So a scraper that sends its request gets its answer while any
    number of idle or slow connections come and go.

    ``port = 0`` binds a free port; :attr:`port` tells which. :meth:`start` raises ``OSError``
    when the address cannot be bound.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        readiness: Callable[[], tuple[bool, str]],
    ) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.readiness = readiness
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._workers: ThreadPoolExecutor | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.requested_port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._stopping.clear()
        self._workers = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="streamfilter-http")
        self._thread = threading.Thread(
            target=self._serve, args=(listener,), name="streamfilter-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def _serve(self, listener: socket.socket) -> None:
        pending: dict[socket.socket, _Pending] = {}  # insertion order: oldest first
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ)

            def drop(conn: socket.socket) -> None:
                pending.pop(conn, None)
                sel.unregister(conn)
                conn.close()

            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is listener:
                        self._accept(listener, sel, pending, drop)
                    else:
                        self._read(sock, pending, sel, drop)
                now = time.monotonic()
                for conn in [c for c, p in pending.items() if p.deadline <= now]:
                    drop(conn)
            for conn in list(pending):
                drop(conn)

    def _accept(
        self,
        listener: socket.socket,
        sel: selectors.BaseSelector,
        pending: dict[socket.socket, _Pending],
        drop: Callable[[socket.socket], None],
    ) -> None:
        for _ in range(MAX_OPEN_CONNECTIONS):  # what is waiting now, a bounded batch
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: leave the rest in the backlog
                log.warning("metrics: cannot accept a connection: %s", exc)
                return
            while len(pending) >= MAX_OPEN_CONNECTIONS:
                drop(next(iter(pending)))
            conn.setblocking(False)
            pending[conn] = _Pending(time.monotonic() + REQUEST_TIMEOUT_S)
            sel.register(conn, selectors.EVENT_READ)

    def _read(
        self,
        conn: socket.socket,
        pending: dict[socket.socket, _Pending],
        sel: selectors.BaseSelector,
        drop: Callable[[socket.socket], None],
    ) -> None:
        state = pending.get(conn)
        if state is None:
            return
        try:
            chunk = conn.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        state.head += chunk
        if not chunk or len(state.head) > MAX_REQUEST_BYTES:
            drop(conn)
            return
        if b"\r\n\r\n" not in state.head and b"\n\n" not in state.head:
            return
        pending.pop(conn)
        sel.unregister(conn)
        conn.setblocking(True)
        assert self._workers is not None
        self._workers.submit(self._answer, _Request(conn, state.head))

    def _answer(self, request: _Request) -> None:
        try:
            server = _Server(self.registry, self.readiness)
            _Handler(cast(Any, request), request.sock.getpeername(), cast(Any, server))
        except OSError:
            pass  # the client went away or stopped reading: nothing to answer
        finally:
            request.sock.close()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the metrics server is not started")
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        listener.close()
        if self._workers is not None:
            self._workers.shutdown(wait=True, cancel_futures=True)
            self._workers = None


@dataclass
class MetricsEndpoint:
    """The observer the daemon calls and the server that exports it. ``waiting`` (set while
    start-up waits for an unreachable broker or database) is what ``/readyz`` says until the
    daemon starts."""

    observer: PrometheusObserver
    server: MetricsServer
    registry: CollectorRegistry
    waiting: str | None = None

    def readiness(self) -> tuple[bool, str]:
        waiting = self.waiting
        if waiting is not None:
            return False, f"starting: {waiting}"
        return self.observer.readiness()

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


def metrics_endpoint(
    settings: Settings,
    params: PrivacyParams,
    *,
    registry: CollectorRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> MetricsEndpoint:
    """Observer + (not yet started) server for ``settings.metrics``, on a fresh registry unless
    one is given."""
    reg = registry if registry is not None else CollectorRegistry()
    m = settings.metrics
    observer = PrometheusObserver(
        reg,
        params,
        trusted_operator_metrics=m.trusted_operator_metrics,
        allowed_lateness_s=settings.window.allowed_lateness,
        telemetry_rho=settings.telemetry.rho,
        wall_clock=wall_clock,
        quotas=settings.analyst_quotas(params),
    )
    server = MetricsServer(reg, m.host, m.port, observer.readiness)
    endpoint = MetricsEndpoint(observer, server, reg)
    server.readiness = endpoint.readiness
    return endpoint
