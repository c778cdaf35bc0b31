"""Webhooks: when a job ends, POST its status to the ``webhook_url`` given at submission.

Guard (SSRF): a URL is accepted, at submission (400 otherwise) and again before each delivery,
only when its scheme is http(s), its host is on ``jobs.webhook_allow_hosts`` (exact names, or
``*.example.com`` for subdomains) and, unless ``jobs.webhook_allow_private``, every address the host
resolves to is global (not loopback, private, link-local, e.g. a cloud metadata address).
Redirects are not followed. (A host that re-resolves to another address between the check and the
connection is not caught; the allow-list is the first line of defence.)

Signature: with ``jobs.webhook_secret`` set, each call carries ``X-Ocrserve-Timestamp`` (Unix
seconds) and ``X-Ocrserve-Signature: sha256=<hex>``, the HMAC-SHA256 of ``timestamp + "." + body``
under the secret, so a receiver can check both origin and freshness (refusing old timestamps
stops replays). Verify with :func:`signature` and a constant-time comparison.

Delivery: at least once. A due webhook is claimed from the store with a lease (so one gateway
sends it, and another takes over if that one dies), sent with exponential back-off
(:func:`ocrserve.backoff.retrying`) on connection errors, timeouts, 408, 429 and 5xx, up to
``jobs.webhook_attempts`` calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from urllib.parse import urlsplit

import httpx
from tenacity import retry_if_exception_type

from ocrserve import backoff, metrics
from ocrserve.alarm import Alarm
from ocrserve.config import JobsConfig
from ocrserve.errors import BadRequest
from ocrserve.jobs.results import job_status
from ocrserve.logs import set_request_id
from ocrserve.store.base import JobStore
from ocrserve.store.health import StoreHealth
from ocrserve.store.job_records import Job

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Ocrserve-Signature"
TIMESTAMP_HEADER = "X-Ocrserve-Timestamp"
#: Statuses a receiver may answer and still be retried.
RETRY_STATUSES = {408, 429}
#: Webhooks sent at once by one gateway.
CONCURRENT_DELIVERIES = 8


def host_allowed(host: str, patterns: list[str]) -> bool:
    """Whether ``host`` matches an allow-list entry: the same name (any case), or a subdomain of
    ``example.com`` for ``*.example.com``."""
    host = host.lower().rstrip(".")
    for pattern in (p.lower().rstrip(".") for p in patterns):
        if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


async def check_webhook_url(url: str, cfg: JobsConfig) -> str:
    """Return ``url`` if webhooks may call it (see the module docstring).

    Raises:
        BadRequest: another scheme, no host, a host off the allow-list, a host that does not
            resolve, or one that resolves to a non-global address while those are not allowed.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port, which urlsplit leaves for later
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket, a port out of range
        raise BadRequest(f"webhook_url={url!r}: not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"webhook_url={url!r}: expected an http:// or https:// URL with a host")
    host = parts.hostname
    if not host_allowed(host, cfg.webhook_allow_hosts):
        allowed = ", ".join(cfg.webhook_allow_hosts) or "none: the list is empty"
        raise BadRequest(
            f"webhook_url host {host!r} is not on jobs.webhook_allow_hosts ({allowed})", slug="webhook-refused"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, ValueError) as exc:
        raise BadRequest(f"webhook_url host {host!r} does not resolve: {exc}", slug="webhook-refused") from None
    if not cfg.webhook_allow_private:
        for *_, sockaddr in infos:
            address = ipaddress.ip_address(sockaddr[0].split("%")[0])
            if not address.is_global:
                raise BadRequest(
                    f"webhook_url host {host!r} resolves to {address}, a loopback, private or link-local address; "
                    "set jobs.webhook_allow_private=true to allow it",
                    slug="webhook-refused",
                )
    return url


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``timestamp + "." + body`` under ``secret``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


class _Retry(Exception):
    """A delivery attempt that may succeed if repeated."""


class WebhookSender:
    """Delivers the webhooks of ended jobs, from whichever gateway claims them.

    Args:
        store: the job store (claims, leases, job status).
        cfg: the ``jobs`` section.
    """

    def __init__(self, store: JobStore, cfg: JobsConfig):
        self.store = store
        self.cfg = cfg
        #: A claimed webhook stays ours this long: every attempt at its longest, with every wait.
        self.lease_s = cfg.webhook_attempts * (cfg.webhook_timeout_s + cfg.webhook_backoff_max_s)
        self._alarm = Alarm()
        self._room = asyncio.Semaphore(CONCURRENT_DELIVERIES)
        self._sending: set[asyncio.Task] = set()
        self._http: httpx.AsyncClient | None = None

    def wake(self) -> None:
        """A job ended here: look for its webhook now rather than at the next poll."""
        self._alarm.ring()

    async def run(self, health: StoreHealth) -> None:
        """Claim due webhooks and send each in a task of its own, until cancelled; claims wait while
        ``health`` says the store fails, and its faults are reported there, not logged each poll."""
        self._http = httpx.AsyncClient(timeout=self.cfg.webhook_timeout_s, follow_redirects=False)
        try:
            while True:
                await self._room.acquire()
                await health.wait_store()
                job = await self._claim(health)
                if job is None:
                    self._room.release()
                    await self._alarm.sleep(self.cfg.poll_interval_s)
                    continue
                task = asyncio.create_task(self._send(job))
                self._sending.add(task)
                task.add_done_callback(self._sent)
        finally:
            for task in list(self._sending):
                task.cancel()
            await asyncio.gather(*self._sending, return_exceptions=True)
            await self._http.aclose()

    async def _claim(self, health: StoreHealth) -> Job | None:
        try:
            return await self.store.claim_webhook(self.lease_s)
        except Exception as exc:
            if not health.report(exc):
                log.warning("cannot claim webhooks from the job store", exc_info=True)
            return None

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)
        self._room.release()
        if not task.cancelled() and task.exception():
            log.error("webhook delivery crashed", exc_info=task.exception())

    async def _send(self, job: Job) -> None:
        set_request_id(job.request_id)  # this task's log lines are about the job's request
        outcome = await self.deliver(job)
        metrics.WEBHOOKS.labels(outcome).inc()
        await self.store.webhook_done(job.id)

    async def deliver(self, job: Job) -> str:
        """POST the job's status to its webhook, retrying; returns delivered, failed or refused."""
        try:
            await check_webhook_url(job.webhook_url, self.cfg)
        except BadRequest as refused:
            log.warning("job %s: webhook not sent: %s", job.id, refused.detail)
            return "refused"
        body = json.dumps(await job_status(self.store, job), separators=(",", ":")).encode()
        try:
            async for attempt in backoff.retrying(
                self.cfg.webhook_attempts,
                self.cfg.webhook_backoff_s,
                self.cfg.webhook_backoff_max_s,
                retry_if_exception_type(_Retry),
            ):
                with attempt:
                    await self._post(job, body)
        except (_Retry, httpx.HTTPStatusError) as exc:
            log.warning("job %s: webhook %s failed: %s", job.id, job.webhook_url, exc)
            return "failed"
        return "delivered"

    async def _post(self, job: Job, body: bytes) -> None:
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Ocrserve-Job": job.id, TIMESTAMP_HEADER: timestamp}
        if self.cfg.webhook_secret:
            headers[SIGNATURE_HEADER] = signature(self.cfg.webhook_secret, timestamp, body)
        try:
            response = await self._http.post(job.webhook_url, content=body, headers=headers)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
            raise _Retry(f"the receiver answered {response.status_code}")
        response.raise_for_status()  # another 4xx: the receiver refuses it, retrying will not help
