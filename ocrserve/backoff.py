"""Exponential back-off, defined once on tenacity's wait strategies.

Every wait in ocrserve that grows on repeated failure (job page retries and worker pauses, webhook
sends, vLLM restarts, client requests and event streams) doubles from a first wait up to a cap:
the n-th wait (n counted from 1) is ``min(first * 2 ** (n - 1), cap)``. Loops that retry a call use
:func:`retrying` (a tenacity ``AsyncRetrying``); code that keeps its own count of failures (a lease
to renew, a process to restart) asks :func:`delay` for the wait.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_exponential
from tenacity.retry import retry_base


def wait(first: float, cap: float) -> wait_exponential:
    """tenacity's wait strategy for ``first`` seconds after the first failure, doubling each time,
    at most ``cap`` seconds (``wait_exponential`` counts attempts from 1, as :func:`delay` does)."""
    return wait_exponential(multiplier=first, max=cap)


def delay(attempt: int, first: float, cap: float) -> float:
    """Seconds to wait after failure number ``attempt`` (1 = the first):
    ``min(first * 2 ** (attempt - 1), cap)``.

    >>> [delay(n, 2.0, 10.0) for n in (1, 2, 3, 4)]
    [2.0, 4.0, 8.0, 10.0]

    Raises:
        ValueError: ``attempt`` below 1.
    """
    if attempt < 1:
        raise ValueError(f"attempt={attempt}: failures are counted from 1")
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return float(wait(first, cap)(state))


def retrying(
    attempts: int,
    first: float,
    cap: float,
    retry: retry_base,
    hint: Callable[[BaseException], float | None] | None = None,
) -> AsyncRetrying:
    """An ``async for attempt in retrying(...): with attempt: ...`` loop: at most ``attempts``
    calls, retried while ``retry`` says so, waiting :func:`delay` (``first`` doubling up to ``cap``)
    between them, or longer where ``hint`` reads a wait from the failure (a ``Retry-After``, at most
    ``cap`` seconds); the last failure is re-raised as itself (not as ``tenacity.RetryError``)."""
    doubling = wait(first, cap)

    def waited(state: RetryCallState) -> float:
        told = hint(state.outcome.exception()) if hint and state.outcome else None
        return max(doubling(state), min(told or 0.0, cap))

    return AsyncRetrying(retry=retry, stop=stop_after_attempt(attempts), wait=waited, reraise=True)
