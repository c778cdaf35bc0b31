"""Busy cores for a benchmark (``scripts/many_clients.py --hog``): processes that each keep one
core busy with a tight Python loop until stopped, so that a gateway can be measured on a machine
whose other work takes cores it counted on."""

from __future__ import annotations

import multiprocessing
import os
import signal

#: Loop turns between two looks at whether the parent is still there (a few tenths of a second).
CHECK_EVERY = 2_000_000
#: Seconds a process has to exit after SIGTERM before it is killed.
GRACE_S = 5.0


def spin(parent: int) -> None:
    """Keep one core busy until terminated, or until ``parent`` (a pid) is gone. Ctrl-C is left to
    the parent, which stops its hog on the way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    turns = 0
    while True:
        turns += 1
        if turns % CHECK_EVERY == 0 and os.getppid() != parent:
            return


class CpuHog:
    """``cores`` processes running :func:`spin` from :meth:`start` to :meth:`stop`; as a context
    manager, stopped on leaving however it is left (an exception or Ctrl-C included). Zero cores:
    nothing is started. The processes are spawned, not forked, so a parent with threads is safe."""

    def __init__(self, cores: int):
        if cores < 0:
            raise ValueError(f"cores={cores}: 0 or more")
        self.cores = cores
        self.processes: list[multiprocessing.process.BaseProcess] = []

    def start(self) -> CpuHog:
        """Start the processes (once; a second call does nothing)."""
        if self.processes or not self.cores:
            return self
        context = multiprocessing.get_context("spawn")
        for i in range(self.cores):
            process = context.Process(target=spin, args=(os.getpid(),), name=f"cpu-hog-{i}", daemon=True)
            process.start()
            self.processes.append(process)
        return self

    def stop(self) -> None:
        """Terminate the processes and wait for them (killed after :data:`GRACE_S`)."""
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
        self.processes = []

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
