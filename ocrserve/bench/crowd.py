"""Ordinary clients of a gateway, for ``scripts/many_clients.py``: one post and its answer
(:func:`post`, :class:`Outcome`), and a flood of clients posting a document over and over
(:func:`flood`), which the script runs in a process of its own at a low priority, so that on the
gateway's own machine the clients' CPU is not taken from the gateway it measures."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from ocrserve.bench.page_mixes import PageMix

#: Statuses of a refusal at the door.
REFUSED = (429, 503)


@dataclass(frozen=True)
class Outcome:
    """One request's answer: its HTTP status (0: no answer at all), seconds, ``Retry-After``, how
    many posts it took (a retrying client's), and for a problem response, the last segment of its
    ``type`` (``admission-timeout``, ``deadline-unmeetable``, ...)."""

    status: int
    seconds: float
    retry_after: str | None = None
    posts: int = 1
    problem: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


def post(
    url: str, mix: PageMix, client: str, timeout: float | None = None, priority: str | None = None, timed: bool = False
) -> Outcome:
    """POST the mix's document to ``/v1/ocr`` as ``client`` (``X-Client-Id``) and wait for the
    answer; where ``timed``, an answered page's server-side timings (its first page's) come with it."""
    form = {key: str(value) for key, value in (("timeout", timeout), ("priority", priority)) if value}
    started = time.monotonic()
    try:
        response = httpx.post(
            url + "/v1/ocr",
            files={"file": (mix.filename, mix.document)},
            data=form,
            headers={"X-Client-Id": client},
            timeout=None,
        )
    except httpx.TransportError:
        return Outcome(0, time.monotonic() - started)
    problem = None
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        problem = str(response.json().get("type", "")).rsplit("/", 1)[-1] or None
    seconds, retry_after = time.monotonic() - started, response.headers.get("retry-after")
    timings = response.json()["pages"][0]["timings"] if timed and response.status_code == 200 else {}
    return Outcome(response.status_code, seconds, retry_after, problem=problem, timings=timings)


def flood(url: str, mix: PageMix, clients: int, seconds: float, priority: str | None = None) -> list[Outcome]:
    """``clients`` clients (``c0``, ``c1``, ...) each posting the mix's document with ``priority``
    (None: the form field left out) one post after another for ``seconds`` s; a refused one waits
    its ``Retry-After`` (1 s where there is none), as a well-behaved client does. Returns every
    post's outcome, once each client's last post is answered."""
    stop, outcomes = threading.Event(), []

    def client(name: str) -> None:
        while not stop.is_set():
            outcome = post(url, mix, name, priority=priority)
            outcomes.append(outcome)
            if outcome.status in REFUSED:
                stop.wait(float(outcome.retry_after or 1))

    threads = [threading.Thread(target=client, args=(f"c{i}",), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return outcomes
