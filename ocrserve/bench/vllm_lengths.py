"""vLLM's side of :mod:`ocrserve.bench.forced_lengths`: a v1 logits processor that ends each request after
an OCR-shaped length, for load tests against a random-weight model (bench tooling only: the gateway
never imports it).

Loaded into ``vllm serve`` (vLLM >= 0.10's v1 engine; read for 0.32) by
``--logits-processors ocrserve.bench.vllm_lengths:ForcedLengths`` with ``OCRBENCH_OUTPUT_LENGTHS``
naming a lengths file (and ``OCRBENCH_OUTPUT_SEED`` its seed) in vLLM's environment; through
``ocrserve launch`` that is ``--set 'vllm.extra_args=[--logits-processors,ocrserve.bench.vllm_lengths:ForcedLengths]'``
(``scripts/bench_vllm_cpu.py``). vLLM's engine core must import this ``ocrserve`` (``PYTHONPATH``).
"""

from __future__ import annotations

import logging

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from ocrserve.bench.forced_lengths import ForcedEnd, LengthSampler

logger = logging.getLogger("vllm.ocrserve.bench")


class ForcedLengths(LogitsProcessor):
    """Each request added to the batch gets a length drawn from the lengths file; its end token is
    masked before that length and forced at it (:class:`ocrserve.bench.forced_lengths.ForcedEnd`)."""

    def __init__(self, vllm_config, device, is_pin_memory: bool):
        sampler = LengthSampler.from_env()
        eos = getattr(vllm_config.model_config.hf_text_config, "eos_token_id", None)
        self.state = ForcedEnd(sampler, eos if isinstance(eos, int) else None)
        logger.warning("ocrserve bench: every reply ends at a drawn length: %s", sampler.describe())

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token at the end of each reply

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.state.update(batch_update)

    def apply(self, logits):
        return self.state.apply(logits)
