"""What changes between vLLM releases in the start-up arithmetic the planner mirrors.

The planner predicts what vLLM V1 computes at start-up (``vllm/v1/worker/gpu_worker.py``
``determine_available_memory``); which terms that subtracts, its default batch sizes and its
admission flags depend on the release. Each fact here cites the release whose wheel first has it
(read from the PyPI wheels of 0.8.5 ... 0.33.0; "since X" = in X, not in the release read before).

Supported: vLLM **0.9.1** and later, the releases that take a memory snapshot before profiling
(``memory_profiling`` with a baseline) and log "Available KV cache memory". Older V1 releases
(0.8.x, 0.9.0) charged everything the device held, other processes included, so no plan made
ahead of time could match them; V0 (``vllm/worker/worker.py``) is not planned for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

from ocrserve.gpu.registry import GIB, GpuSpec

OLDEST = (0, 9, 1)
"""The first release whose accounting the planner follows (see the module docstring)."""
NEWEST = "0.33.0"
"""The newest release read for this module; the planner's default when vLLM is not installed."""


class VersionError(ValueError):
    """A vLLM version the planner cannot read, or one older than :data:`OLDEST`."""


def release(text: str) -> tuple[int, int, int]:
    """``"0.10.1.1"``, ``"0.15.2rc1.dev93+g11a4c9d30"`` -> ``(0, 10, 1)``: the release's first three numbers.

    Raises:
        VersionError: no ``X.Y`` at the start.
    """
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise VersionError(f"vLLM version {text!r} is not X.Y.Z")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def parse_version(text: str) -> tuple[int, int, int]:
    """:func:`release`, for a release the planner follows.

    Raises:
        VersionError: no ``X.Y`` at the start, or a release older than :data:`OLDEST`.
    """
    version = release(text)
    if version < OLDEST:
        raise VersionError(
            f"vLLM {text} is older than {'.'.join(map(str, OLDEST))}, the first release whose start-up memory "
            "accounting the planner follows (a baseline snapshot before profiling); upgrade vLLM or plan for a "
            "newer one with --vllm-version"
        )
    return version


def installed_version() -> str | None:
    """The version of the ``vllm`` package in this environment, or ``None`` when it is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Accounting:
    """One vLLM release's start-up rules, as far as the planner needs them.

    Attributes:
        version: the release, ``(major, minor, patch)``.
        charges_nccl: NCCL and custom all-reduce buffers are allocated after the memory snapshot,
            so they count against the KV cache (0.9.1 - 0.10.x; since 0.11.0 ``init_device``
            initializes the distributed environment "BEFORE taking memory snapshot").
        charges_cuda_graphs: the CUDA-graph pool is estimated before the KV cache is sized and
            subtracted from it (``profile_cudagraph_memory``, since 0.18.0, applied when
            ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is set, which defaults to 1 since 0.20.0).
            Before, graphs were captured after the KV cache and lived in the ``1 -
            gpu_memory_utilization`` headroom.
        queue_limits: ``--max-num-queued-reqs`` / ``--max-num-queued-tokens`` exist (since 0.29.0;
            a request over them gets HTTP 503 "The engine is currently busy ...").
    """

    version: tuple[int, int, int]

    @property
    def name(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def charges_nccl(self) -> bool:
        return self.version < (0, 11, 0)

    @property
    def charges_cuda_graphs(self) -> bool:
        return self.version >= (0, 20, 0)

    @property
    def queue_limits(self) -> bool:
        return self.version >= (0, 29, 0)

    def default_batch(self, gpu: GpuSpec) -> tuple[int, int]:
        """``vllm serve``'s own ``(max_num_seqs, max_num_batched_tokens)`` on ``gpu`` when neither is given.

        ``vllm/engine/arg_utils.py`` ``get_batch_defaults`` (0.12+; ``_set_default_args`` before),
        OpenAI API server column: 1024 / 16384 on GPUs of 160 GiB or more (since 0.28.0); 1024 /
        8192 on GPUs of 70 GiB or more whose name does not contain "a100" (H100, H200); else 256
        / 2048. (``max_num_batched_tokens`` is then capped at ``max_num_seqs x max_model_len``.)
        """
        memory = gpu.memory_bytes
        if memory >= 160 * GIB and self.version >= (0, 28, 0):
            return 1024, 16384
        if memory >= 70 * GIB and "a100" not in gpu.name.lower():
            return 1024, 8192
        return 256, 2048


def accounting_for(version: str | None) -> Accounting:
    """The rules of ``version``; ``None`` = the installed vLLM, else :data:`NEWEST`.

    Raises:
        VersionError: an unreadable version, or one older than :data:`OLDEST`.
    """
    return Accounting(parse_version(version or installed_version() or NEWEST))
