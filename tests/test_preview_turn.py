"""The preview turn: one document at a time, in order, and how long the turns ahead would take."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ocrserve.preview_turn import ENOUGH_TURNS, PreviewTurn

TURN_S = 0.05


async def _take(turn: PreviewTurn, seconds: float, order: list[int], n: int) -> None:
    async with turn.turn():
        order.append(n)
        await asyncio.sleep(seconds)


def test_documents_take_the_turn_one_at_a_time_in_the_order_they_came():
    async def scenario() -> list[int]:
        turn, order = PreviewTurn(), []
        await asyncio.gather(*(_take(turn, 0.01, order, n) for n in range(5)))
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]


def test_the_wait_ahead_is_the_turn_held_and_one_median_turn_per_document_waiting():
    async def scenario() -> tuple[float, float, float, float]:
        turn, order = PreviewTurn(), []
        for n in range(ENOUGH_TURNS - 1):
            await _take(turn, TURN_S, order, n)
        unmeasured = turn.ahead_s()  # too few turns timed to say
        await _take(turn, TURN_S, order, ENOUGH_TURNS)
        idle = turn.ahead_s()  # nothing held, nothing waiting
        held = asyncio.create_task(_take(turn, 10 * TURN_S, order, 10))
        waiting = [asyncio.create_task(_take(turn, TURN_S, order, n)) for n in (11, 12)]
        await asyncio.sleep(TURN_S / 5)
        busy = turn.ahead_s()
        waiting[1].cancel()  # a document that gave up leaves the queue
        await asyncio.sleep(0)
        one_left = turn.ahead_s()
        await asyncio.gather(held, waiting[0], waiting[1], return_exceptions=True)
        return unmeasured, idle, busy, one_left

    unmeasured, idle, busy, one_left = asyncio.run(scenario())
    assert unmeasured == 0.0 and idle == 0.0
    # what is left of the median turn held (0.05 s less the 0.01 s it has run), then two medians
    assert busy == pytest.approx(TURN_S * 0.8 + 2 * TURN_S, abs=0.02)
    assert one_left == pytest.approx(TURN_S * 0.8 + TURN_S, abs=0.02)


def test_a_turn_cut_short_by_its_request_is_not_timed():
    async def scenario() -> float:
        turn, order = PreviewTurn(), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, TURN_S, order, n)
        for n in range(ENOUGH_TURNS):  # cut at their limit a moment into the turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_take(turn, 10 * TURN_S, order, 10 + n), TURN_S / 50)
        waiting = asyncio.create_task(_take(turn, TURN_S, order, 20))
        held = asyncio.create_task(_take(turn, TURN_S, order, 21))
        await asyncio.sleep(0)
        ahead = turn.ahead_s()
        await asyncio.gather(waiting, held)
        return ahead

    # the median is still the whole turns' (0.05 s), not the cut ones' (0.001 s)
    assert asyncio.run(scenario()) == pytest.approx(2 * TURN_S, abs=0.02)
