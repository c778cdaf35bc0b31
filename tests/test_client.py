"""The command-line client (``ocrserve ocr``) against the session gateway, and its file collection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ocrserve.bench.harness import free_port
from ocrserve.cli.common import documents_or_exit
from ocrserve.client import idempotency_key
from ocrserve.inputs import NOT_A_FILE, collect_documents
from tests import needs
from tests.conftest import DATA, Gateway, ground_truth, wait_for


def test_documents_are_named_relative_to_the_folder_they_were_found_in(tmp_path):
    (tmp_path / "scans" / "a").mkdir(parents=True)
    (tmp_path / "scans" / "a" / "x.tif").write_bytes(b"")
    (tmp_path / "scans" / "notes.txt").write_text("not a document")
    (tmp_path / "y.png").write_bytes(b"")
    (tmp_path / "scans" / "a" / "README").write_text("not a document")
    skipped = Counter()
    found = collect_documents([tmp_path / "scans", tmp_path / "y.png", tmp_path / "scans" / "a" / "x.tif"], skipped)
    assert found == {tmp_path / "scans" / "a" / "x.tif": Path("a/x.tif"), tmp_path / "y.png": Path("y.png")}
    assert skipped == {".txt": 1, "": 1}


def test_the_cli_says_how_many_files_of_a_folder_it_leaves(tmp_path, capsys):
    (tmp_path / "x.png").write_bytes(b"")
    for name in ("a.txt", "b.txt", "c.json"):
        (tmp_path / name).write_text("{}")
    assert documents_or_exit([tmp_path]) == {tmp_path / "x.png": Path("x.png")}
    note = " ".join(capsys.readouterr().err.split())
    assert "3 files found are not documents and are left (2 .txt, 1 .json)" in note


def test_two_documents_that_would_share_a_result_name_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.tif").write_bytes(b"")
    with pytest.raises(ValueError, match=r"a/x.tif and .*b/x.tif would both be written as x.tif"):
        collect_documents([tmp_path / "a" / "x.tif", tmp_path / "b" / "x.tif"])
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        collect_documents([tmp_path / "missing.pdf"])


def _touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_a_glob_names_what_it_matches_relative_to_the_folder_before_its_wildcard(tmp_path):
    archive = tmp_path / "archive"
    _touch(archive / "2024" / "same.pdf", archive / "2025" / "same.pdf", archive / "notes.txt")
    found = collect_documents([archive / "**" / "*.pdf"])
    assert found == {
        archive / "2024" / "same.pdf": Path("2024/same.pdf"),
        archive / "2025" / "same.pdf": Path("2025/same.pdf"),
    }
    with pytest.raises(FileNotFoundError, match=r"no document matches .*\*\.tif"):
        collect_documents([archive / "**" / "*.tif"])


def test_links_to_folders_are_followed_once_and_hidden_and_output_folders_left(tmp_path):
    scans, elsewhere = tmp_path / "scans", tmp_path / "mnt" / "2024"
    _touch(elsewhere / "a.png", scans / "b.png", scans / ".git" / "c.png", scans / "results" / "d.png")
    (scans / "2024").symlink_to(elsewhere)
    (scans / "loop").symlink_to(scans)  # back to a folder already searched
    (scans / "dangling.png").symlink_to(tmp_path / "gone.png")
    os.mkfifo(scans / "fifo.png")
    skipped = Counter()
    found = collect_documents([scans, tmp_path / "scans" / ".." / "scans"], skipped, exclude=scans / "results")
    assert found == {scans / "2024" / "a.png": Path("2024/a.png"), scans / "b.png": Path("b.png")}
    assert skipped == {NOT_A_FILE: 2}
    with pytest.raises(FileNotFoundError, match="not a regular file or folder: .*fifo.png"):
        collect_documents([scans / "fifo.png"])


def test_cli_out_keeps_subfolders_so_same_names_do_not_collide(gateway, tmp_path):
    for folder, sample in (("a", "phototest.tif"), ("b", "testTIFF_multipage.tif")):
        (tmp_path / "in" / folder).mkdir(parents=True)
        (tmp_path / "in" / folder / "x.tif").write_bytes((DATA / sample).read_bytes())
    command = [
        sys.executable,
        "-m",
        "ocrserve",
        "ocr",
        str(tmp_path / "in"),
        "--out",
        str(tmp_path / "out"),
        "--url",
        gateway.url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"2 done, 0 skipped (already in {tmp_path / 'out'}), 0 failed" in done.stderr
    assert (tmp_path / "out" / "a" / "x.tif.txt").read_text().startswith(ground_truth("phototest.tif")[:30])
    assert (tmp_path / "out" / "b" / "x.tif.txt").read_text().startswith("Multipage\nTIFF\nExample\nPage 1")


def test_cli_json_on_stdout_is_json_lines_and_the_bar_names_its_unit(gateway, tmp_path):
    """Several documents with ``--format json`` on stdout: one JSON object a line, with its
    ``file`` (``jq`` reads it); the progress bar on stderr counts documents and says so."""
    (tmp_path / "in").mkdir()
    for sample in ("phototest.tif", "testTIFF_multipage.tif"):
        (tmp_path / "in" / sample).write_bytes((DATA / sample).read_bytes())
    command = [sys.executable, "-m", "ocrserve", "ocr", str(tmp_path / "in"), "--format", "json", "--url", gateway.url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(Path(r["file"]).name, len(r["pages"])) for r in results] == [
        ("phototest.tif", 1),
        ("testTIFF_multipage.tif", 2),
    ]
    assert "2/2 documents" in done.stderr
    if needs.which("jq"):
        files = subprocess.run(["jq", "-r", ".file"], input=done.stdout, capture_output=True, text=True, check=True)
        assert [Path(f).name for f in files.stdout.split()] == ["phototest.tif", "testTIFF_multipage.tif"]


def test_cli_without_a_gateway_names_the_url_and_exits_2_at_once():
    url = f"http://127.0.0.1:{free_port()}"

    def ocr(*args: str) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "ocrserve", "ocr", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
        return done, time.monotonic() - started

    _, start_s = ocr("--help")  # the same start-up, on this machine now
    done, seconds = ocr(str(DATA / "phototest.tif"), "--url", url)
    assert done.returncode == 2, done.stderr
    assert seconds < start_s + 3  # no retries against nothing (they would take 7 s or more)
    assert f"no gateway answers at {url}" in done.stderr and "ocrserve launch" in done.stderr


def test_copies_of_one_file_under_two_names_are_two_jobs_not_a_reused_key(tmp_path):
    """The gateway's request counts the document's name, so the client's Idempotency-Key does too
    (copies under other names got 409, key reused with a different request)."""
    data = (DATA / "phototest.tif").read_bytes()
    (tmp_path / "x.tif").write_bytes(data)
    (tmp_path / "y.tif").write_bytes(data)
    key = idempotency_key(tmp_path / "x.tif", pages=None)
    assert key == idempotency_key(tmp_path / "x.tif", pages=None) != idempotency_key(tmp_path / "y.tif", pages=None)


def test_an_unusable_out_folder_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    done = subprocess.run(
        [sys.executable, "-m", "ocrserve", "ocr", str(DATA / "phototest.tif"), "--out", str(tmp_path / "file")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "error: --out" in done.stderr and "Traceback" not in done.stderr


def _copies(folder: Path, count: int, sample: str = "phototest.tif") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"d{i}.tif").write_bytes((DATA / sample).read_bytes())
    return sorted(folder.iterdir())


def _ocr_command(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "ocrserve", "ocr", *args, "--url", url]


#: Wide enough that Rich wraps no summary line.
WIDE = {**os.environ, "COLUMNS": "300"}


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_cli_out_run_again_skips_what_is_written_and_redoes_what_changed(gateway, tmp_path):
    """With --out, a run again skips the results written for the same input and options; a result
    truncated since, an input whose content changed, and --force are OCR'd again."""
    _copies(tmp_path / "in", 2)
    out = tmp_path / "out"

    def run(*extra: str) -> str:
        command = _ocr_command(gateway.url, str(tmp_path / "in"), "--out", str(out), *extra)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=WIDE)
        assert done.returncode == 0, done.stderr
        return _last_line(done.stderr)

    assert run() == f"2 done, 0 skipped (already in {out}), 0 failed"
    assert run() == f"0 done, 2 skipped (already in {out}), 0 failed"
    whole = (out / "d0.tif.txt").read_text()
    (out / "d0.tif.txt").write_text(whole[: len(whole) // 2])  # a result cut short
    assert run() == f"1 done, 1 skipped (already in {out}), 0 failed"
    assert (out / "d0.tif.txt").read_text() == whole
    (tmp_path / "in" / "d1.tif").write_bytes((DATA / "testTIFF_multipage.tif").read_bytes())  # new content
    assert run() == f"1 done, 1 skipped (already in {out}), 0 failed"
    assert (out / "d1.tif.txt").read_text().startswith("Multipage")
    assert run("--format", "json") == f"2 done, 0 skipped (already in {out}), 0 failed"  # other options
    assert run("--force") == f"2 done, 0 skipped (already in {out}), 0 failed"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]  # written through renames, none left


@pytest.mark.slow
def test_cli_stops_at_once_with_one_line_when_the_gateway_goes_away(tmp_path):
    """A gateway killed mid-run: one line naming its URL (not one per document left), the summary
    counting the documents not attempted as not done, exit status 3."""
    docs = _copies(tmp_path / "in", 6)
    out = tmp_path / "out"
    gw = Gateway().wait_ready()
    try:
        command = _ocr_command(gw.url, str(tmp_path / "in"), "--out", str(out), "--concurrency", "1")
        client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=WIDE)
        wait_for(lambda: (out / "d0.tif.txt").exists() or client.poll() is not None, timeout=120)
        os.killpg(gw.proc.pid, signal.SIGKILL)
        _, stderr = client.communicate(timeout=120)
    finally:
        gw.stop()
    assert client.returncode == 3, stderr
    gone = [line for line in stderr.splitlines() if "stopped answering" in line]
    assert len(gone) == 1 and gw.url in gone[0], stderr
    assert "failed " not in stderr.replace("0 failed", "")  # no line per document
    summary = _last_line(stderr)
    written = len(list(out.glob("*.txt")))
    assert 1 <= written < len(docs)
    assert summary == (
        f"{written} done, 0 skipped (already in {out}), 0 failed, {len(docs) - written} not done; "
        "run the same command again to finish the rest"
    ), stderr


def test_cli_ctrl_c_exits_130_with_the_summary(gateway, tmp_path):
    docs = _copies(tmp_path / "in", 6)
    out = tmp_path / "out"
    command = _ocr_command(gateway.url, str(tmp_path / "in"), "--out", str(out), "--concurrency", "1")
    # a test run started in the background of a shell inherits SIGINT ignored, as the CLI would
    client = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=WIDE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: (out / "d0.tif.txt").exists() or client.poll() is not None, timeout=120)
    client.send_signal(signal.SIGINT)
    _, stderr = client.communicate(timeout=60)
    assert client.returncode == 130, stderr
    assert "Traceback" not in stderr
    written = len(list(out.glob("*.txt")))
    assert _last_line(stderr) == (
        f"interrupted: {written} done, 0 skipped (already in {out}), 0 failed, {len(docs) - written} not done; "
        "run the same command again to finish the rest"
    ), stderr
