"""Fresh venvs for tests that install ocrserve as a user would (the wheel, README's commands),
without downloading anything: the new venv sees this venv's dependencies through a ``.pth`` line.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest


def share_dependencies(env_dir: Path) -> None:
    """Make this venv's site-packages visible to the venv at ``env_dir`` (a ``.pth`` path line).

    A plain path line does not run that directory's own ``.pth`` files, so this checkout's
    editable finder stays out: the new venv imports the ocrserve installed into it.
    """
    (site,) = (env_dir / "lib").glob("python*/site-packages")
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "zz_ocrserve_test_deps.pth").write_text("".join(f"{path}\n" for path in ours))


def clean_env(venv_dir: Path, data_home: Path) -> dict[str, str]:
    """This environment less anything pointing at the checkout or configuring ocrserve, with
    ``venv_dir`` first on ``PATH`` (as if activated) and the data folder under ``data_home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not (k.startswith("OCRSERVE_") and k != "OCRSERVE_TEST_LOGS")
    }
    env["PATH"] = f"{venv_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv_dir)
    env["XDG_DATA_HOME"] = str(data_home)  # the job store and uploads, not in ~
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def require_setuptools() -> None:
    """Skip unless this venv's setuptools can build ocrserve without build isolation (77+ reads the
    SPDX ``license``)."""
    setuptools = pytest.importorskip(
        "setuptools", reason="building ocrserve needs setuptools: pip install -e '.[test]'"
    )
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(
            f"setuptools {setuptools.__version__} cannot build this pyproject.toml (SPDX license "
            "expression); pip install 'setuptools>=77' into this venv"
        )
