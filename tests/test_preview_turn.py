"""The preview turn: one document at a time, in order, and how long the turns ahead would take."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ocrserve.preview_turn import ENOUGH_TURNS, PreviewTurn

PAGE_S = 0.025  # a previewed page's seconds in these turns
PRIOR_S = 0.1  # the turns' prior, a page
NEW = "a document not yet posted"


async def _take(
    turn: PreviewTurn, pages: int, order: list[int], n: int, page_s: float = PAGE_S, document: str | None = None
) -> None:
    """Hold the turn for ``pages`` pages of ``document`` (its own, n's, by default) at ``page_s``
    a page; a post that finds ``document`` counted (page_s 0) leaves it untimed."""
    async with turn.turn(pages, document or f"document {n}") as held:
        order.append(n)
        if not page_s:
            held.untimed()
        await asyncio.sleep(pages * page_s)


def test_documents_take_the_turn_one_at_a_time_in_the_order_they_came():
    async def scenario() -> list[int]:
        turn, order = PreviewTurn(PRIOR_S), []
        await asyncio.gather(*(_take(turn, 1, order, n, 0.01) for n in range(5)))
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]


def test_before_turns_are_timed_the_documents_ahead_are_priced_by_the_prior_a_page():
    async def scenario() -> tuple[float, float, float]:
        turn, order = PreviewTurn(PRIOR_S), []
        idle = turn.previewed_in_s(1, NEW)
        held = asyncio.create_task(_take(turn, 2, order, 0, 8 * PAGE_S))
        waiting = asyncio.create_task(_take(turn, 3, order, 1))
        await asyncio.sleep(0)
        fresh = turn.previewed_in_s(1, NEW)  # a 2-page turn just begun and 3 pages waiting, at the prior
        await held
        one_timed = turn.previewed_in_s(1, NEW)  # the waiting document in the turn now
        await waiting
        return idle, fresh, one_timed

    idle, fresh, one_timed = asyncio.run(scenario())
    assert idle == pytest.approx(PRIOR_S)  # its own page
    assert fresh == pytest.approx(6 * PRIOR_S, abs=0.02)
    # one turn timed (0.2 s a page) and the prior (0.1 s): their median, for 3 pages just begun and its own
    assert one_timed == pytest.approx(4 * (8 * PAGE_S + PRIOR_S) / 2, abs=0.03)


def test_the_wait_is_the_turn_held_and_the_pages_waiting_and_its_own_at_the_median_turns_seconds_a_page():
    async def scenario() -> tuple[float, float, float]:
        turn, order = PreviewTurn(PRIOR_S), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, 2, order, n)
        idle = turn.previewed_in_s(1, NEW)  # nothing held, nothing waiting
        held = asyncio.create_task(_take(turn, 2, order, 10, 10 * PAGE_S))
        waiting = [asyncio.create_task(_take(turn, pages, order, n)) for n, pages in ((11, 1), (12, 3))]
        await asyncio.sleep(PAGE_S / 5)
        busy = turn.previewed_in_s(1, NEW)
        waiting[1].cancel()  # a document that gave up leaves the queue
        await asyncio.sleep(0)
        one_left = turn.previewed_in_s(1, NEW)
        await asyncio.gather(held, waiting[0], waiting[1], return_exceptions=True)
        return idle, busy, one_left

    idle, busy, one_left = asyncio.run(scenario())
    assert idle == pytest.approx(PAGE_S, abs=0.005)  # its own page
    # what is left of the 2-page turn held (0.05 s less the 0.005 s it has run), 1 + 3 pages, its own
    assert busy == pytest.approx(2 * PAGE_S * 0.9 + 5 * PAGE_S, abs=0.02)
    assert one_left == pytest.approx(2 * PAGE_S * 0.9 + 2 * PAGE_S, abs=0.02)


def test_a_turn_cut_a_moment_into_it_is_not_timed():
    async def scenario() -> float:
        turn, order = PreviewTurn(PRIOR_S), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, 2, order, n)
        for n in range(ENOUGH_TURNS):  # cut at their limit a moment into the turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_take(turn, 2, order, 10 + n, 10 * PAGE_S), PAGE_S / 25)
        waiting = asyncio.create_task(_take(turn, 2, order, 20))
        held = asyncio.create_task(_take(turn, 2, order, 21))
        await asyncio.sleep(0)
        ahead = turn.previewed_in_s(1, NEW)
        await asyncio.gather(waiting, held)
        return ahead

    # the median is still the whole turns' (0.025 s a page), not the cut ones' (0.0005 s)
    assert asyncio.run(scenario()) == pytest.approx(5 * PAGE_S, abs=0.02)


def test_a_turn_cut_after_longer_than_a_typical_turn_is_timed_as_at_least_that():
    async def scenario() -> float:
        turn, order = PreviewTurn(PRIOR_S), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, 2, order, n)
        for n in range(ENOUGH_TURNS + 1):  # cut at their limit 8 typical pages' seconds into the turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_take(turn, 1, order, 10 + n, 20 * PAGE_S), 8 * PAGE_S)
        return turn.previewed_in_s(1, NEW)

    # the turns took at least 0.2 s a page: three of the five timed, their median
    assert asyncio.run(scenario()) == pytest.approx(8 * PAGE_S, abs=0.02)


def test_posts_of_one_document_count_its_pages_once_and_none_where_one_is_ahead():
    async def scenario() -> tuple[float, float, float]:
        turn, order = PreviewTurn(PRIOR_S), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, 2, order, n)
        held = asyncio.create_task(_take(turn, 2, order, 10, 10 * PAGE_S, "held"))
        waiting = [
            asyncio.create_task(_take(turn, pages, order, n, PAGE_S, document))
            for n, pages, document in ((11, 2, "twice"), (12, 3, "once"), (13, 2, "twice"), (14, 2, "held"))
        ]
        await asyncio.sleep(0)
        new, twice, held_again = (turn.previewed_in_s(1, d) for d in (NEW, "twice", "held"))
        await asyncio.gather(held, *waiting)
        return new, twice, held_again

    new, twice, held_again = asyncio.run(scenario())
    held_left, ahead = 2 * PAGE_S, (2 + 3) * PAGE_S  # "twice" once, "once"; "held" held already
    assert new == pytest.approx(held_left + ahead + PAGE_S, abs=0.01)
    assert twice == pytest.approx(held_left + ahead, abs=0.01)
    assert held_again == pytest.approx(held_left + ahead, abs=0.01)


def test_a_turn_that_took_its_units_kept_is_not_timed():
    async def scenario() -> float:
        turn, order = PreviewTurn(PRIOR_S), []
        for n in range(ENOUGH_TURNS):
            await _take(turn, 2, order, n, 8 * PAGE_S, "counted")
        for n in range(3 * ENOUGH_TURNS):  # posts of the same document, its units kept
            await _take(turn, 2, order, 10 + n, 0, "counted")
        return turn.previewed_in_s(1, NEW)

    # the counted turns' 0.2 s a page, not the kept ones' nothing
    assert asyncio.run(scenario()) == pytest.approx(8 * PAGE_S, abs=0.02)
