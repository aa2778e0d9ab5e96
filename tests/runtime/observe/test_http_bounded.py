"""The metrics endpoint stays bounded whatever its clients do: idle connections cost no thread,
are capped and time out, and a scraper that sends its request is answered meanwhile."""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from streamfilter.engine.params import PrivacyParams
from streamfilter.runtime.observe import http
from streamfilter.runtime.observe.http import MetricsServer
from streamfilter.runtime.observe.prometheus import PrometheusObserver

PARAMS = PrivacyParams.create(b_norm=4.0, rho=0.5, granularity=2.0**-10)


def _closed_by_server(sock: socket.socket) -> bool:
    poller = select.poll()  # not select.select: descriptors past 1024
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


@pytest.mark.timeout(60)
def test_a_thousand_idle_connections_hold_no_threads_and_a_scrape_is_answered():
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS)
    server = MetricsServer(reg, "127.0.0.1", 0, obs.readiness)
    threads_before = threading.active_count()
    server.start()
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(0.5)  # let the server accept them all
        grown = threading.active_count() - threads_before
        assert grown <= 1 + http.WORKER_THREADS, grown  # the selector and the workers, no more
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
            assert resp.status == 200
            assert b"streamfilter_privacy_rho 0.5" in resp.read()
        assert threading.active_count() - threads_before <= 1 + http.WORKER_THREADS
        # the server holds at most its cap of them: it closed the oldest ones
        held = sum(not _closed_by_server(s) for s in idle)
        assert held <= http.MAX_OPEN_CONNECTIONS, held
        # and the rest once their request is overdue
        time.sleep(http.REQUEST_TIMEOUT_S + 0.5)
        assert not any(not _closed_by_server(s) for s in idle)
    finally:
        for s in idle:
            s.close()
        server.stop()
    assert threading.active_count() <= threads_before


@pytest.mark.timeout(30)
def test_an_oversized_or_slow_request_is_dropped_and_a_partial_one_waits():
    reg = CollectorRegistry()
    server = MetricsServer(reg, "127.0.0.1", 0, lambda: (True, "ready"))
    server.start()
    try:
        big = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (http.MAX_REQUEST_BYTES + 10))
        assert big.recv(100) == b""  # closed without an answer
        big.close()
        split = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        split.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.3)
        split.sendall(b"Host: x\r\n\r\n")
        answer = b""
        while chunk := split.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"ok\n")
        split.close()
    finally:
        server.stop()
