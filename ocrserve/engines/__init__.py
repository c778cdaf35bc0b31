"""OCR engines behind the gateway: ``onnx`` (embedded CPU), ``vllm`` (GPU), ``transformers`` (debug)."""

from __future__ import annotations

from ocrserve.config import Config
from ocrserve.engines.base import Engine
from ocrserve.extras import MissingExtra, require


def create_engine(config: Config) -> Engine:
    """Build (not start) the engine ``config.engine.kind`` names.

    Raises:
        ValueError: an engine kind this installation does not provide, or a configuration the
            engine cannot run with (the message names the key).
    """
    kind = config.engine.kind
    if kind == "onnx":
        from ocrserve.engines.onnx import OnnxEngine

        return OnnxEngine(config.engine)
    if kind == "vllm":
        from ocrserve.engines.vllm import VllmEngine

        return VllmEngine(config)
    if kind == "transformers":
        try:
            require("debug", "engine.kind=transformers")
            from ocrserve.engines.transformers import TransformersEngine
        except MissingExtra as exc:
            raise ValueError(str(exc)) from None
        except ImportError as exc:  # installed, yet broken (a torch built for another platform, ...)
            raise ValueError(f"engine.kind=transformers: {exc}") from None
        return TransformersEngine(config)
    raise ValueError(f"engine.kind={kind!r} is not available in this installation")
