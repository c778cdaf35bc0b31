"""README's commands, as written: "Fresh machine: run it" starts the gateway in a copy of the
checkout, then "Use it" runs against it, and so do the commands of the documentation site's pages
that run against such a gateway (:data:`SITE_COMMANDS`), so README, the site and the code cannot
drift apart.

Only the environment differs from a new user's machine, never the commands: ``python3`` is this
venv's base interpreter; pip installs from no index, without build isolation, finding the
dependencies of this venv (:func:`tests.venvs.share_dependencies`: nothing is downloaded); and the
gateway gets a free port (``OCRSERVE_SERVER__PORT``, with ``127.0.0.1:8000`` in the "Use it"
commands and ``OCRSERVE_URL`` pointing there), so a gateway already on 8000 does not interfere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from ocrserve.bench.harness import LocalGateway, free_port
from tests import needs
from tests.venvs import clean_env, require_setuptools, share_dependencies

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: The site's pages and headings whose first ```bash block runs against the gateway of "Fresh
#: machine: run it", in the checkout's copy.
SITE_COMMANDS = [
    ("docs/getting-started.md", "Use it"),
    ("docs/api.md", "`POST /v1/ocr`: one document, answered in the request"),
    ("docs/api.md", "The web page's endpoints"),
    ("docs/jobs.md", "Submit a job"),
]

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (needs.which("curl") and needs.which("jq")),
        reason="README's commands use curl and jq (Debian: apt-get install -y curl jq)",
    ),
]


def fenced(section: str, text: str = README) -> str:
    """The first ```bash block under the ``## {section}`` heading of ``text`` (README)."""
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)```", body, re.S).group(1)


def copy_checkout(target: Path) -> Path:
    """The files git tracks (and those it would, untracked), copied to ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


class ReadmeGateway(LocalGateway):
    """README's "Fresh machine: run it" command, in its own process group (stopped by the harness)."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path):
        self.port = int(env["OCRSERVE_SERVER__PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", command], cwd=cwd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT, env=env
            )


@pytest.fixture(scope="module")
def fresh_machine(tmp_path_factory):
    """The checkout copied, README's first command running in it: ``(copy, env, gateway)``."""
    require_setuptools()
    base = tmp_path_factory.mktemp("readme")
    repo = copy_checkout(base / "ocrserve")
    shim = base / "bin"
    shim.mkdir()
    (shim / "python3").symlink_to(Path(getattr(sys, "_base_executable", sys.executable)).resolve())
    # pip first (ensurepip would take ours, through the .pth, for the venv's own), then this venv's
    # setuptools, which builds ocrserve, rather than the older one ensurepip may bring along
    venv.create(repo / ".venv", with_pip=True, symlinks=True)
    python = repo / ".venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, capture_output=True)
    share_dependencies(repo / ".venv")
    port = free_port()
    env = clean_env(repo / ".venv", base / "data")
    env |= {
        "PATH": f"{shim}{os.pathsep}{env['PATH']}",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this as --no-build-isolation
        "OCRSERVE_SERVER__PORT": str(port),
        "OCRSERVE_URL": f"http://127.0.0.1:{port}",
        "COLUMNS": "200",
    }
    gateway = ReadmeGateway(fenced("Fresh machine: run it"), repo, env, base / "launch.log")
    try:
        gateway.wait_ready(timeout=300)
    except RuntimeError as exc:
        gateway.stop()
        pytest.fail(f"README's fresh-machine command: {exc}\n{(base / 'launch.log').read_text()[-6000:]}")
    yield repo, env, gateway
    gateway.stop()


def run_block(commands: str, repo: Path, env: dict[str, str], gateway: ReadmeGateway) -> subprocess.CompletedProcess:
    """``commands`` run by bash (``-e -o pipefail``) in the checkout's copy, against ``gateway``."""
    commands = commands.replace("127.0.0.1:8000", f"127.0.0.1:{gateway.port}")
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", commands], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done


def test_readme_use_it_commands_work_as_written(fresh_machine):
    repo, env, gateway = fresh_machine
    done = run_block(fenced("Use it"), repo, env, gateway)
    first, _ = json.JSONDecoder().raw_decode(done.stdout)  # the curl of examples/phototest.tif
    assert "12 point text" in first["text"] and first["model"] == "rapidocr/PP-OCRv6-small"
    assert "phototest.tif: 1 page(s)" in done.stdout and "testTIFF_multipage.tif: 2 page(s)" in done.stdout
    written = sorted(p.name for p in (repo / "results").iterdir())
    assert written == [".ocrserve-batch", "phototest.tif.md", "testTIFF_multipage.tif.md"]  # + the done records
    assert "Traceback" not in gateway.log.read_text()


@pytest.mark.parametrize("page, section", SITE_COMMANDS, ids=lambda item: item.replace(" ", "-"))
def test_site_commands_work_as_written(fresh_machine, page, section):
    repo, env, gateway = fresh_machine
    run_block(fenced(section, (ROOT / page).read_text()), repo, env, gateway)
    assert "Traceback" not in gateway.log.read_text()
