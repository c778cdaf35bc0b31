"""API keys as a profile gives them: a key's SHA-256, the tenant a key acts for when the profile
names none, and the rules that keep two entries of ``server.api_keys`` from merging tenants unseen.

:class:`ocrserve.config.ApiKey` holds an entry (the key or its digest, its tenant and limits) and
validates it with these; the gateway (:mod:`ocrserve.api.tenants`) finds a presented key by its
digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: A tenant's name: it is kept with every job it owns and may appear in logs, so it is no secret.
TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: Hex digits of a key's SHA-256 that name its tenant when none is configured (``key-<digits>``).
DERIVED_TENANT_DIGITS = 8
_HEX = frozenset("0123456789abcdef")


def key_sha256(key: str) -> str:
    """A key's SHA-256, hex (FIPS 180-4)."""
    return hashlib.sha256(key.encode()).hexdigest()


def given_sha256(value: str) -> str:
    """A key's SHA-256 as a profile gives it (``key_sha256``), stripped and lower-cased; ``""``
    stays ``""`` (no digest given).

    Raises:
        ValueError: not 64 hex digits.
    """
    digest = value.strip().lower()
    if digest and (len(digest) != 64 or any(c not in _HEX for c in digest)):
        raise ValueError("expected 64 hex digits (the SHA-256 of the key)")
    return digest


def derived_tenant(sha256: str) -> str:
    """The tenant of a key whose entry names none: ``key-`` and the first
    :data:`DERIVED_TENANT_DIGITS` hex digits of its SHA-256."""
    return f"key-{sha256[:DERIVED_TENANT_DIGITS]}"


def check_distinct(keys: Sequence[tuple[str, str | None, str]]) -> None:
    """Refuse a key given twice, or a tenant derived from a key that another entry gets too (two
    keys whose SHA-256 begin alike): either would merge tenants unseen.

    Args:
        keys: each entry's ``(sha256, configured tenant or None, tenant it acts for)``, in order.

    Raises:
        ValueError: naming the entries at fault by position.
    """
    digests = [digest for digest, _, _ in keys]
    for n, digest in enumerate(digests):
        if digests.index(digest) != n:
            raise ValueError(f"entries {digests.index(digest)} and {n} are the same key")
    for n, (_, configured, tenant) in enumerate(keys):
        others = [m for m, other in enumerate(keys) if m != n and other[2] == tenant]
        if configured is None and others:
            raise ValueError(f"entries {others[0]} and {n} both get tenant {tenant}: name their tenants")
