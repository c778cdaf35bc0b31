"""Tenants: whom a request acts for, found from its API key (``server.api_keys``).

Each key acts for one tenant, which owns the jobs submitted with it and their ``Idempotency-Key``
values; several keys may share a tenant. Without keys every request acts for the anonymous tenant.
A key is known by its SHA-256 only: a presented key is hashed and compared with every configured
hash in constant time (``hmac.compare_digest``, no early exit), and records and logs name its
tenant (unless one is configured, ``key-`` and the first 8 hex digits of its hash), never the key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from ocrserve.api.ratelimit import Limit
from ocrserve.config import ApiKey, Config
from ocrserve.store.job_records import ANONYMOUS

#: The policy name of the per-key request limit in the RateLimit fields.
REQUESTS_POLICY = "requests"


@dataclass(frozen=True)
class Principal:
    """Whom a request acts for.

    Attributes:
        tenant: the owner of its jobs and ``Idempotency-Key`` values (``ANONYMOUS`` without keys).
        key_sha256: hex SHA-256 of its key, the identity of its rate limit; "" without keys (the
            client address is the identity then).
        limit: its request limit, or None for none.
        max_queued_pages: its submissions' quota of the tenant's queued pages; 0 = none.
    """

    tenant: str
    key_sha256: str
    limit: Limit | None
    max_queued_pages: int


class KeyRing:
    """The configured keys and what each acts for.

    Args:
        config: the profile: ``server.api_keys``, the defaults ``server.rate_limit`` and
            ``jobs.max_queued_pages_per_tenant``.
    """

    def __init__(self, config: Config):
        server, jobs = config.server, config.jobs
        self.anonymous = Principal(
            ANONYMOUS,
            "",
            _limit(server.rate_limit.requests_per_s, server.rate_limit.burst, "server.rate_limit"),
            jobs.max_queued_pages_per_tenant,
        )
        self._keys = [(bytes.fromhex(entry.sha256), _principal(entry, config)) for entry in server.key_entries()]

    def __bool__(self) -> bool:
        """Whether any key is configured (requests must then present one)."""
        return bool(self._keys)

    def match(self, key: str) -> Principal | None:
        """The principal of ``key``, or None when no configured key is it. Every configured hash is
        compared, in constant time, whichever matches."""
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        for known, principal in self._keys:
            if hmac.compare_digest(digest, known):
                found = principal
        return found


def _principal(entry: ApiKey, config: Config) -> Principal:
    """What ``entry`` acts for: its own limit and quota where it sets them, else the defaults."""
    defaults = config.server.rate_limit
    rate = defaults.requests_per_s if entry.requests_per_s is None else entry.requests_per_s
    burst = defaults.burst if entry.burst is None else entry.burst
    quota = config.jobs.max_queued_pages_per_tenant if entry.max_queued_pages is None else entry.max_queued_pages
    own = entry.requests_per_s is not None or entry.burst is not None
    setting = f"the requests_per_s and burst of a key of tenant {entry.tenant_name}" if own else "server.rate_limit"
    return Principal(entry.tenant_name, entry.sha256, _limit(rate, burst, setting), quota)


def _limit(rate: float, burst: int, setting: str) -> Limit | None:
    """The request limit ``setting`` describes, or None when ``rate`` is 0 (off)."""
    return Limit(REQUESTS_POLICY, rate, burst, setting) if rate else None
