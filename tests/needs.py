"""What a test needs beyond the ``test`` extra — a Debian program, the corpus, or the time of the
slow tier — found or skipped with the reason that names how to get it.

``OCRSERVE_TEST_WITHOUT`` (comma-separated program names, e.g. ``redis-server,chromium``) makes
these look-ups report the programs named as absent. CI's first run sets it for the programs its
machine has installed but a fresh machine lacks, so that README's test command is shown to skip,
with its reason, every test that needs one (``.ci/run``); the look-up code path is the one a
fresh machine takes, only its answer differs.

The tests marked ``slow`` (end-to-end ones of 15 s or more on 2 cores: a wheel built and launched,
a gateway killed and restarted, a whole benchmark run) skip unless ``OCRSERVE_TEST_SLOW=1``
(:func:`pytest_collection_modifyitems`), which keeps README's test command within 15 minutes;
CI runs them with everything else it skipped (``.ci/run``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ocrserve.evaluation import CORPUS_ENV, corpus_path

#: The environment variable naming the programs to treat as absent.
WITHOUT_ENV = "OCRSERVE_TEST_WITHOUT"
#: The environment variable that runs the tests marked ``slow`` (``1``).
SLOW_ENV = "OCRSERVE_TEST_SLOW"


def corpus_missing() -> str:
    """Why a test of the corpus skips: where it was looked for
    (:func:`~ocrserve.evaluation.corpus_path`) and how to point at it."""
    return f"corpus not found at {corpus_path()} (set {CORPUS_ENV} to its folder)"


def hidden(name: str) -> bool:
    """Whether ``OCRSERVE_TEST_WITHOUT`` names the program ``name``."""
    return name in {item.strip() for item in os.environ.get(WITHOUT_ENV, "").split(",")}


def which(name: str) -> str | None:
    """``shutil.which(name)``, None for a program that ``OCRSERVE_TEST_WITHOUT`` hides."""
    return None if hidden(name) else shutil.which(name)


def program(name: str, package: str | None = None) -> str:
    """The path of the program ``name``; skips the test where it is absent.

    Args:
        name: the executable's name on ``PATH``.
        package: the Debian package that installs it (default: ``name``).
    """
    path = which(name)
    if path is None:
        pytest.skip(f"{name} not found (Debian: apt-get install -y {package or name})")
    return path


def file(path: Path, package: str) -> Path:
    """``path``, a program installed at a fixed place (``/usr/bin/chromium``); skips the test where it
    is absent, or hidden by its file name."""
    if hidden(path.name) or not path.exists():
        pytest.skip(f"no {path.name} at {path} (Debian: apt-get install -y {package})")
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the tests marked ``slow`` unless ``OCRSERVE_TEST_SLOW=1`` (module docstring)."""
    if os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"a slow end-to-end test, left to CI: run it with {SLOW_ENV}=1")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
