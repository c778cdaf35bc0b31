"""Typed request parameters: the OpenAPI document FastAPI generates from them, the raw-body upload
with its parameters in the query, 400 problems for malformed ones, and the import graph of
``ocrserve.api``."""

from __future__ import annotations

import ast
import graphlib
import time
from pathlib import Path
from typing import get_args

import httpx
import pytest
from fastapi.testclient import TestClient

import ocrserve.api
from ocrserve.api.app import create_app
from ocrserve.api.params import Format, OcrParams
from ocrserve.config import load_config
from ocrserve.formats import FORMATS
from tests.conftest import DATA
from tests.jobs_util import job_gateway
from tests.test_api import assert_problem

RAW = ("image/*", "application/pdf", "application/octet-stream")


def openapi() -> dict:
    # no `with`: the lifespan (engine, job system) does not start; the schema needs none of it
    return TestClient(create_app(load_config("local", environ={}))).get("/openapi.json").json()


def test_openapi_multipart_bodies_are_generated():
    spec = openapi()
    schemas = spec["components"]["schemas"]
    documented = {code for item in spec["paths"].values() for op in item.values() for code in op["responses"]}
    assert "400" in documented and "422" not in documented  # bad parameters are 400 problems here
    for path, file_schema in (("/v1/ocr", {"type": "string"}), ("/v1/jobs", {"type": "array"})):
        operation = spec["paths"][path]["post"]
        content = operation["requestBody"]["content"]
        ref = content["multipart/form-data"]["schema"]["$ref"]
        assert ref.startswith("#/components/schemas/Body_"), ref  # FastAPI's model, not a hand-written schema
        body = schemas[ref.rsplit("/", 1)[1]]
        (file,) = [s for s in body["properties"]["file"]["anyOf"] if s["type"] != "null"]
        assert file_schema.items() <= file.items(), file
        assert {"pages", "timeout"} <= set(body["properties"])
        assert set(RAW) <= set(content), content  # the raw body, beside the generated multipart one
        query = {p["name"] for p in operation["parameters"] if p["in"] == "query"}
        assert {"pages", "timeout", "priority", "filename"} <= query  # for a raw body
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert "Idempotency-Key" in headers
    ocr = schemas[
        spec["paths"]["/v1/ocr"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"].rsplit(
            "/", 1
        )[1]
    ]["properties"]
    assert {"enum": ["json", "text", "markdown"]}.items() <= ocr["format"]["anyOf"][0].items()
    assert "respond-async" in ocr["priority"]["description"]  # interactive|bulk, or a job's priority
    assert ocr["timeout"]["anyOf"][0]["type"] == "number"
    assert get_args(Format) == FORMATS


def test_raw_tiff_body_with_query_parameters(http):
    tiff = (DATA / "testTIFF_multipage.tif").read_bytes()
    response = http.post(
        "/v1/ocr", params={"pages": "2", "format": "text"}, content=tiff, headers={"content-type": "image/tiff"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert "Page 2" in response.text and "Page 1" not in response.text
    upper = http.post(
        "/v1/ocr",
        params={"format": "JSON", "pages": "1", "timeout": "60"},
        content=tiff,
        headers={"content-type": "application/octet-stream"},
    )
    assert [p["index"] for p in upper.json()["pages"]] == [0]


def test_malformed_parameters_are_400_problems_naming_them(http):
    tif = (DATA / "phototest.tif").read_bytes()
    raw = {"content": tif, "headers": {"content-type": "image/tiff"}}
    assert_problem(http.post("/v1/ocr", params={"timeout": "abc"}, **raw), 400, "timeout='abc' .query parameter.")
    assert_problem(http.post("/v1/ocr", params={"timeout": "3601"}, **raw), 400, "timeout")
    assert_problem(http.post("/v1/ocr", params={"priority": "urgent"}, **raw), 400, "priority")
    assert_problem(
        http.post("/v1/ocr", files={"file": ("a", tif)}, data={"format": "xml"}), 400, "format='xml' .form field."
    )
    assert_problem(http.post("/v1/ocr", files=[("file", ("a", tif)), ("file", ("b", tif))]), 400, "1 file per request")
    assert_problem(http.post("/v1/ocr", data={"file": "not a file"}, files={"x": ("x", b"")}), 400, "file")
    assert_problem(http.post("/v1/ocr", content=tif, headers={"content-type": "text/plain"}), 415, "Content-Type")
    assert_problem(http.post("/v1/ocr", params={"timeout": "nan"}, **raw), 400, "finite number")
    pdfx = http.post("/v1/ocr", content=tif, headers={"content-type": "application/pdfx"})
    assert_problem(pdfx, 415, "Content-Type")  # media types match exactly, not by prefix
    no_boundary = http.post("/v1/ocr", content=b"--x", headers={"content-type": "multipart/form-data"})
    assert_problem(no_boundary, 400, "malformed multipart body")
    assert "other fields" not in no_boundary.json()["detail"]
    lane = http.post("/v1/ocr", params={"priority": "INTERACTIVE", "format": "TEXT"}, **raw)
    assert lane.status_code == 200 and lane.text.startswith("This is a lot of 12 point text")


@pytest.fixture(scope="module")
def jobs_http(tmp_path_factory):
    gateway = job_gateway(tmp_path_factory.mktemp("jobs")).wait_ready()
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as client:
            yield client
    finally:
        gateway.stop()


def test_raw_body_job_with_query_parameters_and_timeout_in_its_terms(jobs_http):
    tiff = (DATA / "testTIFF_multipage.tif").read_bytes()
    raw = {"content": tiff, "headers": {"content-type": "image/tiff", "Idempotency-Key": "raw-1"}}
    query = {"filename": "m.tif", "pages": "2", "priority": "3", "timeout": "60"}
    first = jobs_http.post("/v1/jobs", params=query, **raw)
    assert first.status_code == 202, first.text
    status = first.json()
    assert (status["documents"][0]["name"], status["pages_total"], status["priority"]) == ("m.tif", 1, 3)
    assert jobs_http.post("/v1/jobs", params=query, **raw).headers["idempotent-replayed"] == "true"
    # the parsed timeout reaches the intake: with another one it is another request for the same key
    assert_problem(jobs_http.post("/v1/jobs", params={**query, "timeout": "61"}, **raw), 409, "")
    assert_problem(jobs_http.post("/v1/jobs", params={**query, "timeout": "0"}, **raw), 400, "timeout")
    # Prefer: respond-async checks POST /v1/ocr's own parameters, then makes a job
    prefer = {"content-type": "image/tiff", "prefer": "respond-async"}
    bad = jobs_http.post("/v1/ocr", params={"priority": "interactive"}, content=tiff, headers=prefer)
    assert_problem(bad, 400, "a job's priority is an integer")  # a job runs in the bulk lane
    job = jobs_http.post(
        "/v1/ocr",
        params={"pages": "1", "timeout": "30", "filename": "a.tif", "priority": "5"},
        content=tiff,
        headers=prefer,
    )
    assert job.status_code == 202 and job.headers["preference-applied"] == "respond-async", job.text
    assert (job.json()["documents"][0]["name"], job.json()["pages_total"], job.json()["priority"]) == ("a.tif", 1, 5)
    sync = jobs_http.post("/v1/ocr", params={"priority": "5"}, content=tiff, headers={"content-type": "image/tiff"})
    assert_problem(sync, 400, "expected interactive or bulk")


def test_api_modules_import_each_other_without_cycles_at_the_top():
    package = Path(ocrserve.api.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ocrserve.api."):
                imported.add(node.module)
            elif isinstance(node, ast.ImportFrom) and node.module == "ocrserve.api":
                imported |= {f"ocrserve.api.{alias.name}" for alias in node.names}
        graph[f"ocrserve.api.{path.stem}"] = imported
        nested = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n not in tree.body]
        assert not nested, f"{path.name}:{nested[0].lineno}: function-local import"
    graph.pop("ocrserve.api.__init__")
    tuple(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle


def test_a_timeout_runs_from_when_the_request_arrived():
    """The deadline counts the seconds before the upload was read, as the client's clock does."""
    arrived = time.monotonic() - 2.0
    assert OcrParams(timeout=10).work_item(arrived).deadline.left() == pytest.approx(8.0, abs=0.1)
    assert OcrParams(timeout=10).work_item().deadline.left() == pytest.approx(10.0, abs=0.1)
    assert OcrParams().work_item(arrived).deadline is None
