"""``ocrserve batch`` on a real local Ray (2 CPUs) with the real ONNX engine: the gateway's text,
resuming, a killed OCR actor, a corrupt file, the command line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from ocrserve.batch.output_folder import MANIFEST, STATE_DIR, ManifestEntry, OutputFolder, resume_key
from ocrserve.cli import app
from ocrserve.config import load_config
from ocrserve.engines import create_engine
from ocrserve.evaluation import bag_f1
from ocrserve.inputs import collect_documents
from ocrserve.store.cache import DedupCache
from tests.conftest import DATA, Replica, ground_truth, wait_for

ray = pytest.importorskip("ray", reason="ocrserve batch needs Ray: pip install -e '.[ray]'")
pipeline = pytest.importorskip(
    "ocrserve.batch.ray_pipeline", reason="ocrserve batch needs ray[data]: pip install -e '.[ray]'"
)

#: The model the vLLM replica serves (the ``prod`` profile's).
VLLM_MODEL = "tencent/HunyuanOCR"
#: The documents of the first run: relative path under the input folder -> sample in tests/data.
SAMPLES = {
    "phototest.tif": "phototest.tif",
    "testTIFF_multipage.tif": "testTIFF_multipage.tif",
    "sub/multi-line_en_black.png": "multi-line_en_black.png",
    "sub/img_exif_orientation.jpg": "img_exif_orientation.jpg",
}


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for the module, shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _folder(root: Path, files: dict[str, str]) -> Path:
    """``root`` holding a copy of each sample at its relative path."""
    for relative, sample in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / sample, root / relative)
    return root


def _manifest(out: Path) -> list[ManifestEntry]:
    return [ManifestEntry.from_json(line) for line in (out / MANIFEST).read_text(encoding="utf-8").splitlines()]


def _recorded(out: Path) -> bool:
    """Whether the manifest (created as the run starts) holds a document yet."""
    return (out / MANIFEST).exists() and bool((out / MANIFEST).read_text(encoding="utf-8").strip())


def _documents(inputs: Path) -> dict[Path, str]:
    """The documents under ``inputs``, each with its JSON result's path, as ``ocrserve batch`` names them."""
    return {doc: str(name.with_name(name.name + ".json")) for doc, name in collect_documents([inputs]).items()}


@pytest.fixture(scope="module")
def first_run(local_ray, tmp_path_factory):
    """One batch over a folder of samples (one in a subfolder): ``(inputs, out, summary)``."""
    inputs = _folder(tmp_path_factory.mktemp("inputs"), SAMPLES)
    out = tmp_path_factory.mktemp("out")
    return inputs, out, pipeline.run_batch(_documents(inputs), out, load_config("local"))


def _without_scores(result: dict) -> list[list[dict]]:
    """Each page's lines (text, box, block) without their recognition scores."""
    return [[{k: v for k, v in line.items() if k != "score"} for line in page["lines"]] for page in result["pages"]]


def _scores(result: dict) -> list[float]:
    return [line["score"] for page in result["pages"] for line in page["lines"]]


def test_each_document_has_the_gateways_text(first_run, http):
    inputs, out, summary = first_run
    entries = _manifest(out)
    assert sorted(e.output for e in entries) == sorted(f"{r}.json" for r in SAMPLES)
    assert all(e.status == "succeeded" and not e.errors for e in entries), entries
    assert summary.pages == sum(e.pages for e in entries) == 5  # the TIFF has 2 pages
    for relative in SAMPLES:
        result = json.loads((out / f"{relative}.json").read_text(encoding="utf-8"))
        with (inputs / relative).open("rb") as fh:
            answer = http.post("/v1/ocr", files={"file": (Path(relative).name, fh)})
        assert answer.status_code == 200
        expected = answer.json()
        assert result["text"] == expected["text"], relative
        assert _without_scores(result) == _without_scores(expected), relative
        # a line's score depends on the crops it is recognized beside (a batch pads them to its
        # widest), and the two readers batch different pages together, as timing falls (seen:
        # 0.9997 against 0.9772 for one line of phototest.tif, same text and box)
        assert _scores(result) == pytest.approx(_scores(expected), abs=0.05), relative
        assert (result["model"], result["lane"], result["usage"]["pages"]) == (
            expected["model"],
            "batch",
            len(expected["pages"]),
        )


def test_a_second_run_does_no_ocr_and_skips_every_document(first_run):
    inputs, out, _ = first_run
    results = {r: (out / f"{r}.json").stat().st_mtime_ns for r in SAMPLES}
    cli = CliRunner().invoke(app, ["batch", str(inputs), "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    entries = _manifest(out)
    assert len(entries) == len(SAMPLES)
    assert all(e.status == "skipped" and e.ocr_pages == 0 for e in entries), entries
    assert {r: (out / f"{r}.json").stat().st_mtime_ns for r in SAMPLES} == results
    assert "pages OCR'd" in cli.output and "skipped (done before)" in cli.output


def test_as_many_actors_as_cpus_is_refused_before_any_work(first_run, tmp_path):
    inputs, _, _ = first_run  # the session's local Ray has 2 CPUs: 2 actors would starve the decoding
    cli = CliRunner().invoke(app, ["batch", str(inputs), "--out", str(tmp_path / "out"), "--actors", "2"])
    assert cli.exit_code == 2, cli.output
    assert "--actors 2 leaves none of the Ray cluster's 2 CPUs" in " ".join(cli.output.split())
    assert not (tmp_path / "out" / "manifest.jsonl").exists() or not _manifest(tmp_path / "out")


def test_a_killed_ocr_actor_is_replaced_and_every_document_done_once(local_ray, tmp_path):
    # 16: the actor's 16 calls in flight return in bursts; 8 copies could all be read before the
    # first was written and the actor killed, leaving the replacement nothing (1 run in 5 failed)
    copies = {f"copy-{i:02}.tif": "phototest.tif" for i in range(16)}
    inputs = _folder(tmp_path / "in", copies)
    (inputs / "corrupt.png").write_bytes((DATA / "multi-line_en_black.png").read_bytes()[:300])
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_first_worker(entry: ManifestEntry) -> None:
        if not killed and entry.workers:
            killed.append(int(entry.workers[0].rpartition(":")[2]))
            os.kill(killed[0], signal.SIGKILL)

    docs = _documents(inputs)
    summary = pipeline.run_batch(docs, out, load_config("local"), on_entry=kill_first_worker)

    entries = _manifest(out)
    assert sorted(e.document for e in entries) == sorted(str(d) for d in docs)  # each document once
    by_name = {Path(e.document).name: e for e in entries}
    corrupt = by_name.pop("corrupt.png")
    assert corrupt.status == "failed" and corrupt.errors[0]["status"] == 415, corrupt
    assert not (out / "corrupt.png.json").exists()
    assert all(e.status == "succeeded" for e in by_name.values()), entries
    assert killed and any(f":{killed[0]}" not in w for e in by_name.values() for w in e.workers)
    texts = {json.loads((out / f"{name}.json").read_text())["text"] for name in copies}
    assert len(texts) == 1 and "quick brown dog" in texts.pop()
    assert summary.pages >= len(copies)
    assert not [p for p in out.rglob("*.tmp")]


def _replica_requests(replica: Replica) -> float:
    """Requests ``replica`` finished (vLLM's ``vllm:request_success_total``, any reason)."""
    families = text_string_to_metric_families(httpx.get(replica.url + "/metrics").text)
    return sum(
        s.value for f in families if f.name == "vllm:request_success" for s in f.samples if s.name.endswith("_total")
    )


def test_the_prod_profile_reads_each_page_once_through_the_vllm_replicas(local_ray, tmp_path):
    """``engine.kind: vllm``: the OCR actor is a client of the replicas in ``engine.vllm.base_urls``
    (here a real server speaking vLLM's protocol, not launched by ocrserve)."""
    replica = Replica(VLLM_MODEL).wait_healthy()
    try:
        inputs = _folder(tmp_path / "in", {name: name for name in ("phototest.tif", "testTIFF_multipage.tif")})
        overrides = [f"engine.vllm.base_urls=[{replica.url}]", "vllm.max_num_seqs=4"]
        summary = pipeline.run_batch(_documents(inputs), tmp_path / "out", load_config("prod", overrides))
        served = _replica_requests(replica)
    finally:
        replica.stop()
    entries = _manifest(tmp_path / "out")
    assert {(Path(e.document).name, e.status, e.pages, e.engine) for e in entries} == {
        ("phototest.tif", "succeeded", 1, VLLM_MODEL),
        ("testTIFF_multipage.tif", "succeeded", 2, VLLM_MODEL),
    }
    assert summary.pages == served == 3  # each page one request to the replica
    for entry in entries:
        result = json.loads((tmp_path / "out" / entry.output).read_text(encoding="utf-8"))
        assert result["model"] == VLLM_MODEL and result["lane"] == "batch"
        assert bag_f1(result["text"], ground_truth(Path(entry.document).name)) >= 0.95, result["text"]


def test_sigterm_stops_the_run_as_ctrl_c_does_and_the_next_run_finishes_it(tmp_path):
    """``kill`` (Kubernetes, Slurm) once the first document is recorded: exit 143 with the
    interrupted line, whole results only; a run of the same command finishes the rest."""
    copies = {f"copy-{i:02}.tif": "phototest.tif" for i in range(16)}
    inputs, out = _folder(tmp_path / "in", copies), tmp_path / "out"
    # a process of its own, on a Ray of its own: this one is joined to the module's Ray
    args = [sys.executable, "-m", "ocrserve", "batch", str(inputs), "--out", str(out), "--ray", "local"]
    run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: _recorded(out) or run.poll() is not None, timeout=180)
    run.send_signal(signal.SIGTERM)
    stderr = run.communicate(timeout=120)[1]
    assert run.returncode == 143 and "interrupted:" in stderr, stderr
    recorded = _manifest(out)
    assert 1 <= len(recorded) < len(copies) and not [p for p in out.rglob("*.tmp")]
    assert all(json.loads((out / f"{Path(e.document).name}.json").read_text())["text"] for e in recorded)
    rest = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0, rest.stderr
    again = _manifest(out)
    assert sum(e.status == "skipped" for e in again) == len(recorded) and len(again) == len(copies)


def test_a_result_damaged_since_it_was_written_is_not_done(tmp_path):
    folder = OutputFolder(tmp_path)
    entry = ManifestEntry("in/x.png", "x.png.json", "succeeded", pages=1, engine="m", key="k1")
    folder.write(entry, {"id": "k1", "pages": [], "text": "été"}, "json")
    assert folder.done("x.png.json", "k1") == entry
    assert folder.done("x.png.json", "k2") is None  # another key: the document or the settings changed
    result = tmp_path / "x.png.json"
    result.write_bytes(result.read_bytes()[:-3])  # truncated from outside
    assert folder.done("x.png.json", "k1") is None
    result.unlink()
    assert folder.done("x.png.json", "k1") is None


def test_the_resume_key_is_the_gateways_dedup_key():
    config = load_config("local")
    cache = DedupCache(None, None, 1, config.engine.model, config.preprocess)
    assert resume_key("ab" * 32, [0, 2], config.engine.model, config.preprocess) == cache.key("ab" * 32, [0, 2])
    assert resume_key("ab" * 32, [0], config.engine.model, config.preprocess) != cache.key("ab" * 32, [0, 2])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "--format must be one of json, text, markdown, jsonl"),
        (["--set", "engine.kind=nope"], "engine.kind"),
        (["--profile", "prod"], "engine.vllm.base_urls is empty"),
        (["--pages", "abc"], "--pages: pages='abc': expected ranges like 1-3,5"),
        (["--pages", "3-1"], "range '3-1' is empty or below 1"),
    ],
)
def test_bad_usage_exits_2_with_one_line(tmp_path, args, message):
    cli = CliRunner().invoke(app, ["batch", str(DATA / "phototest.tif"), "--out", str(tmp_path), *args])
    assert cli.exit_code == 2 and message in cli.output, cli.output


def test_an_out_that_is_a_file_exits_2_naming_it(tmp_path):
    (tmp_path / "o").write_text("not a folder")
    cli = CliRunner().invoke(app, ["batch", str(DATA / "phototest.tif"), "--out", str(tmp_path / "o")])
    assert cli.exit_code == 2 and "is a file; name a folder" in " ".join(cli.output.split()), cli.output


def test_no_ray_cluster_at_the_address_exits_2_at_once(tmp_path):
    """Nothing listening, a web server where Ray should be, and a bad ``RAY_ADDRESS`` under
    ``--ray auto``: each exits 2 in seconds (Ray itself would retry for minutes)."""
    # processes of their own: this one is joined to the module's Ray, which the command would use
    args = [sys.executable, "-m", "ocrserve", "batch", str(DATA / "phototest.tif"), "--out", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    web = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        for extra, env_address, message in [
            (["--ray", "127.0.0.1:1"], None, "no Ray cluster answers at 127.0.0.1:1"),
            (["--ray", f"127.0.0.1:{web.server_port}"], None, f"127.0.0.1:{web.server_port} answers, but not as Ray"),
            ([], "127.0.0.1:1", "no Ray cluster answers at RAY_ADDRESS=127.0.0.1:1"),
        ]:
            run_env = env if env_address is None else {**env, "RAY_ADDRESS": env_address}
            cli = subprocess.run([*args, *extra], capture_output=True, text=True, timeout=60, env=run_env)
            assert cli.returncode == 2 and message in cli.stderr, cli.stderr
    finally:
        web.shutdown()


def test_a_glob_matching_nothing_exits_2(tmp_path):
    cli = CliRunner().invoke(app, ["batch", str(tmp_path / "*.pdf"), "--out", str(tmp_path / "out")])
    assert cli.exit_code == 2 and "no document matches" in cli.output, cli.output
    assert not (tmp_path / "out" / STATE_DIR).exists()


def test_ocr_actors_detect_and_recognize_two_pages_on_single_threaded_sessions_and_keep_4x_slots_in_flight():
    config = load_config("local")
    worker = pipeline._worker_config(config)
    onnx = worker.engine.onnx
    assert (onnx.det_workers, onnx.rec_workers, onnx.intra_op_num_threads, onnx.background_threads) == (2, 2, 1, 1)
    assert create_engine(worker).slots == 4
    gateway = config.engine.onnx  # the gateway's profile is left as it is
    assert (gateway.det_workers, gateway.rec_workers, gateway.intra_op_num_threads) == (1, 1, 0)
    assert gateway.background_threads == 1
    assert worker.engine.model == config.engine.model and worker.preprocess == config.preprocess
    assert pipeline._calls_per_actor(4) == 16
