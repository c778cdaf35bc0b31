"""``ocrserve engine serve``: run an OCR engine as a server of its own (OpenAI chat completions)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ocrserve.cli.common import Overrides, load_or_exit
from ocrserve.engine_server import serve as run_server

app = typer.Typer(help="Run an OCR engine as a server of its own.", no_args_is_help=True)


class Backend(str, Enum):
    """Engines ``ocrserve engine serve`` can put behind the protocol."""

    onnx = "onnx"


@app.command()
def serve(
    backend: Annotated[Backend, typer.Option(help="The engine to serve.")],
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (8001: where the prod profile looks for vLLM).")] = 8001,
    profile: Annotated[str, typer.Option(help="Profile for the engine and preprocess sections.")] = "local",
    served_model_name: Annotated[
        str | None, typer.Option(help="Model id clients must send (vLLM's --served-model-name); default engine.model.")
    ] = None,
    set_: Overrides = None,
) -> None:
    """Serve an engine behind vLLM's OpenAI chat-completions API: an image in, its text out.

    A gateway reaches it like a vLLM replica (engine.kind: vllm, engine.vllm.base_urls), so CPU
    workers can run on other machines. GET /health, /v1/models and /metrics (vLLM's gauge names)
    as vLLM has them.

    Examples:

        ocrserve engine serve --backend onnx

        ocrserve engine serve --backend onnx --host 0.0.0.0 --port 9001 --set engine.onnx.det_workers=2

        ocrserve engine serve --backend onnx --served-model-name tencent/HunyuanOCR   # stand in for vLLM
    """
    config = load_or_exit(profile, [*(set_ or []), f"engine.kind={backend.value}"])
    run_server(config, host=host, port=port, served_model_name=served_model_name)
