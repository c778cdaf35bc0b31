"""The skips of a test run, recorded and checked: every test that needs something a fresh machine
lacks (an extra, a Debian program, the corpus) must skip saying what, and how to get it.

As a pytest plugin (hooks imported by ``tests/conftest.py``): with ``OCRSERVE_TEST_SKIPS=FILE``
set, each skipped test or module is appended to FILE as a JSON line ``{"nodeid", "reason"}``.

As a script (``python -m tests.skips FILE --nodeids OUT``): prints the skips grouped by reason,
writes their tests to OUT and exits 1 where a reason names no remedy. OUT holds one test a line,
a module or a test function with all its parameters (a parameter's id may exist only where
something is missing, as ``[corpus-missing]``); ``pytest @OUT`` runs them again where everything
is installed. A remedy is an install command (``pip install``, ``apt-get install``,
``scripts/vllm-cpu-env``), the corpus's variable (``OCRSERVE_CORPUS``), the slow tier's
(``OCRSERVE_TEST_SLOW=1``, ``tests/needs.py``), or one of
:data:`NOT_MISSING`: a skip because of what the machine *has* (a GPU, an extra that makes the test
moot), which no install would lift.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

#: The environment variable naming the file the plugin appends to.
REPORT_ENV = "OCRSERVE_TEST_SKIPS"
#: Phrases of a reason that say how to get what is missing.
REMEDIES = ("pip install", "apt-get install", "OCRSERVE_CORPUS", "scripts/vllm-cpu-env", "OCRSERVE_TEST_SLOW=1")
#: Phrases of a reason that is not a missing dependency (the machine has something, or is not root).
NOT_MISSING = (
    "is installed here",
    "GPU is visible",
    "nvidia-smi is on PATH",
    "this machine has a GPU",
    "needs root",
    "CAP_SYS_ADMIN",
)


def pytest_collectreport(report) -> None:
    """A module skipped at collection (``importorskip`` at its top)."""
    if report.skipped:
        _record(report.nodeid, report.longrepr)


def pytest_runtest_logreport(report) -> None:
    """A test skipped in its setup or call (not an xfail, which pytest also reports as skipped)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _record(report.nodeid, report.longrepr)


def _record(nodeid: str, longrepr) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"nodeid": nodeid, "reason": reason}) + "\n")


def unexplained(reason: str) -> bool:
    """Whether ``reason`` names neither a remedy nor a reason that is not a missing dependency."""
    return not any(phrase in reason for phrase in (*REMEDIES, *NOT_MISSING))


def main(argv: list[str] | None = None) -> int:
    """Print ``report``'s skips grouped by reason, write their node ids; 1 where one is unexplained."""
    parser = argparse.ArgumentParser(prog="python -m tests.skips", description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the JSON lines the plugin wrote")
    parser.add_argument("--nodeids", type=Path, help="write the skipped tests here, one a line, without parameters")
    args = parser.parse_args(argv)
    lines = args.report.read_text(encoding="utf-8").splitlines() if args.report.exists() else []
    skips = [json.loads(line) for line in lines]
    by_reason: dict[str, list[str]] = defaultdict(list)
    for skip in skips:
        by_reason[skip["reason"]].append(skip["nodeid"])
    bad = 0
    for reason, nodeids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        flag = "UNEXPLAINED " if unexplained(reason) else ""
        bad += bool(flag)
        print(f"{len(nodeids):4d} skipped  {flag}{reason}")
    print(f"{len(skips)} skips, {len(by_reason)} reasons, {bad} without a remedy")
    if args.nodeids:
        tests = dict.fromkeys(skip["nodeid"].split("[", 1)[0] for skip in skips)
        args.nodeids.write_text("".join(f"{test}\n" for test in tests))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
