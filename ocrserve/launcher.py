"""Start the gateway (uvicorn) for a profile."""

from __future__ import annotations

import uvicorn

from ocrserve.api import create_app
from ocrserve.config import Config

#: Seconds in-flight requests get to finish after Ctrl-C / SIGTERM before connections close.
GRACEFUL_SHUTDOWN_S = 30


def gateway_command(config: Config) -> list[str]:
    """The equivalent command line of the gateway, for ``--dry-run`` and logs."""
    return [
        "ocrserve", "launch", "--profile", config.profile,
        "--host", config.server.host, "--port", str(config.server.port),
    ]


def run_gateway(config: Config) -> None:
    """Serve the gateway until SIGINT/SIGTERM; in-flight requests drain first (uvicorn)."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.server.host,
            port=config.server.port,
            log_level=config.server.log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    server.run()
