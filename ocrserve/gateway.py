"""Start the gateway: uvicorn serving ocrserve's API (:func:`ocrserve.api.create_app`) until
SIGINT or SIGTERM.

The ``onnx`` and ``transformers`` profiles, and ``vllm`` profiles that list running servers in
``engine.vllm.base_urls``, start the gateway alone: :func:`run_gateway`. A ``vllm`` profile
without ``base_urls`` starts it beside the ``vllm serve`` it plans and supervises
(:func:`ocrserve.gpu.launcher.run_with_vllm`), from the same parts: the socket bound before
anything loads (:func:`listening_socket`), uvicorn's settings (:func:`uvicorn_config`) and the
server that announces itself once it accepts requests (:class:`GatewayServer`).

SIGINT or SIGTERM: the gateway stops accepting and drains in-flight requests (at most
:data:`GRACEFUL_SHUTDOWN_S`; a second SIGINT skips the drain).
"""

from __future__ import annotations

import errno
import functools
import socket
import sys
from collections.abc import Sequence

import uvicorn

from ocrserve.api import create_app
from ocrserve.api.protocol import GatewayProtocol
from ocrserve.config import Config, dedupe_overrides
from ocrserve.logs import logging_config

#: Seconds in-flight requests get to finish after Ctrl-C / SIGTERM before connections close.
GRACEFUL_SHUTDOWN_S = 30


def say(message: str) -> None:
    """A message of the gateway's or the launcher's on stderr, where vLLM's relayed log goes too."""
    print(f"ocrserve: {message}", file=sys.stderr, flush=True)


def gateway_command(config: Config, overrides: Sequence[str] = ()) -> list[str]:
    """The gateway's equivalent command line, for ``--dry-run`` and logs: the profile, address,
    the ``--set`` ``overrides`` it was given and, for vLLM, the servers it would reach, so that it
    runs alone against them. Each key is set once, to its last value (:func:`dedupe_overrides`)."""
    args = [
        "ocrserve",
        "launch",
        "--profile",
        config.profile,
        "--host",
        config.server.host,
        "--port",
        str(config.server.port),
    ]
    items = list(overrides)
    client = config.engine.vllm
    if config.engine.kind == "vllm" and client.base_urls:
        items += [
            f"engine.vllm.base_urls=[{','.join(client.base_urls)}]",
            f"engine.vllm.slots_per_replica={client.slots_per_replica}",
        ]
    for item in dedupe_overrides(items):
        args += ["--set", item]
    return args


def uvicorn_config(config: Config) -> uvicorn.Config:
    """uvicorn settings of the gateway for ``config``: its app, address, log (``server.log_level``,
    ``server.log_format``, ``server.log_probes``: :func:`ocrserve.logs.logging_config`), drain time,
    the proxies trusted for the client's address (``server.forwarded_allow_ips``), and the HTTP
    protocol with the ``server.header_timeout_s`` deadline and ``server.max_header_kb`` limit on headers."""
    server = config.server
    return uvicorn.Config(
        create_app(config),
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        log_config=logging_config(server.log_level, server.log_format, server.log_probes),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: any local client could then pick
        # the address its rate limits are counted against
        proxy_headers=bool(config.server.forwarded_allow_ips),
        forwarded_allow_ips=config.server.forwarded_allow_ips or None,
        http=functools.partial(
            GatewayProtocol,
            header_timeout_s=config.server.header_timeout_s,
            max_header_bytes=config.server.max_header_kb * 1024,
        ),
    )


def listening_socket(config: Config) -> socket.socket:
    """The gateway's socket, bound to ``server.host``:``server.port`` before anything is loaded, so
    that a taken address fails at once rather than after the models (or vLLM) have started.

    Raises:
        AddressTaken: the address cannot be bound (in use, not local, no permission).
    """
    host, port = config.server.host, config.server.port
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (is another gateway running? choose another with --port)" if exc.errno == errno.EADDRINUSE else ""
        raise AddressTaken(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.set_inheritable(True)
    return sock


class AddressTaken(Exception):
    """The gateway's address cannot be bound."""


def run_gateway(config: Config) -> None:
    """Serve the gateway until SIGINT/SIGTERM; in-flight requests drain first (uvicorn).

    Raises:
        AddressTaken: before any model is loaded.
    """
    listening = listening_socket(config)
    GatewayServer(uvicorn_config(config)).run(sockets=[listening])


class GatewayServer(uvicorn.Server):
    """uvicorn serving on a socket bound beforehand (:func:`listening_socket`); uvicorn announces
    only the sockets it binds itself, so this announces the gateway once it accepts requests."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            say(f"gateway listening on http://{self.config.host}:{self.config.port} (Ctrl-C to stop)")
