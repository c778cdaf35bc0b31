"""The CPU host that vLLM's CPU backend runs on, in place of a GPU: memory, cores, bfloat16.

vLLM's CPU worker reads the same facts at start-up, and the planner
(:mod:`ocrserve.gpu.cpu_planner`) reads them the same way, so that a plan made here matches what
the worker will see:

* **memory**: ``get_memory_node_info`` (``vllm/utils/cpu_resource_utils.py``) takes the NUMA node
  of the first CPU the process may run on, reads ``/sys/devices/system/node/nodeN/meminfo`` and
  counts as available ``MemFree + Active(file) + Inactive(file) + SReclaimable``, clamped to the
  cgroup's limit minus its usage (``/sys/fs/cgroup/memory.max``, ``memory.current``; cgroup v1's
  ``memory.limit_in_bytes``). Without per-node files it takes ``psutil.virtual_memory()``, which
  on Linux is ``/proc/meminfo``'s ``MemTotal`` and ``MemAvailable``.
* **cores**: ``VLLM_CPU_OMP_THREADS_BIND=auto`` (``vllm/utils/ompmultiprocessing.py``
  ``OMPProcessManager``) binds one OpenMP thread per physical core of the allowed CPUs (on x86 the
  last logical CPU of each core) and reserves one core for the API server and engine-core
  processes. :func:`plan_threads` makes the same choice, except that below
  :data:`RESERVE_CORE_FROM` cores it reserves none.
* **bfloat16**: vLLM's CPU platform lists bfloat16 first on x86 and aarch64
  (``vllm/platforms/cpu.py`` ``supported_dtypes``), so ``--dtype auto`` loads bfloat16 even where
  the CPU has no bfloat16 instructions and emulates them. :attr:`HostSpec.bf16` says whether it has
  them (x86 ``avx512_bf16`` or ``amx_bf16``, aarch64 ``bf16``).

Nothing here imports vLLM: the plan is made on the machine that will run it, before vLLM starts.
"""

from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from ocrserve.gpu.registry import GIB, MIB

RESERVE_CORE_FROM = 4
"""Physical cores from which one is left out of vLLM's OpenMP binding for the processes that are
not its compute threads (vLLM's API server and engine core, the gateway and its intake pool).
vLLM's own ``auto`` always reserves one; on 2 cores that halves the compute (the engine computes on
one core, measured here), so below this count every core computes."""
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 ``/proc/cpuinfo`` flags of native bfloat16 arithmetic (AVX512-BF16, AMX-BF16)."""
CGROUP_UNLIMITED = 1 << 62
"""cgroup v1 reports no limit as a value near ``PAGE_COUNTER_MAX``; vLLM treats >= 2^62 as none."""


class HostError(LookupError):
    """The host's memory or CPUs cannot be read, or a given value is impossible."""


@dataclass(frozen=True)
class HostSpec:
    """The machine vLLM's CPU backend would run on.

    Attributes:
        name: the CPU's model name (``/proc/cpuinfo``).
        total_bytes: memory of the NUMA node vLLM allocates on (clamped to the cgroup's limit).
        available_bytes: memory vLLM counts as available there now (see the module docstring).
        cpus: logical CPUs this process may run on (``sched_getaffinity``).
        cores: one logical CPU per physical core among ``cpus`` (the one vLLM's ``auto`` binds).
        bf16: native bfloat16 arithmetic.
        source: how the figures were obtained.
    """

    name: str
    total_bytes: int
    available_bytes: int
    cpus: tuple[int, ...]
    cores: tuple[int, ...]
    bf16: bool
    source: str = ""

    # the GpuSpec-like face the planner's shared code and the renderers read
    @property
    def memory_bytes(self) -> int:
        """Memory the plan may divide: what is available now (vLLM's CPU worker refuses a KV
        cache above it)."""
        return self.available_bytes

    @property
    def memory_gib(self) -> float:
        return self.available_bytes / GIB

    @property
    def memory_mib(self) -> int:
        return self.available_bytes // MIB


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (Linux's cpulist format, as vLLM's
    ``parse_id_list`` reads ``VLLM_CPU_OMP_THREADS_BIND``).

    Raises:
        HostError: not a list of CPU ids and ranges.
    """
    ids: list[int] = []
    for part in text.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            raise HostError(f"{text!r} is not a CPU list such as 0-3,8")
        ids += range(int(match[1]), int(match[2] or match[1]) + 1)
    return ids


def format_cpu_list(ids: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    parts, ids = [], sorted(set(ids))
    start = prev = None
    for cpu in [*ids, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:  # "max"
        return None


def _meminfo(text: str, node: bool) -> dict[str, int]:
    """``key -> bytes`` of a ``meminfo`` file (``Node 0 MemFree: 123 kB`` or ``MemFree: 123 kB``)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if node and len(parts) >= 4:
            out[parts[2].rstrip(":")] = int(parts[3]) * 1024
        elif not node and len(parts) >= 2:
            out[parts[0].rstrip(":")] = int(parts[1]) * (1024 if parts[-1] == "kB" else 1)
    return out


def _core_of(cpu: int) -> tuple[int, int]:
    """``(package, core)`` of a logical CPU from sysfs topology (``(0, cpu)`` where absent)."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    return _read_int(base + "physical_package_id") or 0, _read_int(base + "core_id") or cpu


def _node_of(cpu: int) -> int:
    for entry in Path(f"/sys/devices/system/cpu/cpu{cpu}").glob("node*"):
        if entry.name[4:].isdigit():
            return int(entry.name[4:])
    return 0


def read_memory(cpu: int) -> tuple[int, int, str]:
    """``(total, available, source)`` bytes as vLLM's CPU worker computes them for the NUMA node
    of ``cpu`` (see the module docstring).

    Raises:
        HostError: neither the node's nor the system's ``meminfo`` can be read.
    """
    node = _node_of(cpu)
    text = _read(f"/sys/devices/system/node/node{node}/meminfo")
    if text:
        info = _meminfo(text, node=True)
        total = info["MemTotal"]
        available = info["MemFree"] + info["Active(file)"] + info["Inactive(file)"] + info["SReclaimable"]
        source = f"NUMA node {node} meminfo: MemFree + Active(file) + Inactive(file) + SReclaimable"
    else:
        text = _read("/proc/meminfo")
        if not text:
            raise HostError("cannot read the host's memory (/proc/meminfo); give it with --set vllm.cpu_memory_gib=GIB")
        info = _meminfo(text, node=False)
        total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
        source = "/proc/meminfo MemAvailable"
    limit = _read_int("/sys/fs/cgroup/memory.max")
    usage = _read_int("/sys/fs/cgroup/memory.current") if limit is not None else None
    if limit is None:
        limit = _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        if limit is not None and limit >= CGROUP_UNLIMITED:
            limit = None
        usage = _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes") if limit is not None else None
    if limit is not None and limit < total:
        total, available = limit, max(0, min(available, limit - (usage or 0)))
        source += f", clamped to the cgroup's limit {limit / GIB:.2f} GiB minus its usage"
    return total, available, source


def _cpu_name_and_bf16() -> tuple[str, bool]:
    text = _read("/proc/cpuinfo") or ""
    name = re.search(r"^(?:model name|Model|cpu model)\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    words = set(flags[1].split()) if flags else set()
    arm = platform.machine().lower() in ("aarch64", "arm64")
    bf16 = ("bf16" in words) if arm else bool(words & set(BF16_FLAGS))
    return (name[1].strip() if name else platform.processor() or platform.machine()), bf16


def detect_host(memory_gib: float | None = None) -> HostSpec:
    """This machine as vLLM's CPU backend will see it; ``memory_gib`` replaces the available memory
    (``vllm.cpu_memory_gib``: plan for another machine, or for less than is free now).

    Raises:
        HostError: the memory cannot be read, or ``memory_gib`` is not a positive finite number.
    """
    if memory_gib is not None and not (math.isfinite(memory_gib) and memory_gib > 0):
        raise HostError(f"vllm.cpu_memory_gib must be a positive number of GiB, got {memory_gib}")
    cpus = (
        tuple(sorted(os.sched_getaffinity(0)))
        if hasattr(os, "sched_getaffinity")
        else tuple(range(os.cpu_count() or 1))
    )
    by_core: dict[tuple[int, int], int] = {}
    for cpu in cpus:  # vLLM's auto keeps the last logical CPU of each core (x86 SMT-2)
        by_core[_core_of(cpu)] = cpu
    cores = tuple(sorted(by_core.values()))
    name, bf16 = _cpu_name_and_bf16()
    if memory_gib is not None:
        total = available = int(memory_gib * GIB)
        source = f"vllm.cpu_memory_gib {memory_gib:g}"
    else:
        total, available, source = read_memory(cpus[0])
    return HostSpec(name, total, available, cpus, cores, bf16, source)


@dataclass(frozen=True)
class Threads:
    """The OpenMP binding planned for vLLM's worker.

    Attributes:
        bind: ``VLLM_CPU_OMP_THREADS_BIND``'s value.
        count: compute threads (CPUs bound).
        derivation: why.
    """

    bind: str
    count: int
    derivation: str


def plan_threads(host: HostSpec, given: str = "auto") -> Threads:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``host``: one thread per physical core, one core left for
    the other processes from :data:`RESERVE_CORE_FROM` cores on; ``given`` (``vllm.cpu_threads_bind``)
    other than ``auto`` is kept as written.

    Raises:
        HostError: ``given`` is not a CPU list or ``nobind``, or
            names several ranks (``|``: tensor parallelism, not planned here).
    """
    if given == "auto":
        cores = list(host.cores)
        reserve = 1 if len(cores) >= RESERVE_CORE_FROM else 0
        bound = cores[: len(cores) - reserve]
        why = f"one thread per physical core of the {len(host.cpus)} CPUs allowed ({len(cores)} cores)" + (
            f", core {cores[-1]} left to vLLM's API server, engine core and the gateway"
            if reserve
            else f"; none reserved below {RESERVE_CORE_FROM} cores (vLLM's auto would compute on "
            f"{max(1, len(cores) - 1)})"
        )
        return Threads(format_cpu_list(bound), len(bound), why)
    if given == "nobind":
        return Threads(
            "nobind", len(host.cores), "vllm.cpu_threads_bind (given): no binding; threads counted as physical cores"
        )
    if "|" in given:
        raise HostError(f"vllm.cpu_threads_bind={given!r} names several ranks; ocrserve plans one CPU worker")
    ids = parse_cpu_list(given)
    outside = sorted(set(ids) - set(host.cpus))
    if outside:
        raise HostError(
            f"vllm.cpu_threads_bind={given!r} names CPUs {format_cpu_list(outside)} this process may not run on "
            f"(allowed: {format_cpu_list(host.cpus)})"
        )
    return Threads(given, len(set(ids)), "vllm.cpu_threads_bind (given)")
