"""Prometheus metrics of the gateway (names follow Prometheus conventions: ``ocrserve_*_seconds``,
``*_total``). Exposed at ``GET /metrics`` in the text exposition format."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: Latency buckets, seconds: OCR pages take 0.1 s to a minute.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)

REQUESTS = Counter(
    "ocrserve_http_requests", "HTTP requests answered, by route template and status code.", ["route", "status"]
)
REQUEST_SECONDS = Histogram(
    "ocrserve_http_request_duration_seconds", "HTTP request latency by route template.", ["route"],
    buckets=LATENCY_BUCKETS,
)
PAGES = Counter("ocrserve_pages", "Pages finished, by outcome (ok, failed).", ["outcome"])
PREPROCESS_SECONDS = Histogram(
    "ocrserve_preprocess_seconds", "Seconds to decode and normalize one page.", buckets=LATENCY_BUCKETS
)
ENGINE_SECONDS = Histogram(
    "ocrserve_engine_seconds", "Seconds one page spends in the engine.", buckets=LATENCY_BUCKETS
)
ENGINE_READY = Gauge("ocrserve_engine_ready", "1 once the engine is loaded and warmed up.")
