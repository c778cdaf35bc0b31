"""The documentation site against the code: the generated pages are what the code gives now
(``scripts/gen_docs.py --check``), the site builds with ``mkdocs build --strict`` (a broken link,
anchor or missing page fails), and every ``ocrserve`` command line in README and the site's
```bash blocks names a real command and only options that command has."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ocrserve.cli import app
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_generated_pages_match_the_code():
    gen_docs = load_script("gen_docs")
    assert gen_docs.main(["--check"]) == 0, "run python scripts/gen_docs.py and commit docs/reference/"


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="building the site needs MkDocs: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the site's theme: pip install -e '.[docs]'")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def command_lines(text: str) -> list[str]:
    """The ``ocrserve ...`` invocations of ``text``'s ```bash blocks, continuation lines joined,
    each cut at the first shell operator (``|``, ``&&``, ``;``, ``&``) or comment."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#"):
                continue
            for part in re.split(r"\s(?:\||&&|;|&)\s|\s#|\s&$", line):
                match = re.search(r"(?:^|\s|\.venv/bin/)(ocrserve\s.*)", part)
                if match:
                    found.append(match.group(1).strip())
    return found


def invocations() -> list[tuple[str, str]]:
    """``(page, command line)`` of every page."""
    return [(page.name, line) for page in PAGES for line in command_lines(page.read_text())]


def test_the_pages_hold_command_lines():
    assert len(invocations()) > 40


@pytest.mark.parametrize("page, line", invocations(), ids=[f"{p}:{line[:60]}" for p, line in invocations()])
def test_command_line_names_real_options(page, line):
    words = shlex.split(line.replace("<", "").replace(">", ""))[1:]
    command = typer.main.get_command(app)
    path = ["ocrserve"]
    while hasattr(command, "list_commands") and words:  # a group: the next word names a command
        name = words.pop(0)
        ctx = command.context_class(command, info_name=name)
        assert name in command.list_commands(ctx), f"{page}: no command {' '.join([*path, name])!r}: {line}"
        command, path = command.get_command(ctx, name), [*path, name]
    options = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]} | {"--help"}
    used = [word.split("=", 1)[0] for word in words if word.startswith("-") and word != "-"]
    unknown = [word for word in used if word not in options]
    assert not unknown, f"{page}: {' '.join(path)} has no option {unknown}: {line}"
