"""The gateway over real HTTP (uvicorn on loopback) with the real ONNX engine."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest

from ocrserve.evaluation import bag_f1
from tests import samples
from tests.conftest import DATA, Gateway, ground_truth
from tests.jobs_util import engine_pages, metric


def post_file(http: httpx.Client, data: bytes, name: str = "doc", **form) -> httpx.Response:
    return http.post("/v1/ocr", files={"file": (name, data)}, data=form)


def assert_problem(response: httpx.Response, status: int, detail_pattern: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["type"].startswith("https://") and body["title"]
    assert re.search(detail_pattern, body["detail"]), body["detail"]
    assert body.get("request_id") == response.headers.get("X-Request-ID")  # none only before the app
    return body


def test_health_ready_models_docs(http):
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json()["status"] == "ready"
    (model,) = http.get("/v1/models").json()["data"]
    assert model["id"] == "rapidocr/PP-OCRv6-small" and model["ready"] is True and model["slots"] >= 1
    assert model["limits"]["max_pages"] == 200
    assert "/v1/ocr" in http.get("/openapi.json").json()["paths"]
    assert http.get("/docs").status_code == 200


def test_ocr_result_json(http):
    body = post_file(http, (DATA / "phototest.tif").read_bytes(), "phototest.tif").json()
    assert set(body) == {"id", "model", "lane", "text", "pages", "usage"}
    (page,) = body["pages"]
    assert (page["index"], page["width"], page["height"]) == (0, 640, 480)
    assert bag_f1(body["text"], ground_truth("phototest.tif")) > 0.9
    first = page["lines"][0]
    assert first["text"].startswith("This is a lot of 12 point text")
    xs, ys = zip(*first["box"], strict=True)
    assert 0 <= min(xs) < 60 and 500 < max(xs) <= 640 and 60 < min(ys) < max(ys) < 140
    assert 0.5 <= first["score"] <= 1
    assert {"queue_s", "preprocess_s", "engine_s"} <= set(page["timings"])
    assert body["usage"]["pages"] == 1


def test_boxes_in_client_pixels_after_downscale(http):
    big = samples.phototest().resize((2560, 1920))  # 4x: the pixel budget shrinks it to <= 2000 px
    body = post_file(http, samples.encode(big, "PNG"), "big.png").json()
    (page,) = body["pages"]
    assert (page["width"], page["height"]) == (2560, 1920)
    first = next(line for line in page["lines"] if line["text"].startswith("This is a lot"))
    xs, ys = zip(*first["box"], strict=True)
    # the same line sits at x 33..585, y 84..125 in the 640 x 480 original: 4x that here
    assert 100 < min(xs) < 180 and 2250 < max(xs) < 2420 and 300 < min(ys) < 380 and 460 < max(ys) < 540


def test_raw_body_pages_and_formats(http):
    tiff = (DATA / "testTIFF_multipage.tif").read_bytes()
    body = http.post("/v1/ocr", content=tiff, headers={"content-type": "image/tiff"}).json()
    assert [p["index"] for p in body["pages"]] == [0, 1]
    assert body["text"].count("\f") == 1 and "Page 2" in body["text"].split("\f")[1]
    second = post_file(http, tiff, "m.tif", pages="2").json()
    assert [p["index"] for p in second["pages"]] == [1]
    text = post_file(http, tiff, "m.tif", format="text")
    assert text.headers["content-type"].startswith("text/plain") and "Page 1" in text.text
    markdown = post_file(http, tiff, "m.tif", format="markdown").text
    assert markdown.startswith("## Page 1") and "## Page 2" in markdown


@pytest.mark.parametrize(
    "name, make",
    [
        ("exif", samples.exif_rotated_jpeg),
        ("cmyk", samples.cmyk_jpeg),
        ("pyramid", samples.pyramidal_tiff),
        ("rotate-pdf", samples.rotated_pdf),
    ],
)
def test_hard_cases_read_right(http, name, make):
    body = post_file(http, make(), name).json()
    assert len(body["pages"]) == 1
    assert bag_f1(body["text"], ground_truth("phototest.tif")) > 0.85


@pytest.mark.parametrize("name", ["black_font_color_transparent.png", "img_exif_orientation.jpg"])
def test_alpha_and_exif_samples(http, name):
    # black text on a transparent background reads as black on black unless alpha is flattened;
    # the EXIF sample is stored upside down. Both say 我是中国人 ("I am Chinese").
    body = post_file(http, (DATA / name).read_bytes(), name).json()
    found = set(body["text"]) & set(ground_truth(name).strip())
    assert len(found) >= 4, body["text"]


def test_characters_far_taller_than_the_detectors_training_text_read_whole(http):
    # 190 px characters reach the detector about 500 px tall, where it split them into three
    # overlapping boxes and lost the last; the engine detects such a page again smaller
    name = "black_font_color_transparent.png"
    body = post_file(http, (DATA / name).read_bytes(), name).json()
    assert body["text"] == ground_truth(name).strip()
    assert len(body["pages"][0]["lines"]) == 1


@pytest.mark.parametrize(
    "case, data, status, detail",
    [
        ("empty body", b"", 415, "empty"),
        ("truncated jpeg", samples.truncated_jpeg(), 415, "image data ends early"),
        ("text named .png", b"just some text, not an image\n" * 10, 415, "not a supported document"),
        ("40000 x 40000 png header", samples.png_header_only(40000, 40000), 413, "max_page_pixels"),
        ("5000 blank pdf pages", samples.blank_pdf(5000), 413, "5000 pages selected.*max_pages=200"),
        ("10001 blank pdf pages", samples.blank_pdf(10_001), 413, "10001 pages or more.*max_document_pages=10000"),
        ("pdf page of 40000 x 40000 px at 200 dpi", samples.blank_pdf(1, (14400, 14400)), 413, "max_page_pixels"),
    ],
)
def test_bad_input_refused_quickly_and_server_keeps_serving(http, case, data, status, detail):
    started = time.perf_counter()
    assert_problem(post_file(http, data, "upload.png"), status, detail)
    assert time.perf_counter() - started < 5, case
    assert post_file(http, (DATA / "phototest.tif").read_bytes()).status_code == 200


def test_the_page_limit_bounds_the_pages_selected_not_the_document(http):
    """``preprocess.max_pages`` (200) counts the pages a request selects: two pages of a 201-page
    PDF are OCR'd; all 201 are refused, saying how to select fewer."""
    pdf = samples.blank_pdf(201)
    response = post_file(http, pdf, "long.pdf", pages="1-2")
    assert response.status_code == 200, response.text
    assert [page["index"] for page in response.json()["pages"]] == [0, 1]
    assert_problem(post_file(http, pdf, "long.pdf"), 413, "201 pages selected .*select fewer with pages=")


def test_an_upload_past_the_spool_size_is_read_from_disk(http):
    """A body above 1 MiB (an uncompressed two-page TIFF, 1.8 MB) reaches the decoding processes
    from a temporary file, multipart or raw, with the same result."""
    page = samples.phototest()
    tiff = samples.encode(page, "TIFF", save_all=True, append_images=[page])
    assert len(tiff) > 1 << 20
    multipart = post_file(http, tiff, "big.tif")
    raw = http.post("/v1/ocr", content=tiff, headers={"content-type": "image/tiff"})
    for response in (multipart, raw):
        assert response.status_code == 200, response.text
        pages = response.json()["pages"]
        assert len(pages) == 2 and all("12 point text" in p["text"] for p in pages)


def test_bad_parameters(http):
    tif = (DATA / "phototest.tif").read_bytes()
    assert_problem(post_file(http, tif, pages="3"), 400, "1 page")
    assert_problem(post_file(http, tif, timeout="-1"), 400, "timeout")
    assert_problem(post_file(http, tif, format="xml"), 400, "format")
    assert_problem(http.post("/v1/ocr", files={"document": ("a.tif", tif)}), 400, "'file' is required")
    assert_problem(http.post("/v1/ocr", json={"a": 1}), 415, "Content-Type")
    assert_problem(http.get("/v1/nothing"), 404, "")


def test_upload_cut_short_is_a_499_not_a_500(gateway, http):
    """A client that disconnects halfway through its upload is counted as 499 (client closed
    request), raw body or multipart, and the server goes on serving."""

    def count(status: str) -> float:
        return metric(http, "ocrserve_http_requests_total", route="/v1/ocr", status=status)

    tif = (DATA / "phototest.tif").read_bytes()
    multipart = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.tif"\r\n\r\n' + tif
    before = {status: count(status) for status in ("499", "500")}
    for content_type, body in (("image/tiff", tif), ("multipart/form-data; boundary=b", multipart)):
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            head = f"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            sock.sendall(f"{head}Content-Length: {len(body) + 10}\r\n\r\n".encode() + body[: len(body) // 2])
    deadline = time.monotonic() + 10
    while count("499") < before["499"] + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (count("499"), count("500")) == (before["499"] + 2, before["500"])
    assert post_file(http, tif).status_code == 200


def read_response(sock: socket.socket) -> str:
    """One HTTP/1.1 response with a ``Content-Length`` from ``sock``, headers and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"\r\n\r\n"
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_a_client_that_stops_sending_its_body_gets_408():
    """A slow client cannot hold a connection and its half upload forever: with no part of the
    body for ``server.read_timeout_s``, the request is answered 408 and the server goes on."""
    tif = (DATA / "phototest.tif").read_bytes()
    multipart = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.tif"\r\n\r\n' + tif
    with Gateway("server.read_timeout_s=0.5").wait_ready() as gw:
        for content_type, body in (("image/tiff", tif), ("multipart/form-data; boundary=b", multipart)):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
                head = f"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[: len(body) // 2])
                answer = read_response(sock)  # the rest of the body never comes
            assert answer.startswith("HTTP/1.1 408"), answer
            assert "server.read_timeout_s=0.5" in answer
        assert httpx.post(gw.url + "/v1/ocr", files={"file": ("a.tif", tif)}, timeout=60).status_code == 200


def test_a_deadline_too_short_for_the_work_is_refused_at_admission(http):
    """Once the router has measured a page, a request that cannot finish within its timeout gets
    503 with Retry-After before any of it is decoded or queued (issue 13), not a 504 later: a
    60-page PDF with 0.05 s sends no page to the engine."""
    assert post_file(http, (DATA / "phototest.tif").read_bytes()).status_code == 200  # a measured page
    before = engine_pages(http)
    refused = post_file(http, samples.blank_pdf(60), timeout="0.05")
    assert_problem(refused, 503, r"cannot finish 60 page\(s\) within the request's 0\.\d s")
    assert int(refused.headers["retry-after"]) >= 1
    assert engine_pages(http) == before


def test_metrics_count_requests(http):
    post_file(http, (DATA / "phototest.tif").read_bytes())
    post_file(http, samples.png_header_only(40000, 40000))
    assert http.get("/openapi.json").status_code == 200 and http.get("/docs").status_code == 200
    text = http.get("/metrics").text
    assert re.search(r'ocrserve_http_requests_total\{route="/v1/ocr",status="200"\} [1-9]', text)
    for route in ("/openapi.json", "/docs"):  # FastAPI's own routes by their path, not "unmatched"
        assert re.search(rf'ocrserve_http_requests_total\{{route="{route}",status="200"\}} [1-9]', text), route
    assert "ocrserve_http_request_duration_seconds_bucket" in text
    assert re.search(r'ocrserve_pages_total\{outcome="ok"\} [1-9]', text)
    assert "ocrserve_engine_ready 1.0" in text
    assert re.search(r'ocrserve_rejections_total\{lane="none",reason="too_large"\} [1-9]', text)


def test_upload_limit_and_api_keys():
    gw = Gateway("server.max_upload_mb=0.05", "server.api_keys=[k1]").wait_ready()
    try:
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            tif = (DATA / "phototest.tif").read_bytes()
            assert_problem(http.post("/v1/ocr", files={"file": ("a", tif)}), 401, "Bearer")
            assert_problem(
                http.post("/v1/ocr", files={"file": ("a", tif)}, headers={"authorization": "Bearer nope"}),
                403,
                "not valid",
            )
            auth = {"authorization": "Bearer k1"}
            assert http.post("/v1/ocr", files={"file": ("a", tif)}, headers=auth).status_code == 200
            assert_problem(
                http.post("/v1/ocr", content=b"x" * 60_000, headers={**auth, "content-type": "image/png"}),
                413,
                "max_upload_mb",
            )

            def chunks():
                for _ in range(20):
                    yield b"x" * 8192

            assert_problem(
                http.post("/v1/ocr", content=chunks(), headers={**auth, "content-type": "image/png"}),
                413,
                "max_upload_mb",
            )

            def multipart_chunks():  # the form is parsed before FastAPI's own parse, which would make it a 400
                yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n'
                yield from chunks()

            multipart = {**auth, "content-type": "multipart/form-data; boundary=b"}
            assert_problem(http.post("/v1/ocr", content=multipart_chunks(), headers=multipart), 413, "max_upload_mb")
            assert_problem(http.post("/v1/jobs", content=multipart_chunks(), headers=multipart), 413, "max_upload_mb")
            assert http.get("/healthz").status_code == 200  # ops endpoints need no key
    finally:
        gw.stop()
