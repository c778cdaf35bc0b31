"""The one back-off helper: its waits, and its tenacity retry loop."""

from __future__ import annotations

import pytest
from tenacity import retry_if_exception_type

from ocrserve import backoff


def test_delay_doubles_from_the_first_wait_up_to_the_cap():
    assert [backoff.delay(n, 2.0, 120.0) for n in range(1, 9)] == [2, 4, 8, 16, 32, 64, 120, 120]
    assert [backoff.delay(n, 0.5, 10.0) for n in range(1, 7)] == [0.5, 1, 2, 4, 8, 10]
    for n in range(1, 40):
        assert backoff.delay(n, 0.2, 60.0) == min(0.2 * 2 ** (n - 1), 60.0)
    assert backoff.delay(10_000, 1.0, 60.0) == 60.0  # no overflow
    with pytest.raises(ValueError, match="counted from 1"):
        backoff.delay(0, 1.0, 60.0)


async def test_retrying_calls_at_most_attempts_times_and_reraises_the_last_failure():
    calls = []

    async def flaky(fail: int) -> str:
        calls.append(fail)
        if len(calls) <= fail:
            raise ConnectionError(f"call {len(calls)}")
        return "ok"

    async for attempt in backoff.retrying(3, 0.01, 0.02, retry_if_exception_type(ConnectionError)):
        with attempt:
            result = await flaky(2)
    assert result == "ok" and len(calls) == 3
    waits = backoff.retrying(3, 0.01, 0.02, retry_if_exception_type(ConnectionError))
    calls.clear()
    with pytest.raises(ConnectionError, match="call 3"):
        async for attempt in waits:
            with attempt:
                await flaky(5)
    assert len(calls) == 3
    assert waits.statistics["idle_for"] == pytest.approx(0.01 + 0.02, abs=1e-9)  # the delays 1 and 2
    calls.clear()
    with pytest.raises(KeyError):  # not retried
        async for attempt in backoff.retrying(3, 0.01, 0.02, retry_if_exception_type(ConnectionError)):
            with attempt:
                calls.append(1)
                raise KeyError("x")
    assert len(calls) == 1
