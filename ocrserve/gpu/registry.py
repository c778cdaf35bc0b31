"""GPU registry and detection: how much memory a card has and whether it computes in bfloat16.

The planner needs three facts per card: memory (bytes, what vLLM's ``gpu_memory_utilization`` is a
fraction of), bfloat16 support (vLLM refuses ``--dtype bfloat16`` below compute capability 8.0 and
asks for ``--dtype half``) and peak memory bandwidth (bytes/s; decoding is bandwidth-bound, used for
the ``--p95`` latency estimate).

Sources: compute capability and bandwidth are the vendor's datasheet figures, cited per entry.
Memory is the total **as CUDA reports it** (``cudaMemGetInfo`` / torch's ``total_memory``, what
vLLM multiplies by ``gpu_memory_utilization``), from a public log or device query cited per entry.
It is below the nominal size and below ``nvidia-smi``'s total (an H100 80GB: 79.11 GiB to CUDA,
81559 MiB = 79.65 GiB to ``nvidia-smi``): the driver keeps some for itself. The bf16 rule is
vLLM's own check (``vllm/platforms/cuda.py``, ``check_if_supports_dtype``:
"Bfloat16 is only supported on GPUs with compute capability of at least 8.0").

Detection (``--gpu auto``) asks the CUDA driver first (``libcuda``'s ``cuDeviceTotalMem``, the
total vLLM sees, through ``ctypes``; no context is created), then NVML through ``pynvml`` (package
``nvidia-ml-py``, imported lazily so the module loads on machines without it), then
``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``. NVML and ``nvidia-smi``
report the larger total, so for a card the registry knows they are read for its name and count and
the registry's CUDA total is planned with.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)  # vllm/platforms/cuda.py check_if_supports_dtype
MAX_GPU_MEMORY_GIB = 1024
"""Largest memory per GPU ``--gpu-memory`` accepts, GiB: above any card sold (B300: 288 GB), below
what would make the arithmetic meaningless."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Attributes:
        name: canonical display name, e.g. ``"RTX 4090D"``.
        memory_mib: device memory, MiB (per GPU).
        compute_capability: CUDA compute capability ``(major, minor)``.
        bandwidth_gbs: peak DRAM bandwidth, GB/s (10^9 bytes/s); ``0`` when unknown.
        aliases: extra names accepted by :func:`lookup` (normalized like the name).
        source: where the figures come from.
    """

    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    bandwidth_gbs: float
    aliases: tuple[str, ...] = ()
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return self.memory_mib * MIB

    @property
    def memory_gib(self) -> float:
        """Device memory in GiB."""
        return self.memory_mib / 1024

    @property
    def bf16(self) -> bool:
        """True when vLLM accepts ``--dtype bfloat16`` on this card (compute capability >= 8.0)."""
        return self.compute_capability >= BF16_MIN_COMPUTE_CAPABILITY

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Peak memory bandwidth in bytes/s (0 when unknown)."""
        return self.bandwidth_gbs * 1e9


def _spec(name, gib, cc, bw, aliases, source) -> GpuSpec:
    return GpuSpec(name, int(gib * 1024), cc, bw, tuple(aliases), source)


_NV = "https://www.nvidia.com/"
GPUS: tuple[GpuSpec, ...] = (
    _spec(
        "RTX 3060 12G",
        11.76,
        (8, 6),
        360,
        ["rtx3060", "rtx306012gb", "3060"],
        _NV + "en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti/ (12 GB GDDR6, 192-bit, 15 Gbps "
        "= 360 GB/s; GA106, compute capability 8.6 per developer.nvidia.com/cuda-gpus)"
        "; CUDA total 11.76 GiB, GPU 0; 11.76 GiB total capacity: "
        "https://github.com/TencentARC/PhotoMaker/issues/47 (an RTX 3060 12GB)",
    ),
    _spec(
        "RTX 2080 Ti",
        10.76,
        (7, 5),
        616,
        ["rtx2080ti", "2080ti"],
        _NV + "en-us/geforce/graphics-cards/compare/?section=compare-20 (11 GB GDDR6, 616 GB/s; "
        "Turing TU102, compute capability 7.5: no bf16)"
        "; CUDA total 10.76 GiB, GPU 0; 10.76 GiB total capacity: "
        "https://github.com/JDAI-CV/image-captioning/issues/11 (a 2080 Ti 11 GB)",
    ),
    _spec(
        "RTX 3090",
        23.58,
        (8, 6),
        936,
        ["rtx3090", "3090"],
        _NV + "en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/ (24 GB GDDR6X, 936 GB/s; "
        "GA102, compute capability 8.6)"
        "; CUDA total 23.58 GiB, vLLM's total_gpu_memory=23.58GiB: "
        "https://github.com/vllm-project/vllm/issues/10517 (an RTX 3090)",
    ),
    _spec(
        "RTX 4090",
        23.64,
        (8, 9),
        1008,
        ["rtx4090", "4090"],
        _NV + "en-us/geforce/graphics-cards/40-series/rtx-4090/ (24 GB GDDR6X, 384-bit, 21 Gbps "
        "= 1008 GB/s; AD102, compute capability 8.9)"
        "; CUDA total 23.64 GiB, total capacity of 23.64 GiB: "
        "https://github.com/ali-vilab/VGen/issues/104; deviceQuery 25,386,352,640 B: https://github.com/thamada/nvidia-smi/blob/c4c8a463a61e4ac67e3d7956da104b302760a498/gls/RTX4090_deviceQuery.py",
    ),
    _spec(
        "RTX 4090D",
        23.64,
        (8, 9),
        1008,
        ["rtx4090d", "4090d"],
        _NV + "zh-cn/geforce/graphics-cards/40-series/rtx-4090d/ (24 GB GDDR6X, 384-bit: the "
        "4090's memory system, 114 instead of 128 SMs; AD102, compute capability 8.9)"
        "; CUDA total 23.64 GiB, no public figure found; taken as the RTX 4090's, whose 24 GB memory system it shares",
    ),
    _spec(
        "L4",
        21.95,
        (8, 9),
        300,
        ["l4", "nvidial4"],
        _NV + "en-us/data-center/l4/ (24 GB GDDR6, 300 GB/s; Ada, compute capability 8.9)"
        "; CUDA total 21.95 GiB, deviceQuery 23,570,219,008 B: "
        "https://github.com/thamada/nvidia-smi/blob/c4c8a463a61e4ac67e3d7956da104b302760a498/gls/L4_deviceQuery.py",
    ),
    _spec(
        "A10 24G",
        22.18,
        (8, 6),
        600,
        ["a10", "a1024g", "a1024gb"],
        _NV + "en-us/data-center/products/a10-gpu/ (24 GB GDDR6, 600 GB/s; GA102, compute capability 8.6)"
        "; CUDA total 22.18 GiB, total capacity of 22.18 GiB: https://github.com/OpenBMB/MiniCPM-V/issues/640 (an A10)",
    ),
    _spec(
        "T4 16G",
        14.56,
        (7, 5),
        320,
        ["t4", "t416g", "t416gb", "teslat4"],
        _NV + "en-us/data-center/tesla-t4/ (16 GB GDDR6, 320+ GB/s; Turing, compute capability 7.5: no bf16)"
        "; CUDA total 14.56 GiB, total capacity of 14.56 GiB: "
        "https://github.com/Zheng-Chong/CatVTON/issues/133 (a T4 on GCP; 14.58 to 14.75 elsewhere)",
    ),
    _spec(
        "L40S 48G",
        44.42,
        (8, 9),
        864,
        ["l40s", "l40s48g", "l40s48gb"],
        _NV + "en-us/data-center/l40s/ (48 GB GDDR6 with ECC, 864 GB/s; Ada, compute capability 8.9)"
        "; CUDA total 44.42 GiB, total capacity of 44.42 GiB: "
        "https://github.com/stepfun-ai/Step-Video-T2V/issues/8 (8 x L40S; deviceQuery 44.52: https://github.com/thamada/nvidia-smi/blob/c4c8a463a61e4ac67e3d7956da104b302760a498/gls/L40S_deviceQuery.py)",
    ),
    _spec(
        "A100 40G",
        39.38,
        (8, 0),
        1555,
        ["a10040g", "a10040gb", "a100pcie40gb", "a100sxm440gb"],
        _NV + "en-us/data-center/a100/ (A100 40GB: HBM2, 1,555 GB/s; compute capability 8.0)"
        "; CUDA total 39.38 GiB, vLLM's total_gpu_memory (39.38GiB): "
        "https://github.com/vllm-project/vllm/issues/16570 (4 x A100 40GB)",
    ),
    _spec(
        "A100 80G",
        79.26,
        (8, 0),
        1935,
        ["a100", "a10080g", "a10080gb", "a100sxm480gb", "a100pcie80gb"],
        _NV + "en-us/data-center/a100/ (A100 80GB: HBM2e, 1,935 GB/s PCIe / 2,039 GB/s SXM; the lower figure is kept)"
        "; CUDA total 79.26 GiB, deviceQuery 85,100,068,864 B on an A100-SXM4-80GB: "
        "https://github.com/thamada/nvidia-smi/blob/c4c8a463a61e4ac67e3d7956da104b302760a498/gls/"
        "A100SXMx4_deviceQuery.py (79.14 to 79.35 in OOM messages)",
    ),
    _spec(
        "H100 80G",
        79.11,
        (9, 0),
        2000,
        ["h100", "h10080g", "h10080gb", "h10080gbhbm3", "h100pcie", "h100sxm580gb"],
        _NV + "en-us/data-center/h100/ (H100 80GB: 2.0 TB/s PCIe / 3.35 TB/s SXM; the lower figure "
        "is kept; compute capability 9.0)"
        "; CUDA total 79.11 GiB, total capacity of 79.11 GiB beside nvidia-smi's H100 80GB HBM3: "
        "https://github.com/vllm-project/vllm/issues/27508 (vLLM logs 79.22)",
    ),
    _spec(
        "H200 141G",
        143156 / 1024,
        (9, 0),
        4800,
        ["h200", "h200141g", "h200141gb", "h200nvl"],
        _NV + "en-us/data-center/h200/ (141 GB HBM3e, 4.8 TB/s; nvidia-smi reports 143771 MiB "
        "total on an H200 SXM; compute capability 9.0)"
        "; CUDA total 139.80 GiB, torch total_memory=143156MB for an NVIDIA H200: "
        "https://github.com/ai-bot-pro/achatbot/blob/859e21612de769164d8d1802d794ef8f87ace3c8/deploy/modal/src/llm/vllm/vlm/skywork_r1v.py",
    ),
)

_NOISE = ("nvidia", "geforce", "tesla", "quadro")


def normalize(name: str) -> str:
    """Lower-case ``name`` and drop spaces, punctuation and vendor words.

    ``"NVIDIA GeForce RTX 4090 D"``, ``"rtx-4090d"`` and ``"RTX 4090D"`` all become ``"rtx4090d"``.
    """
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for word in _NOISE:
        key = key.replace(word, "")
    return key


class GpuError(LookupError):
    """An unknown GPU name, or no GPU could be detected; the message says what to do."""


class NoGpuFound(GpuError):
    """``auto`` detection found no GPU on this machine."""


def _keys(spec: GpuSpec) -> set[str]:
    return {normalize(spec.name), *(normalize(a) for a in spec.aliases)}


def lookup(name: str) -> GpuSpec:
    """Find a registry GPU by name, tolerant of case, spaces, dashes and vendor words.

    Raises:
        GpuError: no entry matches; the message lists the known names.
    """
    key = normalize(name)
    for spec in GPUS:
        if key in _keys(spec):
            return spec
    known = ", ".join(s.name for s in GPUS)
    raise GpuError(f"unknown GPU {name!r}; known: {known} (or pass --gpu-memory GIB)")


def match_detected(name: str, memory_mib: int) -> GpuSpec | None:
    """Match a name reported by the driver (``"NVIDIA A100-SXM4-80GB"``) to a registry entry.

    Tries an exact normalized match first, then the registry entry whose family token (its name
    without the memory suffix) occurs in the reported name, preferring the longest token (so a
    4090 D is not taken for a 4090) and, among equals, the closest memory size.

    Returns:
        The entry, or ``None`` for a card the registry does not know.
    """
    key = normalize(name)
    for spec in GPUS:
        if key in _keys(spec):
            return spec
    candidates = []
    for spec in GPUS:
        family = normalize(re.sub(r"\s+\d+G$", "", spec.name))
        if family and family in key:
            candidates.append((-len(family), abs(spec.memory_mib - memory_mib), spec))
    return min(candidates, key=lambda c: c[:2])[2] if candidates else None


@dataclass(frozen=True)
class DetectedGpu:
    """A GPU seen on this machine.

    Attributes:
        name: the driver's name for it.
        memory_mib: total memory the driver reports, MiB.
        count: how many GPUs of this kind the machine has.
        spec: the matching registry entry, or ``None``.
        via: ``"cuda"``, ``"nvml"`` or ``"nvidia-smi"``.
    """

    name: str
    memory_mib: int
    count: int
    spec: GpuSpec | None
    via: str

    def as_spec(self) -> GpuSpec:
        """A :class:`GpuSpec` with the detected memory (the registry's bf16/bandwidth if known; for a
        known card seen through NVML or ``nvidia-smi``, whose totals exceed CUDA's, the registry's
        memory).

        A card the registry does not know is assumed to support bf16 (every data-center and
        consumer NVIDIA card since Ampere does) and to have unknown bandwidth.
        """
        if self.spec is None:
            return GpuSpec(
                self.name,
                self.memory_mib,
                (8, 0),
                0.0,
                (),
                f"detected via {self.via}; not in the registry: bf16 assumed, bandwidth unknown",
            )
        base = self.spec
        return GpuSpec(
            base.name,
            self.memory_mib if self.via == "cuda" else base.memory_mib,
            base.compute_capability,
            base.bandwidth_gbs,
            base.aliases,
            f"detected via {self.via}; {base.source}",
        )


def _detect_cuda() -> list[tuple[str, int]]:
    """``(name, total MiB)`` per device from the CUDA driver API (``cuInit``, ``cuDeviceGetName``,
    ``cuDeviceTotalMem_v2``; CUDA Driver API reference, "Device Management"); ``[]`` without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for index in range(count.value):
        device, total = ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        cuda.cuDeviceGetName(name, len(name), device)
        if cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) == 0:
            found.append((name.value.decode(errors="replace"), total.value // MIB))
    return found


def _detect_nvml() -> list[tuple[str, int]]:
    import pynvml  # nvidia-ml-py; lazy: absent on CPU-only machines

    pynvml.nvmlInit()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            found.append((name, pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB))
        return found
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(output: str) -> list[tuple[str, int]]:
    """Parse ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` output.

    Returns:
        ``(name, memory_mib)`` per GPU line.
    """
    found = []
    for line in output.strip().splitlines():
        name, _, memory = line.rpartition(",")
        if name.strip() and memory.strip().isdigit():
            found.append((name.strip(), int(memory.strip())))
    return found


def _detect_nvidia_smi() -> list[tuple[str, int]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    result = subprocess.run(
        [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return parse_nvidia_smi(result.stdout) if result.returncode == 0 else []


def detect() -> DetectedGpu:
    """Detect this machine's GPUs (the first GPU's kind; ``count`` of that kind).

    Raises:
        GpuError: neither NVML nor ``nvidia-smi`` reports a GPU.
    """
    errors = []
    found = _detect_cuda()
    via = "cuda"
    if not found:
        via = "nvml"
        try:
            found = _detect_nvml()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver not loaded, ...
            errors.append(f"NVML: {exc}")
    if not found:
        via = "nvidia-smi"
        try:
            found = _detect_nvidia_smi()
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"nvidia-smi: {exc}")
        if not found and not errors[1:]:
            errors.append("nvidia-smi: not found or reported no GPU")
    if not found:
        raise NoGpuFound(
            "no NVIDIA GPU found (" + "; ".join(errors) + "). Name one with --gpu NAME "
            "(see `ocrserve plan --help`) or give its memory with --gpu-memory GIB."
        )
    name, memory = found[0]
    count = sum(1 for n, _ in found if n == name)
    return DetectedGpu(name, memory, count, match_detected(name, memory), via)


def resolve_gpu(gpu: str, gpu_memory: float | None) -> tuple[GpuSpec, int]:
    """The GPU spec to plan for and how many were detected (1 unless ``auto``).

    Args:
        gpu: a registry name or ``auto`` (detect through NVML / nvidia-smi).
        gpu_memory: GiB per GPU overriding the registry's (with ``auto``: skip detection).

    Raises:
        GpuError: unknown name, ``auto`` with no GPU found, or a ``gpu_memory`` that is not a
            finite number of GiB in ``[1, MAX_GPU_MEMORY_GIB]``.
    """
    if gpu_memory is not None and not (math.isfinite(gpu_memory) and 1 <= gpu_memory <= MAX_GPU_MEMORY_GIB):
        raise GpuError(f"GPU memory must be a finite number of GiB from 1 to {MAX_GPU_MEMORY_GIB}, got {gpu_memory}")
    count = 1
    if gpu.lower() == "auto" and gpu_memory is None:
        found = detect()
        return found.as_spec(), found.count
    if gpu.lower() == "auto":
        base = GpuSpec("custom", 0, (8, 0), 0.0, (), "--gpu-memory; bf16 assumed, bandwidth unknown")
    else:
        base = lookup(gpu)
    if gpu_memory is not None:
        base = GpuSpec(
            base.name,
            int(gpu_memory * GIB / 1024**2),
            base.compute_capability,
            base.bandwidth_gbs,
            base.aliases,
            base.source + f"; memory set to {gpu_memory:g} GiB",
        )
    return base, count
