"""OpenCV's work at the priority of the thread that asks for it (:mod:`ocrserve.priority`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Run in a fresh interpreter (OpenCV's pool is per process, and other tests start it). The main
#: thread blurs a large image first, as the engine's warm-up at normal priority does (where OpenCV
#: keeps a pool, this starts it); then a thread at SCHED_IDLE blurs it, and the script lists the
#: policy of each thread started since the process's first (numpy's and OpenCV's own at import)
#: that used CPU meanwhile (``/proc/self/task/*/stat``: utime + stime), the SCHED_IDLE one aside.
SCRIPT = """
import json, os, sys, threading
import cv2, numpy as np
from ocrserve.priority import BackgroundPriority, opencv_on_calling_threads
def cpu():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[tid] = (int(fields[11]) + int(fields[12]), os.sched_getscheduler(int(tid)))
    return out
first = set(cpu())
if sys.argv[1] == "on":
    opencv_on_calling_threads()
image = np.random.default_rng(0).integers(0, 255, (3000, 3000), dtype=np.uint8)
cv2.GaussianBlur(image, (31, 31), 0)
used = []
def work():
    BackgroundPriority("idle").apply()
    before = cpu()
    for _ in range(20):
        cv2.GaussianBlur(image, (31, 31), 0)
    after = cpu()
    me = str(threading.get_native_id())
    used.extend(
        after[t][1] for t in after if t not in first and t != me and after[t][0] > before.get(t, (0, 0))[0]
    )
worker = threading.Thread(target=work)
worker.start(); worker.join()
print(json.dumps({"cores": os.cpu_count(), "policies": used}))
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_opencv_work_of_a_sched_idle_thread_runs_at_sched_idle():
    """With :func:`~ocrserve.priority.opencv_on_calling_threads`, a SCHED_IDLE thread's OpenCV calls
    run on it alone; without it, OpenCV's own pool (threads of the normal policy, started from the
    main thread) does part of their work, where there are cores for a pool."""

    def policies(mode: str) -> tuple[int, list[int]]:  # cores, and the policies the script lists
        out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
        found = json.loads(out.stdout)
        return found["cores"], found["policies"]

    cores, on = policies("on")
    assert on == [], on
    if cores > 1:
        assert os.SCHED_OTHER in policies("off")[1]
