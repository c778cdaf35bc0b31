"""Persistence of jobs: the job store (SQLite or Redis), the data folder and the dedup cache.

:func:`open_store` picks a :class:`~ocrserve.store.base.JobStore` implementation from ``store.url``.
"""

from __future__ import annotations

from pathlib import Path

from ocrserve.config import StoreConfig
from ocrserve.extras import require
from ocrserve.store.base import JobStore
from ocrserve.store.sqlite_store import SqliteStore

#: ``store.url`` schemes of the Redis store.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def sqlite_path(url: str, data_dir: Path) -> Path:
    """The database file of a ``sqlite:///`` URL (relative after three slashes, absolute after four);
    an empty URL means ``<data_dir>/jobs.db``.

    Raises:
        ValueError: a URL of another scheme, or without a path.
    """
    if not url:
        return data_dir / "jobs.db"
    if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
        raise ValueError(f"store.url={url!r}: expected sqlite:///path.db or redis://host:port/db")
    return Path(url[len("sqlite:///") :])


def check_store(cfg: StoreConfig) -> None:
    """Fail as :func:`open_store` would, without opening anything: for a command to check before it
    starts a server.

    Raises:
        ValueError: an unknown URL scheme (the message names ``store.url``).
        ocrserve.extras.MissingExtra: a Redis URL without the ``redis`` extra (redis-py).
    """
    if _is_redis(cfg.url):
        require("redis", "a Redis store.url")
    else:
        sqlite_path(cfg.url, cfg.data_dir)


def open_store(cfg: StoreConfig) -> JobStore:
    """The store ``cfg.url`` names (created on first use).

    Raises:
        ValueError: an unknown URL scheme (the message names ``store.url``).
        ocrserve.extras.MissingExtra: a Redis URL without the ``redis`` extra (redis-py).
    """
    check_store(cfg)
    if _is_redis(cfg.url):
        from ocrserve.store.redis_store import RedisStore  # redis-py is an optional extra

        return RedisStore(cfg.url, prefix=cfg.key_prefix)
    return SqliteStore(sqlite_path(cfg.url, cfg.data_dir))


def open_buckets(cfg: StoreConfig):
    """Rate-limit buckets shared through the Redis store (a
    :class:`~ocrserve.store.buckets.RedisBuckets`), or None with the SQLite store (each gateway then
    keeps its own in memory).

    Raises:
        ocrserve.extras.MissingExtra: a Redis URL without the ``redis`` extra (redis-py).
    """
    if not _is_redis(cfg.url):
        return None
    check_store(cfg)
    from ocrserve.store.buckets import RedisBuckets  # redis-py is an optional extra

    return RedisBuckets(cfg.url, prefix=cfg.key_prefix)


def _is_redis(url: str) -> bool:
    return url.startswith(REDIS_SCHEMES)
