"""What ``configs/`` gives an operator to monitor with, checked against the real programs:
Prometheus' own ``promtool`` on the rules (each alert's unit tests) and the example configuration,
and a real Prometheus scraping a real gateway under a short load, so that every panel of the Grafana
dashboard returns series: a renamed metric breaks this test, not the operator's dashboard.

The gateway runs the ``prod`` profile's ``vllm`` engine on one :class:`~tests.conftest.Replica`
(``ocrserve engine serve``, which speaks vLLM's protocol and exports vLLM's gauges), so the vLLM
panels have series too. The load: single pages, pages refused at admission (a ``timeout`` no page
can meet), and a job whose webhook fails.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from ocrserve.bench.harness import free_port, stop_group, wait_until_200
from tests import needs
from tests.conftest import DATA, Gateway, Replica, wait_for

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "configs" / "prometheus"
DASHBOARD = ROOT / "configs" / "grafana" / "ocrserve-dashboard.json"
#: Grafana's range variable, as a plain Prometheus query spells it (the scrape interval here is 1 s).
RATE_INTERVAL = "1m"


def promtool() -> str:
    """``promtool``, or a skip saying how to get it."""
    return needs.program("promtool", "prometheus")


def test_every_alert_passes_its_promtool_unit_tests():
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", "ocrserve-rules.yml"], cwd=PROMETHEUS, capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    tested = subprocess.run([tool, "test", "rules", "ocrserve-rules.test.yml"], cwd=PROMETHEUS, capture_output=True)
    print(tested.stdout.decode())
    assert tested.returncode == 0, tested.stdout.decode() + tested.stderr.decode()
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((PROMETHEUS / "ocrserve-rules.yml").read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    tests = yaml.safe_load((PROMETHEUS / "ocrserve-rules.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]  # a case where the alert fires
    }
    assert alerts == fired, f"alerts without a unit test that fires them: {sorted(alerts - fired)}"


def test_the_example_prometheus_configuration_is_valid():
    checked = subprocess.run([promtool(), "check", "config", "prometheus.yml"], cwd=PROMETHEUS, capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def panel_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every query of the dashboard, Grafana's variables replaced."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
        for panel in panels
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


class FailingWebhook(BaseHTTPRequestHandler):
    """A webhook receiver that answers every call 500."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def webhook():
    """A loopback webhook receiver that fails every delivery: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingWebhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """A replica, the prod profile's gateway on it, and a real Prometheus scraping the gateway every
    second with ``configs/prometheus/ocrserve-rules.yml`` loaded: ``(gateway, prometheus URL)``."""
    binary = needs.program("prometheus")
    folder = tmp_path_factory.mktemp("monitoring")
    replica = Replica("tencent/HunyuanOCR")
    gateway = prometheus = None
    try:
        replica.wait_healthy()
        gateway = Gateway(
            f"engine.vllm.base_urls=[{replica.url}]",
            "engine.vllm.slots_per_replica=2",
            "engine.vllm.poll_interval_s=1",
            f"store.data_dir={folder / 'data'}",
            "jobs.webhook_allow_hosts=[127.0.0.1]",
            "jobs.webhook_allow_private=true",
            "jobs.webhook_attempts=1",
            profile="prod",
        ).wait_ready()
        port = free_port()
        (folder / "ocrserve-rules.yml").write_text((PROMETHEUS / "ocrserve-rules.yml").read_text())
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["ocrserve-rules.yml"],
            "scrape_configs": [
                {"job_name": "ocrserve", "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}]}
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        with open(folder / "prometheus.log", "wb") as log:
            prometheus = subprocess.Popen(
                [
                    binary,
                    f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                cwd=folder,
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until_200(prometheus, f"http://127.0.0.1:{port}/-/ready", "prometheus", 60)
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        for proc in (prometheus, gateway and gateway.proc):
            if proc is not None:
                stop_group(proc)
        replica.stop()


def load(gateway: Gateway, webhook: str) -> None:
    """A short load: 12 single pages 4 at a time, 6 refused at admission, one job whose webhook fails."""
    page = (DATA / "phototest.tif").read_bytes()
    with httpx.Client(base_url=gateway.url, timeout=120) as http:
        job = http.post(
            "/v1/jobs",
            files={"file": ("testTIFF_multipage.tif", (DATA / "testTIFF_multipage.tif").read_bytes())},
            data={"webhook_url": webhook},
        )
        assert job.status_code == 202, job.text

        def one(n: int) -> int:
            # a timeout of their own: four at a time on a busy machine may queue past the fast
            # lane's latency target, which these pages are not about
            params = {"timeout": "0.01" if n % 3 == 0 else "120"}
            return http.post("/v1/ocr", files={"file": ("phototest.tif", page)}, params=params).status_code

        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(one, range(18)))
        assert statuses.count(200) == 12 and statuses.count(503) == 6, statuses
        job_url = job.headers["Location"]
        wait_for(lambda: http.get(job_url).json()["status"] == "succeeded", timeout=120)
        wait_for(lambda: 'outcome="failed"' in http.get("/metrics").text.split("ocrserve_jobs_webhooks_total", 1)[-1])


def series(prometheus: str, query: str) -> list[dict]:
    """The result of an instant ``query``."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": query}, timeout=30).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_every_dashboard_panel_returns_series_from_a_real_prometheus(monitored, webhook):
    gateway, prometheus = monitored
    load(gateway, webhook)
    time.sleep(5)  # a few more scrapes, so that the rates over the last minute see the load
    counts = [(title, query, len(series(prometheus, query))) for title, query in panel_queries()]
    width = max(len(title) for title, _, _ in counts)
    print("\n".join(f"{title:<{width}}  {n:3d} series  {query}" for title, query, n in counts))
    assert all(n > 0 for _, _, n in counts), [title for title, _, n in counts if n == 0]
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    broken = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] == "err"]
    assert not broken and sum(len(g["rules"]) for g in rules) == 18, broken
