"""ocrserve's vLLM plugin: fixes for vLLM itself, loaded by vLLM in each of its processes.

Registered in ``pyproject.toml`` as the ``ocrserve`` entry point of the ``vllm.general_plugins``
group, so installing ocrserve into vLLM's environment (``pip install --no-deps ocrserve`` there is
enough: this module imports nothing else of ocrserve, nor anything vLLM does not bring) makes
``vllm serve`` call :func:`register` in its API server, engine core and workers, before the model
is built (``vllm.plugins.load_general_plugins``). ``VLLM_PLUGINS`` (a comma list of plugin names)
can leave it out.

The one fix today, **non-unit-stride inputs to vLLM's CPU linear layers**: on vLLM's CPU platform
every unquantized linear runs ``cpu_unquantized_gemm`` (``vllm/model_executor/layers/utils.py``),
which calls the kernel ``dispatch_cpu_unquantized_gemm`` chose for the layer: oneDNN's
``onednn_mm`` or sgl-kernel's ``weight_packed_linear``. Both require a unit stride in the input's
last dimension (``mat1 must be contiguous at last dimension`` in bfloat16, ``Expected
a.stride(-1) == 1`` in float32), where ``torch.nn.functional.linear`` takes any strides. Since vLLM
0.29 runs HunYuanVL (HunyuanOCR) on its Transformers modeling backend, which swaps transformers'
``nn.Linear`` layers for vLLM's; the vision patch merger (``HunYuanVLVisionPatchMerger``) feeds its
linear ``x.reshape(b, c, -1).permute(0, 2, 1)``, so the encoder's profiling run fails and the engine
never starts. 0.28 and before ran vLLM's own ``hunyuan_vision.py``, whose merger keeps a plain
``nn.Linear``. The fix wraps ``cpu_unquantized_gemm`` to copy such an input to a contiguous one
first: one stride test per call, a copy only where the kernel would have raised, the same numbers
(``torch.nn.functional.linear`` makes the same copy). It is the narrowest point every CPU linear
passes through: ``dispatch_unquantized_gemm`` looks the function up at each layer's construction,
after plugins load. GPU platforms are left alone (their GEMMs take strided inputs).

Applied on vLLM's CPU platform for the versions in :data:`CPU_STRIDE_FIX_VERSIONS`: from 0.29 (the
Transformers-backend HunYuanVL) to 0.32, the newest release checked (``tests/test_vllm_plugin.py``
shows vLLM's own function still raising on a permuted input in 0.32.0). A newer vLLM is left
unpatched until checked: the same test then fails if the bug is still there, saying to raise the
bound.
"""

from __future__ import annotations

import re

#: vLLM releases (major, minor) whose CPU linear needs the fix: [first, end).
CPU_STRIDE_FIX_VERSIONS = ((0, 29), (0, 33))
#: Set on the wrapper, so that loading the plugin twice in a process wraps once.
_MARK = "_ocrserve_unit_stride"


def release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a vLLM version string (``0.32.0``, ``0.32.1+cpu``, ``0.33.0rc1``);
    None when it has none (``dev``)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def needs_cpu_stride_fix(version: str) -> bool:
    """True for the vLLM versions in :data:`CPU_STRIDE_FIX_VERSIONS`."""
    first, end = CPU_STRIDE_FIX_VERSIONS
    found = release(version)
    return found is not None and first <= found < end


def register() -> None:
    """vLLM's entry point: apply the fixes this platform and version need (idempotent)."""
    import vllm
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not needs_cpu_stride_fix(vllm.__version__):
        return
    from vllm.model_executor.layers import utils

    if getattr(utils.cpu_unquantized_gemm, _MARK, False):
        return
    utils.cpu_unquantized_gemm = unit_stride(utils.cpu_unquantized_gemm)
    init_logger("vllm.plugins.ocrserve").info(
        "ocrserve plugin: vLLM %s on CPU: cpu_unquantized_gemm makes inputs with a non-unit last-dim "
        "stride contiguous (HunYuanVL's vision patch merger passes a permuted tensor)",
        vllm.__version__,
    )


def unit_stride(gemm):
    """``gemm(layer, x, weight, bias)`` with ``x`` made contiguous when its last dimension's stride is not 1."""

    def cpu_unquantized_gemm(layer, x, weight, bias=None):
        if x.dim() and x.stride(-1) != 1:
            x = x.contiguous()
        return gemm(layer, x, weight, bias)

    setattr(cpu_unquantized_gemm, _MARK, True)
    cpu_unquantized_gemm.__wrapped__ = gemm
    cpu_unquantized_gemm.__doc__ = gemm.__doc__
    return cpu_unquantized_gemm
