"""Start ocrserve with the ``vllm serve`` it plans and supervises, the gateway in front of it.

Profiles whose gateway runs alone (``onnx``, ``transformers``, ``vllm`` with
``engine.vllm.base_urls``) start from :func:`ocrserve.gateway.run_gateway`. A ``vllm`` profile
without ``base_urls`` (``prod``) runs :func:`run_with_vllm`:

1. :func:`plan_for` plans ``vllm serve`` (``ocrserve.gpu.planner`` fills every ``auto``; with
   ``vllm.device: cpu``, ``ocrserve.gpu.cpu_planner`` plans vLLM's CPU backend on this host,
   including the environment its process needs); the caller prints the plan and both command lines;
2. ``vllm serve`` starts in its own process group, its output streamed line by line with a
   ``vllm | `` prefix;
3. the launcher waits for vLLM's ``/health``; if vLLM exits first (or ``vllm.health_timeout_s``
   passes) it stops with :class:`VllmStartError`, which ends with vLLM's last log lines;
4. the gateway (:mod:`ocrserve.gateway`) starts in this process, its engine pointed at that vLLM
   with the planned batch as its slots (:func:`gateway_config`);
5. if vLLM dies it is restarted after ``vllm.restart_backoff_s``, doubling on each quick failure up
   to ``vllm.restart_backoff_max_s`` (back to the start once it has stayed up that long).
   Meanwhile the engine's health poll marks it down: the gateway is not ready (503 with
   ``Retry-After``) and pages in flight fail as transient;
6. SIGINT or SIGTERM: the gateway stops accepting and drains in-flight requests (at most
   :data:`ocrserve.gateway.GRACEFUL_SHUTDOWN_S`; a second SIGINT skips the drain), then vLLM's
   process group gets SIGTERM and, after ``vllm.stop_timeout_s``, SIGKILL, so none of its processes
   outlive the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import deque
from collections.abc import Mapping

import httpx

from ocrserve import backoff
from ocrserve.config import Config, VllmConfig
from ocrserve.gateway import GatewayServer, listening_socket, say, uvicorn_config
from ocrserve.gpu.cpu_planner import plan_cpu_serving
from ocrserve.gpu.host import detect_host
from ocrserve.gpu.lengths import load as load_lengths
from ocrserve.gpu.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from ocrserve.gpu.planner import Plan, plan_serving
from ocrserve.gpu.registry import resolve_gpu
from ocrserve.models import ModelSpec, get_model

#: Prefix of every line vLLM writes, as the launcher relays it to stderr.
LOG_PREFIX = "vllm | "
#: vLLM log lines kept for the error when it exits before it is healthy.
LOG_TAIL_LINES = 40
#: Seconds between /health probes while vLLM starts.
HEALTH_POLL_S = 0.5
#: Longest vLLM log line read in one piece, bytes (longer ones are cut).
LOG_LINE_LIMIT = 1 << 20
#: Seconds between checks whether vLLM's main process has exited.
EXIT_POLL_S = 0.2


def manages_vllm(config: Config) -> bool:
    """Whether ``ocrserve launch`` starts vLLM itself: the vLLM engine with no servers listed."""
    return config.engine.kind == "vllm" and not config.engine.vllm.base_urls


def plan_for(config: Config) -> Plan:
    """Plan ``vllm serve`` for a profile: its model, pixel budget, ``vllm`` section and GPU, or
    with ``vllm.device: cpu`` this host for vLLM's CPU backend (:func:`plan_cpu_for`).

    ``vllm.gpu`` names the GPU (``auto``: detect it, and use every GPU of its kind unless
    ``vllm.gpus`` says otherwise); the ``vllm`` engine arguments that are not ``auto`` are kept.

    Raises:
        ocrserve.models.ModelError: unknown model.
        ocrserve.gpu.registry.GpuError: unknown GPU name, or no GPU found for ``auto``.
        ocrserve.gpu.host.HostError: the host's memory cannot be read (CPU).
        ocrserve.gpu.planner.PlanError: the model does not fit (the message says what would), or
            (CPU) its attention head size has no kernel in vLLM's CPU backend.
    """

    if config.vllm.device == "cpu":
        return plan_cpu_for(config)
    v = config.vllm
    spec = get_model(config.engine.model)
    gpu, detected = resolve_gpu(v.gpu, v.gpu_memory_gib)
    return plan_serving(
        spec,
        gpu,
        gpus=detected if v.gpus == "auto" else v.gpus,
        gpu_memory_utilization=(
            DEFAULT_GPU_MEMORY_UTILIZATION if v.gpu_memory_utilization == "auto" else v.gpu_memory_utilization
        ),
        **_plan_arguments(config, spec),
        output_lengths=load_lengths(v.output_lengths) if v.output_lengths else None,
        overflow_target=v.kv_overflow_target,
        speculative=v.speculative,
    )


def plan_cpu_for(config: Config) -> Plan:
    """:func:`~ocrserve.gpu.cpu_planner.plan_cpu_serving` for a profile on this host.

    Raises:
        as :func:`plan_for`.
    """
    v = config.vllm
    spec = get_model(config.engine.model)
    return plan_cpu_serving(
        spec,
        detect_host(v.cpu_memory_gib),
        **_plan_arguments(config, spec),
        kv_cache_fraction=v.cpu_kv_cache_fraction,
        kv_cache_max_gib=v.cpu_kv_cache_max_gib,
        threads_bind=v.cpu_threads_bind,
    )


def _plan_arguments(config: Config, spec: ModelSpec) -> dict:
    """The planner arguments a GPU and a CPU plan take alike from a profile for its model
    ``spec``: the pixel budget, ``vllm`` settings that are not ``auto`` and the gateway's pages in
    flight."""
    v, pre = config.vllm, config.preprocess
    return {
        "min_pixels": pre.min_pixels if spec.supports_pixel_budget else None,
        "max_pixels": pre.max_pixels,
        "factor": pre.factor,
        "max_num_seqs": None if v.max_num_seqs == "auto" else v.max_num_seqs,
        "overrides": v.model_dump(),
        "vllm_version": None if v.version == "auto" else v.version,
        "gateway_overcommit": config.router.slot_overcommit,
        "gateway_burst": config.router.fast.burst_slots,
    }


#: Variables removed from the environment of a CPU plan's ``vllm serve``: the legacy
#: ``VLLM_CPU_KVCACHE_SPACE`` (GiB) replaces ``--kv-cache-memory-bytes`` in vLLM's CPU platform
#: (``vllm/platforms/cpu.py`` ``check_and_update_config``), which would undo the plan.
CPU_ENV_REMOVED = ("VLLM_CPU_KVCACHE_SPACE",)


def vllm_environment(plan: Plan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the planned ``vllm serve``: ``base`` (default: this process's) with the
    plan's variables set, and for a CPU plan :data:`CPU_ENV_REMOVED` removed."""
    env = dict(os.environ if base is None else base)
    if plan.device == "cpu":
        for name in CPU_ENV_REMOVED:
            env.pop(name, None)
    env.update(plan.env)
    return env


def vllm_command(config: Config, plan: Plan) -> list[str]:
    """The planned ``vllm serve`` argv with ``vllm.executable`` and ``vllm.extra_args``."""
    return plan.argv(config.vllm.executable) + list(config.vllm.extra_args)


def vllm_url(config: Config) -> str:
    """Where the launched vLLM answers (a wildcard bind address is reached on loopback)."""
    host = config.vllm.host
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{config.vllm.port}"


def gateway_config(config: Config, plan: Plan) -> Config:
    """The gateway's profile: its engine reaches the launched vLLM, and unless
    ``engine.vllm.slots_per_replica`` is set, takes the planned ``--max-num-seqs`` (times the
    data-parallel replicas behind that one server) as its slots."""
    gateway = config.model_copy(deep=True)
    gateway.engine.vllm.base_urls = [vllm_url(config)]
    if gateway.engine.vllm.slots_per_replica == "auto":
        replicas = plan.gpus if plan.strategy == "replicas" else 1
        gateway.engine.vllm.slots_per_replica = int(plan.vllm_args["max_num_seqs"]) * replicas
    return gateway


class VllmStartError(RuntimeError):
    """vLLM could not be started, exited before it was healthy, or never answered ``/health``;
    the message ends with its last log lines."""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class VllmProcess:
    """One ``vllm serve`` in its own process group, its log relayed to stderr.

    Args:
        argv: the command line.
        url: its server root (``http://host:port``) for ``/health``.
        cfg: the ``vllm`` section (``health_timeout_s``, ``stop_timeout_s``).
        env: its environment (default: this process's; :func:`vllm_environment`).
    """

    def __init__(self, argv: list[str], url: str, cfg: VllmConfig, env: Mapping[str, str] | None = None):
        self.argv, self.url, self.cfg = argv, url, cfg
        self.env = None if env is None else dict(env)
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.proc: asyncio.subprocess.Process | None = None
        self._relay: asyncio.Task | None = None

    async def start(self, stop: asyncio.Event) -> bool:
        """Start vLLM and wait until ``/health`` answers 200.

        Returns:
            True once healthy; False if ``stop`` was set first (vLLM is then left to :meth:`stop`).

        Raises:
            VllmStartError: the executable cannot run, vLLM exited, or the health timeout passed
                (vLLM is stopped first).
        """
        self.tail.clear()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                limit=LOG_LINE_LIMIT,
                env=self.env,
            )
        except OSError as exc:
            raise VllmStartError(f"cannot run {self.argv[0]!r} (vllm.executable): {exc}") from None
        self._relay = asyncio.create_task(self._relay_log(self.proc.stdout), name="ocrserve-vllm-log")
        say(f"started vLLM (pid {self.proc.pid}); waiting for {self.url}/health")
        return await self._wait_healthy(stop)

    async def _wait_healthy(self, stop: asyncio.Event) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.health_timeout_s
        async with httpx.AsyncClient(timeout=HEALTH_POLL_S * 4) as client:
            while not stop.is_set():
                if self.proc.returncode is not None:
                    await self.stop()
                    raise VllmStartError(
                        f"vLLM exited with code {self.proc.returncode} before it was healthy; "
                        f"its last lines:\n{self._tail_text()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/health")).status_code == 200:
                        return True
                if loop.time() > deadline:
                    await self.stop()
                    raise VllmStartError(
                        f"vLLM did not answer {self.url}/health within "
                        f"{self.cfg.health_timeout_s:g} s (vllm.health_timeout_s); its last "
                        f"lines:\n{self._tail_text()}"
                    )
                await asyncio.sleep(HEALTH_POLL_S)
        return False

    def _tail_text(self) -> str:
        return "\n".join(LOG_PREFIX + line for line in self.tail) or f"{LOG_PREFIX}(no output)"

    async def _relay_log(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line beyond LOG_LINE_LIMIT: take what the buffer holds
                raw = await stream.read(LOG_LINE_LIMIT)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            print(LOG_PREFIX + line, file=sys.stderr, flush=True)

    async def wait(self) -> int:
        """Wait for vLLM's main process to exit; its exit status (negative: killed by that signal).

        Polls ``returncode``: ``Process.wait()`` also waits for the log pipe to close, which never
        happens while a process left over from vLLM's group holds it (:meth:`stop` kills those).
        """
        while self.proc.returncode is None:
            await asyncio.sleep(EXIT_POLL_S)
        return self.proc.returncode

    async def stop(self) -> None:
        """SIGTERM vLLM's process group, SIGKILL it after ``vllm.stop_timeout_s``; then SIGKILL
        whatever is left of the group (vLLM's engine and worker processes) and finish the log."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.wait(), self.cfg.stop_timeout_s)
            except asyncio.TimeoutError:
                say(f"vLLM did not stop within {self.cfg.stop_timeout_s:g} s; killing it")
        _killpg(self.proc.pid, signal.SIGKILL)
        await self.wait()
        if self._relay:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._relay, 5)


async def supervise(vllm: VllmProcess, stop: asyncio.Event, cfg: VllmConfig) -> None:
    """Restart vLLM whenever it exits unasked (see the module docstring for the back-off);
    return once ``stop`` is set."""
    loop = asyncio.get_running_loop()
    healthy_at, failures = loop.time(), 0  # failures: quick exits and failed restarts in a row
    while True:
        code = await vllm.wait()
        if stop.is_set():
            return
        await vllm.stop()
        quick = loop.time() - healthy_at < cfg.restart_backoff_max_s
        failures = failures + 1 if quick else 1
        delay = backoff.delay(failures, cfg.restart_backoff_s, cfg.restart_backoff_max_s)
        say(f"vLLM exited with code {code}; restarting it in {delay:g} s")
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            try:
                if not await vllm.start(stop):
                    return
                break
            except VllmStartError as exc:
                failures += 1
                delay = backoff.delay(failures, cfg.restart_backoff_s, cfg.restart_backoff_max_s)
                say(str(exc))
                say(f"restarting vLLM in {delay:g} s")
        healthy_at = loop.time()
        say("vLLM is healthy again")


class _Gateway(GatewayServer):
    """uvicorn with SIGINT/SIGTERM left to the launcher, which stops vLLM after the drain (uvicorn's
    own handling re-raises the signal after shutdown, which would end the process first).

    ``capture_signals`` is an internal of uvicorn's ``Server``: ``pyproject.toml`` pins uvicorn to the
    releases tested and ``tests/test_uvicorn_private.py`` checks that ``serve`` still goes through it."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def run_with_vllm(config: Config, plan: Plan) -> int:
    """Start vLLM for ``plan``, then the gateway; supervise vLLM until SIGINT/SIGTERM.

    Returns:
        0 after a signal stopped both.

    Raises:
        VllmStartError: vLLM did not become healthy the first time.
        ocrserve.gateway.AddressTaken: the gateway's address cannot be bound (checked before vLLM starts).
        SystemExit: the gateway could not start (uvicorn's status); vLLM is stopped first.
    """
    return asyncio.run(_serve_with_vllm(config, plan))


async def _serve_with_vllm(config: Config, plan: Plan) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    gateway = gateway_config(config, plan)
    listening = listening_socket(gateway)  # before vLLM starts
    server = _Gateway(uvicorn_config(gateway))

    def on_signal() -> None:
        if stop.is_set():
            server.force_exit = True
        stop.set()
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    vllm = VllmProcess(
        vllm_command(config, plan), gateway.engine.vllm.base_urls[0], config.vllm, vllm_environment(plan)
    )
    try:
        if not await vllm.start(stop):
            return 0
        say(f"vLLM is healthy; starting the gateway on http://{config.server.host}:{config.server.port}")
        watch = asyncio.create_task(supervise(vllm, stop, config.vllm), name="ocrserve-vllm-supervisor")
        try:
            await server.serve(sockets=[listening])
        finally:
            stop.set()
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    finally:
        say("stopping vLLM")
        await vllm.stop()
    return 0
