"""Slow and malformed clients against a real gateway on loopback: request headers have a deadline
(``server.header_timeout_s``) and a size limit (``server.max_header_kb``), a request httptools
cannot parse is a 400 problem, and the gateway keeps serving everyone else meanwhile."""

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
    gw = Gateway(f"server.header_timeout_s={HEADER_TIMEOUT_S}", "server.max_header_kb=8").wait_ready()
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
            # 0.8 s apart, the deadline (2 s) falls between two bytes: a byte arriving as the
            # server closes makes the kernel reset the connection, losing the 408 on its way
            time.sleep(0.8)

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


def answer_to(gateway, raw: bytes) -> tuple[int, str, bytes]:
    """Status, content type and body of the gateway's answer to the bytes ``raw``."""
    with connect(gateway) as sock:
        sock.sendall(raw)
        head, _, body = read_until_closed(sock).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), fields["content-type"], body


def test_headers_above_the_limit_are_a_431_problem(gateway):
    """httptools sets no bound: 10,000 header lines or one 1 MB header were served (issue 10)."""
    many = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"x" * 50) for n in range(200))  # about 11 KiB
    status, kind, body = answer_to(gateway, b"GET /healthz HTTP/1.1\r\nHost: a\r\n" + many + b"\r\n")
    assert (status, kind) == (431, "application/problem+json")
    assert b"server.max_header_kb=8 KiB" in body
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Nul: a\x00b\r\n\r\n",
        b"POST /v1/ocr HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
        b"NOT-HTTP\r\n\r\n",
    ],
    ids=["nul-in-header", "two-content-lengths", "no-request-line"],
)
def test_a_request_that_is_not_http_is_a_400_problem(gateway, raw):
    """uvicorn answered these ``400 text/plain "Invalid HTTP request received."``."""
    status, kind, body = answer_to(gateway, raw)
    assert (status, kind) == (400, "application/problem+json")
    assert b"not valid HTTP/1.1" in body


def test_forwarded_headers_are_ignored_unless_a_proxy_is_configured():
    """A client guessing keys with a new ``X-Forwarded-For`` each time was never limited: uvicorn
    trusts the header from 127.0.0.1 by default (issue 10). Now it is not trusted unless
    ``server.forwarded_allow_ips`` names the proxy."""
    with Gateway("server.api_keys=[right]", "server.rate_limit.failed_auth_burst=3").wait_ready() as gw:
        guesses = [{"authorization": f"Bearer guess{n}", "x-forwarded-for": f"10.0.0.{n}"} for n in range(5)]
        answers = [httpx.get(f"{gw.url}/v1/models", headers=headers) for headers in guesses]
    assert [a.status_code for a in answers] == [403, 403, 403, 429, 429]
