"""Capacity planning from measured figures: Little's law, replicas for a target utilization, and a
discrete-event simulation of one engine that predicts latency at an arrival rate.

The engine is modelled as continuous batching: it runs up to ``max_batch`` pages at once, and
while ``n`` run each progresses at ``1 / T(n)`` of a page a second, ``T(n) = a + b x n``; a
waiting page joins the moment one finishes (vLLM's scheduler adds requests to the running batch
at every step; the embedded engine's pages share its cores the same way). A page alone takes
``T(1)``; ``n`` together take ``T(n)`` each, ``n / T(n)`` pages a second. ``a`` and ``b`` are fitted
from a closed-loop concurrency sweep, where ``B`` pages are always in flight and each finishes every
``T(B) = B / throughput(B)`` seconds.

Requests are documents, and documents are not alike: each is a tuple of its pages' work factors
(a page's seconds alone over a mean page's), measured at the sweep's lowest concurrency; its pages
queue together and it is done when its last page is. A simulated request is one of the measured
documents drawn at random; a replayed one is the document the bench sent at the time it sent it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: Utilization a replica is planned for (``--utilization``): headroom for bursts of arrivals.
TARGET_UTILIZATION = 0.7
#: Pages the simulation runs through per prediction (after :data:`WARM_UP_PAGES`).
SIMULATED_PAGES = 20_000
#: Pages the simulation lets through before it measures, so the queue is in its steady state.
WARM_UP_PAGES = 1_000


def in_flight(rate: float, latency_s: float) -> float:
    """Little's law, ``L = lambda x W``: pages in the system on average when ``rate`` pages/s
    arrive and each spends ``latency_s`` seconds in it (Little, Operations Research 9(3), 1961)."""
    return rate * latency_s


def replicas(rate: float, service_rate: float, utilization: float = TARGET_UTILIZATION) -> int:
    """Engine replicas for ``rate`` pages/s: ``N = ceil(lambda / (mu x rho))``, ``mu`` the pages/s one
    replica sustains, ``rho`` the utilization each is planned for (at least 1).

    Raises:
        ValueError: a ``service_rate`` that is not positive, or ``utilization`` outside (0, 1].
    """
    if service_rate <= 0:
        raise ValueError(f"a replica's service rate must be positive, got {service_rate}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    return max(1, math.ceil(rate / (service_rate * utilization) - 1e-9))


#: A document's pages' work factors: each page's seconds alone over a mean page's.
Work = tuple[float, ...]


@dataclass(frozen=True)
class ServiceModel:
    """``T(B) = a + b x B``: seconds for a batch of ``B`` pages, at most ``max_batch`` at once.

    Attributes:
        a: seconds of a batch whatever its size.
        b: seconds an average page adds to its batch.
        max_batch: the engine's pages at once (its slots).
        documents: the measured documents (module docstring), drawn at random for simulated
            requests; ``((1.0,),)``: every request one average page.
    """

    a: float
    b: float
    max_batch: int
    documents: tuple[Work, ...] = ((1.0,),)

    def seconds(self, batch: float) -> float:
        """``T(batch)``, seconds; ``batch`` may be a sum of pages' factors."""
        return self.a + self.b * batch

    @property
    def max_rate(self) -> float:
        """Pages/s at full batches, ``max_batch / T(max_batch)``: the rate the queue cannot outgrow."""
        return self.max_batch / self.seconds(self.max_batch)

    @property
    def pages_per_document(self) -> float:
        """Mean pages of the measured documents."""
        return sum(len(d) for d in self.documents) / len(self.documents)

    @classmethod
    def fit(cls, sweep: Sequence[tuple[int, float]], documents: Sequence[Work] = ()) -> ServiceModel:
        """Least squares of ``T(B) = B / throughput(B)`` over a closed-loop sweep's
        ``(concurrency B, pages/s)``; ``max_batch`` is the largest ``B``. ``a`` and ``b`` are kept
        at 0 or more (a negative intercept from noise would make small batches free). ``documents``:
        each measured document's pages' work factors; none given: one average page.

        Raises:
            ValueError: fewer than two distinct concurrencies, or a throughput that is not positive.
        """
        if any(rate <= 0 for _, rate in sweep):
            raise ValueError("every point of the sweep needs a positive throughput")
        points = [(b, b / rate) for b, rate in sweep]
        sizes = {b for b, _ in points}
        if len(sizes) < 2:
            raise ValueError("fitting T(B) = a + b x B needs at least two concurrencies")
        mean_b = sum(b for b, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum((b - mean_b) ** 2 for b, _ in points)
        slope = max(0.0, slope)
        intercept = max(0.0, mean_t - slope * mean_b)
        return cls(intercept, slope, max(sizes), tuple(documents) or ((1.0,),))


def simulate(model: ServiceModel, rate: float, pages: int = SIMULATED_PAGES, seed: int = 0) -> list[float]:
    """Latencies (seconds) of requests arriving as a Poisson process offering ``rate`` pages/s (each
    one of ``model.documents`` at random) until about ``pages`` pages, at an engine of ``model``
    (module docstring); the requests of the first :data:`WARM_UP_PAGES` pages are not counted.

    Raises:
        ValueError: ``rate`` not below :attr:`ServiceModel.max_rate` (the queue would grow without
            end) or not positive.
    """
    if not 0 < rate < model.max_rate:
        raise ValueError(f"rate {rate:g} pages/s must be above 0 and below the engine's {model.max_rate:.3g} pages/s")
    rng = random.Random(seed)
    requests_per_s = rate / model.pages_per_document
    count = round((pages + WARM_UP_PAGES) / model.pages_per_document)
    warm_up = round(WARM_UP_PAGES / model.pages_per_document)
    now, arrivals = 0.0, []
    for _ in range(count):
        now += rng.expovariate(requests_per_s)
        arrivals.append((now, rng.choice(model.documents)))
    return serve(model, arrivals)[warm_up:]


def serve(model: ServiceModel, arrivals: Sequence[tuple[float, Work]]) -> list[float]:
    """Each request's latency (seconds, in the order given) at an engine of ``model`` (module
    docstring): ``arrivals`` are ``(seconds since the start, the document's pages' work factors)``,
    in time order; pages are served first come, first served."""
    waiting: deque[list] = deque()  # [request, work left], each page
    running: list[list] = []
    pages_left = [len(document) for _, document in arrivals]
    latencies = [math.nan] * len(arrivals)
    upcoming = deque(enumerate(arrivals))
    now = 0.0
    while upcoming or waiting or running:
        while waiting and len(running) < model.max_batch:
            running.append(waiting.popleft())
        speed = 1 / model.seconds(len(running)) if running else 0.0  # work a running page does a second
        done_at = now + min(work for _, work in running) / speed if running else math.inf
        arrives_at = upcoming[0][1][0] if upcoming else math.inf
        step = min(done_at, arrives_at) - now
        for page in running:
            page[1] -= step * speed
        now += step
        if arrives_at <= done_at:
            request, (_, document) = upcoming.popleft()
            waiting.extend([request, work] for work in document)
            continue
        for request, work in running:
            if work <= 1e-9:
                pages_left[request] -= 1
                if not pages_left[request]:
                    latencies[request] = now - arrivals[request][0]
        running = [page for page in running if page[1] > 1e-9]
    return latencies
