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
    "ocrserve_http_request_duration_seconds",
    "HTTP request latency by route template.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
PAGES = Counter("ocrserve_pages", "Pages finished, by outcome (ok, failed).", ["outcome"])
BLANK_PAGES = Counter(
    "ocrserve_blank_pages",
    "Pages found blank (no ink) after decoding and answered with empty text, without the engine.",
)
PREPROCESS_SECONDS = Histogram(
    "ocrserve_preprocess_seconds", "Seconds to decode and normalize one page.", buckets=LATENCY_BUCKETS
)
LINE_COUNTS = Counter(
    "ocrserve_line_counts",
    "Requests priced on their line units before admission, by how they were had: counted on previews, or kept "
    "from an earlier post of the same document and pages (any client's, a retry's among them).",
    ["how"],
)
ENGINE_SECONDS = Histogram("ocrserve_engine_seconds", "Seconds one page spends in the engine.", buckets=LATENCY_BUCKETS)
ENGINE_READY = Gauge("ocrserve_engine_ready", "1 once the engine is loaded and warmed up.")

# Router (lanes, admission, dispatch)
QUEUED_PAGES = Gauge("ocrserve_queued_pages", "Pages admitted to a lane and not yet in the engine.", ["lane"])
QUEUED_COST = Gauge(
    "ocrserve_queued_cost",
    "Cost of the pages queued in a lane and not yet in the engine: pages, or visual tokens (router.cost).",
    ["lane"],
)
QUEUE_DEPTH = Gauge("ocrserve_queue_depth", "Requests admitted to a lane and not yet finished.", ["lane"])
CONCURRENCY_LIMIT = Gauge(
    "ocrserve_engine_concurrency_limit",
    "Pages the router keeps in the engine at most now (fixed, or following latency: router.concurrency).",
)
ACTIVE_CLIENTS = Gauge(
    "ocrserve_lane_active_clients", "Clients (router.fair_by) with a request admitted to a lane.", ["lane"]
)
ADMISSION_ESTIMATE_ERROR = Histogram(
    "ocrserve_admission_estimate_error_seconds",
    "An admitted request's seconds minus the router's estimate at admission (negative: done sooner).",
    ["lane"],
    buckets=(-60, -30, -10, -5, -2, -1, -0.5, 0, 0.5, 1, 2, 5, 10, 30, 60),
)
ADMISSION_BOUND_RATIO = Histogram(
    "ocrserve_admission_bound_ratio",
    "An admitted request's seconds over the bound admission held it to (the estimate with the work ahead of it "
    "widened while uncertain); above 1: it ran longer than admission allowed for, and a deadline near the bound "
    "is missed.",
    ["lane"],
    buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5),
)
ADMITTED_DEADLINE_MISSES = Counter(
    "ocrserve_admitted_deadline_misses",
    "Requests admitted with a deadline that still passed before they finished (the estimate was wrong).",
    ["lane"],
)
ADMISSION_EVIDENCE_WAIT_SECONDS = Histogram(
    "ocrserve_admission_evidence_wait_seconds",
    "Seconds a request waited at admission for finished pages to narrow the cost model's margin for what it has "
    "not seen (router.evidence_wait_s), before it was admitted or refused.",
    ["lane"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
)
QUEUE_WAIT_SECONDS = Histogram(
    "ocrserve_queue_wait_seconds",
    "Seconds a page waited in its lane for an engine slot.",
    ["lane"],
    buckets=(0.001, 0.01, 0.05) + LATENCY_BUCKETS,
)
REQUEST_LATENCY_SECONDS = Histogram(
    "ocrserve_request_latency_seconds",
    "End-to-end seconds of a synchronous OCR request, by lane.",
    ["lane"],
    buckets=LATENCY_BUCKETS,
)
SLOTS_IN_USE = Gauge("ocrserve_engine_slots_in_use", "Pages in the engine now.")
ENGINE_PAGES = Counter("ocrserve_engine_pages", "Pages handed to the engine, by lane.", ["lane"])
PROBLEMS = Counter(
    "ocrserve_problems",
    "Problem responses (RFC 9457) the gateway answered, by their type's last segment (queue-full, "
    "deadline-unmeetable, latency-target, engine-down, ...) and HTTP status.",
    ["type", "status"],
)
REJECTIONS = Counter(
    "ocrserve_rejections",
    "Requests or pages refused or dropped, by lane and reason (queue_full, deadline_unmeetable, latency_target, "
    "engine_promised, admission_timeout, deadline, cancelled, too_large, rate_limited, tenant_quota).",
    ["lane", "reason"],
)
ADMISSION_PROBES = Counter(
    "ocrserve_admission_probes",
    "Pages run to teach admission's cost model while it was warming and the engine idle: the first page of a "
    "request refused only for the model's margin for what it has not seen, at the lowest priority, its result "
    "kept for that client's retry; by the refused request's lane.",
    ["lane"],
)
ABORTED_PAGES = Counter(
    "ocrserve_engine_aborted_pages",
    "Pages cancelled while in the engine (vLLM aborts the request), by lane and "
    "reason (deadline, cancelled: client gone or job cancelled).",
    ["lane", "reason"],
)
BATCH_SIZE = Histogram(
    "ocrserve_engine_batch_size",
    "Items per engine batch (recognition crops for the embedded engine).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)

# vLLM replicas behind the vllm engine (polled from each replica's /metrics and /health)
VLLM_REPLICA_UP = Gauge(
    "ocrserve_vllm_replica_up", "1 while the replica answers /health and serves the model.", ["replica"]
)
VLLM_REPLICA_UP_CHANGED = Gauge(
    "ocrserve_vllm_replica_up_changed_timestamp_seconds",
    "Unix time ocrserve_vllm_replica_up last changed (of the first poll while the replica was never up).",
    ["replica"],
)
VLLM_REQUESTS_WAITING = Gauge(
    "ocrserve_vllm_requests_waiting", "vllm:num_requests_waiting of the replica at the last poll.", ["replica"]
)
VLLM_REQUESTS_RUNNING = Gauge(
    "ocrserve_vllm_requests_running", "vllm:num_requests_running of the replica at the last poll.", ["replica"]
)
VLLM_KV_CACHE_USAGE = Gauge(
    "ocrserve_vllm_kv_cache_usage_ratio",
    "vllm:kv_cache_usage_perc of the replica at the last poll (0-1).",
    ["replica"],
)
VLLM_REQUESTS = Counter(
    "ocrserve_vllm_requests",
    "Chat-completion requests sent to a replica, by outcome (ok; unavailable: connection "
    "error or 503, retried elsewhere; timeout; error: any other status).",
    ["replica", "outcome"],
)

# Durable jobs (ocrserve.jobs): intake, this gateway's worker, webhooks, retention, dedup cache
JOBS_SUBMITTED = Counter(
    "ocrserve_jobs_submitted",
    "Job submissions answered 202, by kind (new; replay: an Idempotency-Key seen before with the same request).",
    ["kind"],
)
JOBS_FINISHED = Counter("ocrserve_jobs_finished", "Jobs ended here, by final status.", ["status"])
JOB_PAGES = Counter(
    "ocrserve_jobs_pages",
    "Job pages this gateway's worker finished or gave back, by outcome (done; failed; "
    "retried: transient failure, queued again after a backoff; duplicate: another claimant finished it first).",
    ["outcome"],
)
JOB_CLAIMS = Counter(
    "ocrserve_jobs_claims",
    "Job pages claimed by this gateway's worker, by kind (first; again: a retry, or a page "
    "whose earlier claimant stopped renewing its lease).",
    ["kind"],
)
JOB_PAGES_IN_FLIGHT = Gauge("ocrserve_jobs_pages_in_flight", "Job pages this gateway's worker holds now.")
JOB_BACKLOG = Gauge(
    "ocrserve_jobs_backlog_pages",
    "Job pages queued or running in the store, all gateways together (sampled).",
)
JOB_ADMISSION_WAITS = Counter(
    "ocrserve_jobs_admission_waits",
    "Times the worker found the bulk lane full and waited before claiming.",
)
WEBHOOKS = Counter(
    "ocrserve_jobs_webhooks",
    "Webhook deliveries, by outcome (delivered; failed: every attempt failed; refused: "
    "the address was no longer allowed).",
    ["outcome"],
)
JOBS_EXPIRED = Counter("ocrserve_jobs_expired", "Jobs deleted with their files after jobs.retention_s.")
DEDUP_LOOKUPS = Counter("ocrserve_dedup_lookups", "Dedup-cache lookups, by result (hit, miss).", ["result"])
