"""Guards of the uvicorn internals ocrserve relies on, pinned in ``pyproject.toml``.

uvicorn has no public hook for either of these, so ocrserve uses its internals, pins uvicorn to the
releases tested (``uvicorn[standard]>=X,<Y``) and checks here, first, what it relies on:

- :class:`ocrserve.api.protocol.GatewayProtocol` subclasses uvicorn's httptools protocol
  (``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``) for the header deadline, the header
  size limit and problem-details answers to malformed requests: an ASGI app, or middleware, runs
  only once the headers are complete, too late for either;
- :mod:`ocrserve.gpu.launcher` overrides ``uvicorn.Server.capture_signals`` so that SIGINT/SIGTERM
  stay the launcher's (it stops vLLM after the drain; uvicorn re-raises the signal after its
  shutdown, which would end the process first), and :class:`ocrserve.gateway.GatewayServer` extends
  ``Server.startup`` to announce a socket bound beforehand.

A failure here names what changed; adapt those classes, test, then move the pin.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
from importlib.metadata import version
from pathlib import Path

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _pin() -> Requirement:
    """uvicorn's requirement in ``pyproject.toml``'s dependencies (read as text: no tomllib on 3.10)."""
    (pin,) = re.findall(r'^\s*"(uvicorn\[[^"]*)",', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    return Requirement(pin)


def test_uvicorn_is_pinned_and_the_installed_release_is_in_the_pin():
    pin = _pin()
    assert any(s.operator == "<" for s in pin.specifier), (
        f"pyproject.toml: {pin} has no upper bound; ocrserve uses uvicorn internals (see {__name__}), so "
        "uvicorn is pinned to the releases tested"
    )
    installed = Version(version("uvicorn"))
    assert installed in pin.specifier, (
        f"uvicorn {installed} is installed but pyproject.toml pins {pin}: run {__file__} and the gateway's tests "
        "against it, then move the pin"
    )


def _private(what: str, ok: bool) -> None:
    if not ok:
        pytest.fail(
            f"uvicorn {version('uvicorn')} changed {what}, which ocrserve relies on (see {__name__}); adapt "
            "ocrserve.api.protocol / ocrserve.gateway / ocrserve.gpu.launcher before moving the uvicorn pin",
            pytrace=False,
        )


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_httptools_protocol_has_what_gateway_protocol_overrides():
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
    except ImportError as exc:
        _private(f"uvicorn.protocols.http.httptools_impl ({exc})", False)
    hooks = {
        "__init__": ["self", "config", "server_state", "app_state", "_loop"],
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "on_message_begin": ["self"],
        "on_header": ["self", "name", "value"],
        "on_headers_complete": ["self"],
        "send_400_response": ["self", "msg"],
    }
    for name, parameters in hooks.items():
        method = getattr(HttpToolsProtocol, name, None)
        _private(
            f"HttpToolsProtocol.{name}{parameters}",
            callable(method) and _parameters(method)[: len(parameters)] == parameters,
        )
    # httptools' parse errors (and an exception raised by on_header) end in send_400_response
    _private(
        "HttpToolsProtocol.data_received's call of send_400_response",
        "self.send_400_response(" in inspect.getsource(HttpToolsProtocol.data_received),
    )
    _private("STATUS_LINE (status -> bytes)", isinstance(STATUS_LINE.get(431), bytes))
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    _private(
        "RequestResponseCycle's keep_alive and response_complete",
        "self.keep_alive" in cycle and "self.response_complete" in cycle,
    )


class _Transport(asyncio.Transport):
    """Enough of a socket's transport for uvicorn's protocol; keeps what is written."""

    def __init__(self):
        super().__init__()
        self.written, self.closed = bytearray(), False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed


async def _app(scope, receive, send):  # pragma: no cover - never reached: the requests here are refused
    raise AssertionError("not reached")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2048 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", 408),  # headers never complete
    ],
)
def test_gateway_protocol_answers_on_uvicorn_as_installed(request_bytes, status):
    """The overrides take effect on the installed uvicorn: a problem response, the connection closed."""
    from ocrserve.api.protocol import GatewayProtocol

    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_app, log_level="warning")
        config.load()
        server_state = uvicorn.server.ServerState()
        protocol = GatewayProtocol(
            config=config,
            server_state=server_state,
            app_state={},
            _loop=loop,
            header_timeout_s=0.05,
            max_header_bytes=1024,
        )
        transport = _Transport()
        protocol.connection_made(transport)
        protocol.data_received(request_bytes)
        loop.run_until_complete(asyncio.sleep(0.2))
        protocol.connection_lost(None)
    finally:
        loop.close()
    head = bytes(transport.written).split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 %d" % status), bytes(transport.written)[:200]
    assert b"content-type: application/problem+json" in head and b"connection: close" in head
    assert transport.closed


def test_server_has_what_the_gateway_and_launcher_override():
    source = inspect.getsource(uvicorn.Server)
    _private("Server.serve's `with self.capture_signals():`", "with self.capture_signals():" in source)
    _private("Server.startup(sockets)", _parameters(uvicorn.Server.startup)[:2] == ["self", "sockets"])
    _private("Server._serve's `await self.startup(sockets=sockets)`", "await self.startup(sockets=sockets)" in source)
    server = uvicorn.Server(uvicorn.Config(_app))
    _private("Server.should_exit / force_exit", server.should_exit is False and server.force_exit is False)


def test_the_launcher_keeps_its_signal_handlers_while_uvicorn_serves():
    from ocrserve.gpu.launcher import _Gateway

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with _Gateway(uvicorn.Config(_app)).capture_signals():
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
