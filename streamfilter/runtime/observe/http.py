"""``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, served from a daemon thread.

:class:`MetricsServer` serves a ``CollectorRegistry`` (the one :class:`PrometheusObserver`
writes); :func:`metrics_endpoint` builds both from ``[metrics]`` (docs/observability.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from streamfilter.engine.params import PrivacyParams

if TYPE_CHECKING:
    from streamfilter.config import Settings
from streamfilter.runtime.observe.prometheus import PrometheusObserver

log = logging.getLogger("streamfilter.metrics")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    readiness: Callable[[], tuple[bool, str]]


class MetricsServer:
    """``/metrics`` (the registry), ``/healthz`` (200 while the process serves) and ``/readyz``
    (200 only when ``readiness()`` says so, else 503) on a stdlib HTTP server in a daemon thread.

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
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        server_cls: type[_Server] = _Server
        if ":" in self.host:  # an IPv6 literal such as "::"
            import socket

            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        server = server_cls((self.host, self.requested_port), _Handler)
        server.registry = self.registry
        server.readiness = self.readiness
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="streamfilter-metrics",
            daemon=True,
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the metrics server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


@dataclass
class MetricsEndpoint:
    """The observer the daemon calls and the server that exports it."""

    observer: PrometheusObserver
    server: MetricsServer
    registry: CollectorRegistry

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
    )
    server = MetricsServer(reg, m.host, m.port, observer.readiness)
    return MetricsEndpoint(observer, server, reg)
