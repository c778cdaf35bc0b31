"""OCR engines behind the gateway: ``onnx`` (embedded CPU), ``vllm`` (GPU), ``transformers`` (debug)."""

from __future__ import annotations

from ocrserve.config import Config
from ocrserve.engines.base import Engine


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
            from ocrserve.engines.transformers import TransformersEngine
        except ImportError as exc:
            raise ValueError(
                f"engine.kind=transformers needs torch and transformers>=5.13: pip install 'ocrserve[debug]' ({exc})"
            ) from None
        return TransformersEngine(config)
    raise ValueError(f"engine.kind={kind!r} is not available in this installation")
