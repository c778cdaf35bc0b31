"""Slow clients against a real gateway on loopback: request headers have a deadline
(``server.header_timeout_s``), and the gateway keeps serving everyone else meanwhile."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.conftest import Gateway

HEADER_TIMEOUT_S = 2.0
#: Slack on the deadline: the timer, the loopback round trip and a busy CI machine.
SLACK_S = 1.5
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n\r\n"


@pytest.fixture(scope="module")
def gateway():
    gw = Gateway(f"server.header_timeout_s={HEADER_TIMEOUT_S}").wait_ready()
    yield gw
    gw.stop()


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def connect(gateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.settimeout(HEADER_TIMEOUT_S + 10)
    return sock


def test_a_client_sending_headers_a_byte_a_second_is_cut_off(gateway):
    sent: list[int] = []

    def trickle(sock: socket.socket) -> None:
        for byte in REQUEST:
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
            sent.append(byte)
            time.sleep(1.0)

    with connect(gateway) as sock:
        started = time.monotonic()
        threading.Thread(target=trickle, args=(sock,), daemon=True).start()
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 0.2 < elapsed < HEADER_TIMEOUT_S + SLACK_S
    assert len(sent) < len(REQUEST)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in head.lower() and b"application/problem+json" in head
    assert b"server.header_timeout_s=2 s" in body


def test_a_client_sending_nothing_is_cut_off(gateway):
    with connect(gateway) as sock:
        started = time.monotonic()
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 0.2 < elapsed < HEADER_TIMEOUT_S + SLACK_S
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_requests_are_served_while_slow_clients_hang(gateway):
    slow = [connect(gateway) for _ in range(20)]
    try:
        for sock in slow:
            sock.send(REQUEST[:10])
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            for _ in range(5):
                assert client.get("/healthz").status_code == 200
    finally:
        for sock in slow:
            sock.close()


def test_the_deadline_is_per_request_not_per_connection(gateway):
    """A keep-alive connection may live longer than the deadline: each request gets its own."""
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        ports = set()
        for _ in range(3):
            response = client.get("/healthz")
            assert response.status_code == 200
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
            time.sleep(HEADER_TIMEOUT_S * 0.75)
    assert len(ports) == 1  # one connection throughout, 3 x 1.5 s > the 2 s deadline


def test_a_complete_request_sent_slowly_within_the_deadline_is_answered(gateway):
    with connect(gateway) as sock:
        for part in (REQUEST[:20], REQUEST[20:40], REQUEST[40:]):
            sock.send(part)
            time.sleep(HEADER_TIMEOUT_S / 4)
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200 ")


def test_a_request_stalled_behind_an_answered_one_is_cut_off(gateway):
    with connect(gateway) as sock:
        sock.send(REQUEST + REQUEST[:10])  # pipelined: a whole request, then the start of the next
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.count(b"HTTP/1.1 408 ") == 1
