"""How work that can wait yields the cores to work that cannot, by the OS's own means (Linux):
the threads of the embedded engine that run bulk pages' stages
(:mod:`ocrserve.engines.stage_scheduler`) and the processes that decode bulk documents
(:mod:`ocrserve.preprocess.pool`) run at a :class:`BackgroundPriority`, and OpenCV's work runs on
the thread that asks for it (:func:`opencv_on_calling_threads`).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackgroundPriority:
    """How a thread that runs only background work (a bulk page's stages, a bulk document's
    decoding) yields the cores to interactive work (``engine.onnx.background_scheduling`` and
    ``background_nice``, ``preprocess.background_scheduling`` and ``background_nice``).

    Attributes:
        scheduling: ``idle``: the SCHED_IDLE policy (``man 7 sched``): a core only when no thread of
            a normal policy wants one; ``nice``: ``nice`` added to the thread's nice value.
        nice: for ``nice``; 0 leaves the threads as they are.

    In the engine alone (2 cores), a phototest page every 0.3 s beside two 4-page documents of
    turned pages run as bulk in a loop took 0.50 and 0.54 s on average at ``idle`` (0.49 and
    0.51 s with nothing beside it), and 0.67 and 0.72 s at nice 10 (0.54 and 0.54 s): at nice 10
    a background thread still takes 110 / 1134 of a core it shares.
    """

    scheduling: Literal["idle", "nice"] = "nice"
    nice: int = 0

    def apply(self) -> None:
        """Lower the calling thread's priority (Linux, where policy and nice value are per-thread
        attributes: ``man 2 setpriority``, BUGS; threads it starts later inherit it); elsewhere,
        or where refused, log and carry on.

        Neither needs a privilege; neither can be undone without CAP_SYS_NICE, so this is for
        threads (and processes, from their first thread) that only ever run background work.
        """
        try:
            if self.scheduling == "idle":
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            elif self.nice:
                thread = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + self.nice)
        except (AttributeError, OSError) as exc:
            log.warning("cannot lower the priority of a background thread or process: %s", exc)


def opencv_on_calling_threads() -> None:
    """Run OpenCV's functions on the thread that calls them, for the whole process
    (``cv2.setNumThreads(1)``): OpenCV's parallel loops otherwise run on a pool of its own, whose
    threads keep the priority of the thread that first used it, so the resizes, contours and crops
    of a background page's stages, and of a background count, ran at normal priority beside the
    interactive page they were to yield to.

    Measured through the gateway (2026-12-05, 2-core Intel Xeon; a phototest page every 0.5 s
    beside 12 clients posting a 4-page PDF of turned pages marked bulk, development seed 22, p95
    over 76-80 pages against 20 idle ones, runs alternated): with OpenCV's pool 0.95 and 0.95 s
    (1.24 and 1.26 times idle), the interactive page's detection p95 0.47 and 0.48 s; on the
    calling threads 0.90 and 0.85 s (1.18 and 1.11 times idle), detection 0.36 and 0.38 s. Idle,
    the page took 0.46-0.47 s in the engine either way."""
    import cv2  # opencv-python-headless, a dependency of rapidocr; not imported where unused

    cv2.setNumThreads(1)
