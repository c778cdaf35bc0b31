"""The dedup cache: a document OCR'd before, with the same parameters and model, is not OCR'd again.

The key is the sha256 of the document's bytes, the canonical parameters (the 0-based pages
selected, and the pixel budget the pages are normalized to) and the model id. An entry is the
list of that document's page results (``PageResult.to_dict()``), kept as a file under
``store.data_dir/cache``; the store indexes the keys by last use and evicts the least recently
used beyond ``store.cache_entries``. Only documents whose every page succeeded are cached.
Applies to synchronous requests (``POST /v1/ocr``) and to jobs alike. The cache is an
optimization: when its store cannot be reached, a lookup is a miss and a put is skipped (logged).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from ocrserve import metrics
from ocrserve.config import PreprocessConfig
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir

#: Preprocessing settings that change the result: the pixels a model sees, whether a page's
#: orientation is read, whether a PDF page's own text layer answers it, whether a blank page is read.
NORMALIZATION_KEYS = (
    "min_pixels",
    "max_pixels",
    "factor",
    "max_side",
    "pdf_dpi",
    "orientation",
    "pdf_text",
    "blank_check",
)

log = logging.getLogger(__name__)


def normalization(preprocess: PreprocessConfig) -> dict:
    """The :data:`NORMALIZATION_KEYS` of ``preprocess``: the settings a cache key holds."""
    return preprocess.model_dump(include=set(NORMALIZATION_KEYS))


def dedup_key(sha256: str, indices: list[int], model: str, settings: dict) -> str:
    """The hex sha256 over a document's content hash, its selected pages (0-based), the model id
    and the normalization ``settings`` (:func:`normalization`): the cache's key, and
    ``ocrserve batch``'s resume key."""
    canonical = json.dumps(
        {"sha256": sha256, "pages": list(indices), "model": model, "normalization": settings},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class DedupCache:
    """Document results by content, parameters and model.

    Args:
        store: indexes the entries (LRU).
        data: holds the entries' files.
        max_entries: entries kept; 0 turns the cache off.
        model: the engine's model id.
        preprocess: the normalization settings (part of the key).
    """

    def __init__(self, store: JobStore, data: DataDir, max_entries: int, model: str, preprocess: PreprocessConfig):
        self.store = store
        self.data = data
        self.max_entries = max_entries
        self.model = model
        self._normalization = normalization(preprocess)

    @property
    def enabled(self) -> bool:
        """False when ``store.cache_entries`` is 0."""
        return self.max_entries > 0

    def key(self, sha256: str, indices: list[int]) -> str:
        """The cache key of a document's pages ``indices`` ("" with the cache off)."""
        if not self.enabled:
            return ""
        return dedup_key(sha256, indices, self.model, self._normalization)

    async def get(self, key: str) -> list[dict] | None:
        """The cached page results of ``key``, or None (counted as a hit or a miss)."""
        pages = None
        try:
            if key and await self.store.cache_touch(key):
                pages = await asyncio.to_thread(self.data.read_json, self.data.cache_path(key))
        except FileNotFoundError:
            pages = None  # evicted between the index and the file
        except Exception:
            log.warning("dedup cache lookup failed; answering without it", exc_info=True)
        metrics.DEDUP_LOOKUPS.labels("hit" if pages is not None else "miss").inc()
        return pages

    async def put(self, key: str, pages: list[dict]) -> None:
        """Cache a document's page results (all succeeded), evicting the least recently used entries."""
        if not key:
            return
        try:
            await asyncio.to_thread(self.data.write_json, self.data.cache_path(key), pages)
            for evicted in await self.store.cache_add(key, self.max_entries):
                await asyncio.to_thread(self.data.remove, self.data.cache_path(evicted))
        except Exception:
            log.warning("dedup cache update failed; the result is not cached", exc_info=True)
