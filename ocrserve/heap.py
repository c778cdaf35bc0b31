"""Freed memory handed back to the kernel.

glibc keeps the heap a process freed for its own reuse, so after one large page or upload a
process keeps its peak resident size for good (a gateway grew by 250 MiB after three 40 MiB
uploads and stayed there). ``malloc_trim(3)`` returns the free heap to the kernel.
"""

from __future__ import annotations

import ctypes
import sys

_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform == "linux" else None
#: A request body at least this large is followed by :func:`trim` (bytes).
LARGE_BODY_BYTES = 8 * 2**20


def trim() -> None:
    """Return this process's free heap to the kernel (glibc ``malloc_trim(0)``); nothing where the
    C library has no such call (musl, macOS)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
