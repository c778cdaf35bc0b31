"""Many ordinary clients against one gateway: do accepted requests finish, and does a small one
get through? (issue 13's two many-clients cases), also on pages the gateway was not tuned on, on a
busy machine and on a gateway that has seen nothing yet.

``documents``: ``--clients`` clients each post the same document at the same instant with a
``--timeout``. Reported: how many were accepted; how many completed in time (200 within the
timeout) and when; how many were refused (503 or 429), whether all of those carried
``Retry-After`` and how long the slowest took; how many were late (accepted then 504, a 200 after
the timeout, or any other 5xx); and the pages completed in time in the window (from the burst to
the last answer) against what the engine alone does in as long (one client posting the same
document back to back for min(timeout, 30) s), and against the whole documents the engine alone
would finish within the timeout taking the burst's one after another (a document that takes it
28 s, one of them in 45 s, where the first figure counts 1.6). With ``--retry`` each client keeps
its timeout as a budget from the burst: a refused one waits its ``Retry-After`` and posts again
with what is left of the budget, while the wait leaves it at least :data:`LEAST_RETRY_S`, as a
well-behaved client with a deadline does; a client counts as refused where its last answer was a
refusal, the refusals' times are every refused post's, and what was accepted at the first post
is reported too (the single-shot figure, from the same run).

``matrix``: ``documents`` for each mix of ``--mixes``, on a quiet machine and with ``--hog-cores``
busy, cold and warm, each case on a fresh gateway (``--retry`` as for ``documents``); a line as
each case ends, then a markdown table.

``mixed``: ``--clients`` clients post the document in a loop (a refused one waits its
``Retry-After``, as a well-behaved client does; ``--priority bulk`` marks them bulk) while one more
client posts a single small page every ``--interval`` seconds (each post a copy with bytes of its
own, ``page_mixes.copies``: the gateway keeps a page's count by content, and a real client's pages
are each new to it). The flood's clients run in a process of their own at ``--flood-nice`` (19),
so that on the gateway's own machine their CPU is not taken from the gateway being measured
(docs/benchmarks.md: "The benchmark's own clients"). Reported:
the small page's median and p95 against its idle p95 (timed before the flood and after it), the
refusals (503 or 429, and how long the slowest took) and late answers (504, or any 5xx but 503)
of the flood and of the small page.

The document: ``--mix`` (``ocrserve/bench/page_mixes.py``: phototest, dense, receipts, cjk,
scans, rotated, mixed), ``--pages`` pages of corpus pages from one side of ``--split`` and synthetic
pages from ``--seed``; tune on ``--split dev --seed 0`` (as the admission was), report on the
defaults (held-out, seed 1). ``--file`` posts a file as it is instead. ``--hog N`` keeps N cores
busy for the whole run: from before the gateway starts with ``--start cold`` (the burst is then
the first thing it sees, and the engine alone is measured after it), else from once it is ready
(the engine alone is measured first, which warms it, on the same busy machine). ``--json FILE``
appends one JSON object per case.

Each client names itself with ``X-Client-Id`` (the gateway is started with ``router.fair_by:
header``: on one machine they all share an address). Prints the figures; no targets are asserted.

Usage::

    python scripts/many_clients.py documents --clients 30 --pages 10 --timeout 300
    python scripts/many_clients.py documents --mix dense --clients 20 --pages 10 --timeout 60 --start cold --hog 1
    python scripts/many_clients.py documents --file ../shared/corpus/ocrmypdf/cardinal.pdf --clients 20 --timeout 60
    python scripts/many_clients.py matrix --clients 20 --pages 10 --timeout 60 --json matrix.jsonl
    python scripts/many_clients.py matrix --mixes receipts,cjk --hog-cores 2 --split dev --seed 0
    python scripts/many_clients.py matrix --clients 12 --pages 2 --timeout 45 --retry --json matrix.jsonl
    python scripts/many_clients.py mixed --clients 12 --pages 4 --seconds 120
    python scripts/many_clients.py mixed --mix scans --priority bulk --hog 1 --seconds 90
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from ocrserve.api.params import MAX_TIMEOUT_S
from ocrserve.bench.crowd import REFUSED, Outcome, flood, post
from ocrserve.bench.harness import LocalGateway
from ocrserve.bench.hog import CpuHog
from ocrserve.bench.page_mixes import MIXES, PHOTOTEST, SPLITS, CorpusMissing, PageMix, build_mix, copies, from_file
from ocrserve.errors import ProblemError
from ocrserve.evaluation import locate_corpus

#: Longest the engine-alone rate is measured, seconds (shorter where the timeout is).
ALONE_S = 30.0
#: Least of its budget a retrying client posts again with, seconds (``--retry``): below it no page
#: of these mixes finishes, and the post only adds load.
LEAST_RETRY_S = 3.0
#: The mixes of a matrix by default.
MATRIX_MIXES = "dense,receipts,cjk,scans,rotated"
#: Small pages timed idle before the flood, and again after it (``mixed``): the machine's speed
#: drifts by a tenth between minutes, and 20 before alone left the idle p95 on its slowest one or two.
IDLE_PAGES = 20


def retrying(send: Callable[[float], Outcome], budget: float) -> tuple[Outcome, list[Outcome]]:
    """A client with ``budget`` seconds in all: ``send(timeout)`` posts once with ``timeout`` s; a
    refusal's ``Retry-After`` is waited and the post sent again with what is left of the budget,
    while that leaves at least :data:`LEAST_RETRY_S`. Returns the last answer (its seconds counted
    from the first post) and every refused answer on the way (their own seconds)."""
    started, refused = time.monotonic(), []
    while True:
        outcome = send(budget - (time.monotonic() - started))
        if outcome.status not in REFUSED:
            break
        refused.append(outcome)
        wait = float(outcome.retry_after or "inf")
        if budget - (time.monotonic() - started) - wait < LEAST_RETRY_S:
            break
        time.sleep(wait)
    return replace(outcome, seconds=time.monotonic() - started, posts=len(refused) + 1), refused


def alone_rate(url: str, mix: PageMix, seconds: float) -> tuple[float, dict[int, int]]:
    """Pages per second one client gets posting the document back to back for ``seconds`` (at
    least once), each with the longest timeout a request may ask for (the lane's default would cut
    a slow document short), and how many answers of each status it got."""
    done, statuses, started = 0, Counter(), time.monotonic()
    while True:
        status = post(url, mix, "alone", timeout=MAX_TIMEOUT_S).status
        statuses[status] += 1
        done += len(mix.pages) if status == 200 else 0
        if time.monotonic() - started >= seconds:
            return done / (time.monotonic() - started), dict(statuses)


def burst(
    url: str, mix: PageMix, clients: int, timeout: float, retry: bool = False
) -> tuple[list[Outcome], list[Outcome], float]:
    """``clients`` clients post the document at once (with ``retry``, each as :func:`retrying` with
    ``timeout`` as its budget); their last answers, every refused answer, and the seconds until
    the last answer."""
    outcomes: list[Outcome] = []
    refused: list[Outcome] = []

    def client(name: str) -> None:
        if retry:
            outcome, refusals_on_the_way = retrying(lambda left: post(url, mix, name, left), timeout)
            refused.extend(refusals_on_the_way)
        else:
            outcome = post(url, mix, name, timeout)
            refused.extend(refusals([outcome]))
        outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(f"c{i}",), daemon=True) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, refused, time.monotonic() - started


def tally(
    outcomes: list[Outcome],
    *,
    timeout: float,
    pages: int,
    window: float,
    rate: float,
    answers_refused: list[Outcome],
) -> dict:
    """The figures of a burst (see the module's docstring); ``rate`` is the engine alone's pages/s;
    ``answers_refused``: every refused answer (:func:`burst`'s; the last answers' refusals where
    clients did not retry). ``accepted`` counts last answers neither refused (503, 429) nor
    another 4xx, nor missing."""
    in_time = sorted(o.seconds for o in outcomes if o.status == 200 and o.seconds <= timeout)
    accepted_first = [o for o in outcomes if o.posts == 1 and o.status not in REFUSED]
    refused = refusals(outcomes)
    late = {
        "late_504": sum(o.status == 504 for o in outcomes),
        "late_after_timeout": sum(o.status == 200 and o.seconds > timeout for o in outcomes),
        "late_5xx": sum(o.status >= 500 and o.status not in (503, 504) for o in outcomes),
    }
    alone = rate * window
    in_time_alone = min(len(outcomes), math.floor(timeout * rate / pages)) * pages if rate else 0
    return {
        "requests": len(outcomes),
        "accepted": len(in_time) + sum(late.values()),
        "completed_in_time": len(in_time),
        "completed_at_s": [round(s, 2) for s in in_time],
        "accepted_at_first_post": len(accepted_first),
        "completed_in_time_at_first_post": sum(o.status == 200 and o.seconds <= timeout for o in accepted_first),
        "refused": len(refused),
        "refusals": len(answers_refused),
        "refused_with_retry_after": with_retry_after(answers_refused),
        "refused_all_retry_after": all(o.retry_after for o in answers_refused) if answers_refused else None,
        "refused_slowest_s": slowest(answers_refused),
        "refused_median_s": median_s(answers_refused),
        "refused_by_problem": by_problem(answers_refused),
        "late": sum(late.values()),
        **late,
        "other_4xx": sum(400 <= o.status < 500 and o.status not in REFUSED for o in outcomes),
        "no_answer": sum(o.status == 0 for o in outcomes),
        "window_s": round(window, 2),
        "engine_alone_pages_per_s": round(rate, 3),
        "pages_done": len(in_time) * pages,
        "engine_alone_pages": round(alone, 1),
        "pages_done_pct": round(100 * len(in_time) * pages / alone, 1) if alone else None,
        "engine_alone_in_time_pages": in_time_alone,
        "in_time_pct": round(100 * len(in_time) * pages / in_time_alone, 1) if in_time_alone else None,
    }


@contextlib.contextmanager
def gateway_at(url: str | None, log: str | None = None) -> Iterator[str]:
    """``url``, or a fresh local gateway's for as long as the block runs (its output appended to
    ``log``, else discarded)."""
    if url:
        yield url
        return
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "ab")) if log else subprocess.DEVNULL
        gateway = LocalGateway("router.fair_by=header", profile="local", log=out)
        try:
            yield gateway.wait_ready().url
        finally:
            gateway.stop()


def documents_case(
    mix: PageMix,
    *,
    clients: int,
    timeout: float,
    start: str,
    hog: int,
    retry: bool = False,
    url: str | None = None,
    log: str | None = None,
) -> dict:
    """One ``documents`` case (the hog and a fresh gateway started, stopped however it ends)."""
    with contextlib.ExitStack() as stack:
        if start == "cold":
            stack.enter_context(CpuHog(hog))
        url = stack.enter_context(gateway_at(url, log))
        if start == "warm":
            stack.enter_context(CpuHog(hog))
            rate, alone = alone_rate(url, mix, min(timeout, ALONE_S))
        outcomes, refused, window = burst(url, mix, clients, timeout, retry)
        if start == "cold":
            rate, alone = alone_rate(url, mix, min(timeout, ALONE_S))
    figures = tally(outcomes, timeout=timeout, pages=len(mix.pages), window=window, rate=rate, answers_refused=refused)
    figures["engine_alone_statuses"] = alone
    return {
        "scenario": "documents",
        "mix": mix.name,
        "start": start,
        "hog": hog,
        "clients": clients,
        "pages": len(mix.pages),
        "timeout": timeout,
        "retry": retry,
        **figures,
    }


def machine(hog: int) -> str:
    return f"hog {hog}" if hog else "quiet"


def refused_cell(case: dict) -> str:
    """``13 (all)``, ``13 (11 with)`` or ``0``: refusals and how many carried ``Retry-After``; where
    clients retried, ``4 of 21 (all)``: clients refused to the end, of all refused answers."""
    if not case["refusals"]:
        return "0"
    carried = "all" if case["refused_all_retry_after"] else f"{case['refused_with_retry_after']} with"
    of = f"{case['refused']} of " if case["retry"] else ""
    return f"{of}{case['refusals']} ({carried})"


def pages_cell(case: dict) -> str:
    pct = "-" if case["pages_done_pct"] is None else f"{case['pages_done_pct']:.0f}%"
    return f"{case['pages_done']} / {case['engine_alone_pages']:.0f} ({pct})"


def in_time_cell(case: dict) -> str:
    """``20 / 24 (83%)``: pages done in time against the whole documents' pages the engine alone
    would finish in time."""
    pct = "-" if case["in_time_pct"] is None else f"{case['in_time_pct']:.0f}%"
    return f"{case['pages_done']} / {case['engine_alone_in_time_pages']} ({pct})"


def alone_cell(case: dict) -> str:
    """``2 documents, all 200`` or ``1 document, 504: 1``: the engine-alone measurement's answers."""
    statuses = case["engine_alone_statuses"]
    count = sum(statuses.values())
    answers = "all 200" if set(statuses) == {200} else ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
    return f"{count} document{'s' * (count != 1)}, {answers}"


def print_documents(case: dict, mix: PageMix) -> None:
    retry = ", refused ones retrying" if case["retry"] else ""
    print(
        f"{case['clients']} clients x {case['pages']}-page document, timeout {case['timeout']:g} s{retry}, start "
        f"{case['start']}, machine {machine(case['hog'])}; the engine alone: {case['engine_alone_pages_per_s']:.2f} "
        f"pages/s (measured {'after' if case['start'] == 'cold' else 'before'} the burst: {alone_cell(case)})"
    )
    print(f"  pages: {mix.summary()}")
    print(
        f"  accepted {case['accepted']}: completed in time {case['completed_in_time']}, late {case['late']} "
        f"(504: {case['late_504']}, 200 after the timeout: {case['late_after_timeout']}, other 5xx: "
        f"{case['late_5xx']})"
    )
    print("  completed in time at (s): " + ", ".join(f"{s:.1f}" for s in case["completed_at_s"]))
    if case["retry"]:
        print(
            f"  at their first post: accepted {case['accepted_at_first_post']}, completed in time "
            f"{case['completed_in_time_at_first_post']}"
        )
    if case["refusals"]:
        print(
            f"  refused (503/429): {refused_cell(case)}{within(case)}, "
            f"all with Retry-After: {case['refused_all_retry_after']}; by type: {case['refused_by_problem']}"
        )
    if case["other_4xx"] or case["no_answer"]:
        print(f"  other 4xx: {case['other_4xx']}, no answer: {case['no_answer']}")
    print(
        f"  pages completed in time in the {case['window_s']:.0f} s window: {case['pages_done']}, the engine "
        f"alone would do {case['engine_alone_pages']:.0f} ({pages_cell(case).split('(')[-1][:-1]}); whole "
        f"documents it would finish in time: {case['engine_alone_in_time_pages']} pages "
        f"({in_time_cell(case).split('(')[-1][:-1]})"
    )


def record(path: str | None, case: dict, mix: PageMix, args: argparse.Namespace) -> None:
    """Append the case, its page mix and the arguments to ``path`` as one JSON line."""
    if path:
        entry = {**case, "page_mix": mix.as_dict(), "args": vars(args), "at": datetime.now(timezone.utc).isoformat()}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, default=str) + "\n")


def matrix(args: argparse.Namespace, mixes: list[PageMix]) -> None:
    """Every mix x (quiet, ``--hog-cores`` busy) x (cold, warm), each on a fresh gateway."""
    cases = [
        (mix, hog, start) for mix in mixes for hog in dict.fromkeys((0, args.hog_cores)) for start in ("cold", "warm")
    ]
    for mix in mixes:
        print(f"  {mix.summary()}")
    rows, began = [], time.monotonic()
    for i, (mix, hog, start) in enumerate(cases, 1):
        case = documents_case(
            mix, clients=args.clients, timeout=args.timeout, start=start, hog=hog, retry=args.retry, log=args.log
        )
        record(args.json, case, mix, args)
        rows.append(case)
        print(
            f"[{i}/{len(cases)} at {time.monotonic() - began:.0f} s] {mix.name} | {machine(hog)} | {start}: "
            f"accepted {case['accepted']}{first_post(case)}, in time {case['completed_in_time']}, refused "
            f"{refused_cell(case)}, "
            f"late {case['late']}, pages {pages_cell(case)}, in time {in_time_cell(case)}; engine alone: "
            f"{alone_cell(case)}",
            flush=True,
        )
    print()
    print(table(rows))


def first_post(case: dict) -> str:
    """`` (3 at the first post)`` where clients retried, else nothing."""
    return f" ({case['accepted_at_first_post']} at the first post)" if case["retry"] else ""


def table(rows: list[dict]) -> str:
    """The matrix as a markdown table, one row per case."""
    lines = [
        "| mix | machine | start | accepted | completed in time | refused (Retry-After) | late | "
        "pages done / engine alone (%) | pages done / engine alone's whole documents in time (%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mix']} | {machine(r['hog'])} | {r['start']} | {r['accepted']}{first_post(r)} | "
            f"{r['completed_in_time']} | "
            f"{refused_cell(r)} | {r['late']} | {pages_cell(r)} | {in_time_cell(r)} |"
        )
    return "\n".join(lines)


#: The gateway's timings of a page that :func:`parts` splits a small page's seconds into.
PARTS = ("queue_s", "preprocess_s", "engine_s")


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def refusals(outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes that were refusals (503 or 429)."""
    return [o for o in outcomes if o.status in REFUSED]


def by_problem(outcomes: list[Outcome]) -> dict[str, int]:
    """How many of ``outcomes`` came of each problem type (``-``: not a problem response)."""
    return dict(Counter(o.problem or "-" for o in outcomes).most_common())


def with_retry_after(outcomes: list[Outcome]) -> int:
    """How many of ``outcomes`` carried ``Retry-After``."""
    return sum(bool(o.retry_after) for o in outcomes)


def slowest(outcomes: list[Outcome]) -> float | None:
    """Seconds the slowest of ``outcomes`` took to come, or None for none."""
    return round(max(o.seconds for o in outcomes), 3) if outcomes else None


def median_s(outcomes: list[Outcome]) -> float | None:
    """Seconds the median of ``outcomes`` took to come, or None for none."""
    return round(statistics.median(o.seconds for o in outcomes), 3) if outcomes else None


def within(case: dict, prefix: str = "") -> str:
    """`` (median M s, the slowest in N s)`` for the refusals that came of ``case``'s (its figures
    named ``{prefix}refused_...``), else nothing."""
    slowest_s, median = case[f"{prefix}refused_slowest_s"], case[f"{prefix}refused_median_s"]
    return "" if slowest_s is None else f" (median {median:.2f} s, the slowest in {slowest_s:.2f} s)"


def late(outcomes: list[Outcome]) -> int:
    """Accepted and then failed: 504, or any 5xx but a 503 refusal."""
    return sum(o.status >= 500 and o.status != 503 for o in outcomes)


def parts(outcomes: list[Outcome]) -> dict[str, float] | None:
    """Where answered pages' seconds went, on average over ``outcomes`` (None for none): the
    gateway's ``queue_s`` (in the router and the engine's queue), ``preprocess_s`` and
    ``engine_s``, and ``other_s``, the rest of what the client waited (upload, inspection,
    admission, the answer's assembly and its way back)."""
    if not outcomes:
        return None
    means = {key: statistics.mean(o.timings.get(key, 0.0) for o in outcomes) for key in PARTS}
    means["other_s"] = statistics.mean(o.seconds for o in outcomes) - sum(means.values())
    return {key: round(value, 3) for key, value in means.items()}


def idle_pages(url: str, small: Callable[[], PageMix]) -> list[Outcome]:
    """:data:`IDLE_PAGES` small pages posted one after another, those answered 200, timed."""
    return [o for o in (post(url, small(), "small", timed=True) for _ in range(IDLE_PAGES)) if o.status == 200]


def mixed(url: str, mix: PageMix, args: argparse.Namespace) -> dict:
    """The small page's latency under a flood of ``mix`` documents (see the module's docstring);
    its idle p95 is over :data:`IDLE_PAGES` small pages before the flood and as many after it."""
    pages = copies(PHOTOTEST.read_bytes())  # each post a page of its own, as a client's pages are

    def small() -> PageMix:
        return PageMix("phototest", "", None, (), next(pages), "s.png")

    post(url, small(), "small")  # warm-up: the first request after start pays one-time costs
    before = idle_pages(url, small)
    loaded = []
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: this one may hold threads
    with spawn.Pool(1, initializer=os.nice, initargs=(args.flood_nice,)) as aside:  # killed on leaving
        aside.apply(int)  # started, its modules imported, before the flood's clock starts
        flooding = aside.apply_async(flood, (url, mix, args.clients, args.seconds, args.priority))
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            loaded.append(post(url, small(), "small", timed=True))
            time.sleep(max(0.0, args.interval - loaded[-1].seconds))
        flooded = flooding.get()
    after = idle_pages(url, small)
    idle_outcomes = before + after
    idle = [o.seconds for o in idle_outcomes]
    answered = [o.seconds for o in loaded if o.status == 200]
    loaded_p95 = p95(answered) if answered else None
    slowest_5 = [o for o in loaded if o.status == 200 and o.seconds >= loaded_p95] if answered else []
    small_refused, flood_refused = refusals(loaded), refusals(flooded)
    return {
        "scenario": "mixed",
        "mix": mix.name,
        "hog": args.hog,
        "clients": args.clients,
        "pages": len(mix.pages),
        "seconds": args.seconds,
        "interval": args.interval,
        "priority": args.priority,
        "flood_nice": args.flood_nice,
        "small_idle_p95_s": round(p95(idle), 3) if idle else None,
        "small_idle_before_p95_s": round(p95([o.seconds for o in before]), 3) if before else None,
        "small_idle_after_p95_s": round(p95([o.seconds for o in after]), 3) if after else None,
        "small_idle_pages": len(idle),
        "small_median_s": round(statistics.median(answered), 3) if answered else None,
        "small_p95_s": None if loaded_p95 is None else round(loaded_p95, 3),
        "small_idle_parts_s": parts(idle_outcomes),
        "small_slowest_parts_s": parts(slowest_5),
        "small_requests": len(loaded),
        "small_answered": len(answered),
        "small_refused": len(small_refused),
        "small_refused_slowest_s": slowest(small_refused),
        "small_refused_median_s": median_s(small_refused),
        "small_refused_with_retry_after": with_retry_after(small_refused),
        "small_late": late(loaded),
        "flood_requests": len(flooded),
        "flood_refused": len(flood_refused),
        "flood_refused_slowest_s": slowest(flood_refused),
        "flood_refused_median_s": median_s(flood_refused),
        "flood_refused_by_problem": by_problem(flood_refused),
        "flood_refused_with_retry_after": with_retry_after(flood_refused),
        "flood_accepted": len(flooded) - len(flood_refused),
        "flood_late": late(flooded),
        "flood_late_504": sum(o.status == 504 for o in flooded),
    }


def seconds(value: float | None) -> str:
    """``1.23 s``, or ``-`` where there is no figure."""
    return "-" if value is None else f"{value:.2f} s"


def print_mixed(case: dict, mix: PageMix) -> None:
    bulk = f" with priority={case['priority']}" if case["priority"] else ""
    print(
        f"{case['clients']} clients x {case['pages']}-page document in a loop{bulk} for {case['seconds']:g} s, a "
        f"single page every {case['interval']:g} s; the flood's clients at nice {case['flood_nice']}; "
        f"machine {machine(case['hog'])}"
    )
    print(f"  pages: {mix.summary()}")
    idle, loaded = case["small_idle_p95_s"], case["small_p95_s"]
    under = "none answered 200" if loaded is None else f"median {case['small_median_s']:.2f} s, p95 {loaded:.2f} s"
    if idle and loaded is not None:
        under += f" ({loaded / idle:.2f}x idle: {loaded:.2f} s vs {idle:.2f} s)"
    before, after = seconds(case["small_idle_before_p95_s"]), seconds(case["small_idle_after_p95_s"])
    sides = f"before the flood {before}, after {after}"
    print(
        f"  small page: idle p95 {seconds(idle)} ({sides}); under load {under}; "
        f"{case['small_requests']} sent, {case['small_answered']} answered 200, {case['small_refused']} refused"
        f"{within(case, 'small_')} ({case['small_refused_with_retry_after']} with Retry-After), "
        f"late {case['small_late']}"
    )
    for name, where in (
        ("idle", case["small_idle_parts_s"]),
        ("the slowest 5% under load", case["small_slowest_parts_s"]),
    ):
        if where:
            print(f"  small page's seconds, {name}, on average: " + ", ".join(f"{k} {v:.3f}" for k, v in where.items()))
    accepted = max(case["flood_accepted"], 1)
    print(
        f"  flood requests: {case['flood_requests']}, refused {case['flood_refused']}"
        f"{within(case, 'flood_')} ({case['flood_refused_with_retry_after']} with Retry-After), accepted "
        f"{case['flood_accepted']}, late {case['flood_late']} ({case['flood_late'] / accepted:.1%} of accepted; "
        f"504: {case['flood_late_504']}); refusals by type: {case['flood_refused_by_problem']}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["documents", "matrix", "mixed"])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--pages", type=int, default=10, help="pages of a mix's document")
    parser.add_argument("--timeout", type=float, default=300.0, help="documents, matrix: each request's timeout, s")
    parser.add_argument("--seconds", type=float, default=120.0, help="mixed: how long the flood lasts, s")
    parser.add_argument("--interval", type=float, default=1.0, help="mixed: seconds between small pages")
    parser.add_argument(
        "--mix", choices=MIXES, default="phototest", help="the pages of the document (default: %(default)s)"
    )
    parser.add_argument("--mixes", default=MATRIX_MIXES, help="matrix: comma-separated mixes (default: %(default)s)")
    parser.add_argument(
        "--split", choices=SPLITS, default="held-out", help="corpus side of the pages (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the draws and synthetic pages (default 1; tuning used 0, on dev)"
    )
    parser.add_argument("--file", type=Path, help="post this file as it is instead of a mix")
    parser.add_argument("--hog", type=int, default=0, help="documents, mixed: cores kept busy for the whole run")
    parser.add_argument("--hog-cores", type=int, default=1, help="matrix: cores the busy machine's hog takes")
    parser.add_argument(
        "--start",
        choices=["cold", "warm"],
        default="warm",
        help="documents: cold (a fresh gateway whose first request is the burst) or warm (default); matrix runs both",
    )
    parser.add_argument(
        "--retry",
        action="store_true",
        help="documents, matrix: a refused client waits its Retry-After and posts again within its timeout",
    )
    parser.add_argument("--priority", choices=["bulk", "interactive"], help="mixed: the flood's priority form field")
    parser.add_argument(
        "--flood-nice",
        type=int,
        default=19,
        help="mixed: niceness added to the process the flood's clients run in, as nice -n, 0-19 (default "
        "%(default)s: on the gateway's machine their CPU is not the gateway's to give; 0: as the small page's client)",
    )
    parser.add_argument("--json", help="append one JSON object per case to this file")
    parser.add_argument("--log", help="append the output of the gateways started here to this file")
    parser.add_argument("--url", help="a running gateway (started with router.fair_by: header) instead of one here")
    args = parser.parse_args(argv)
    if args.url and (args.scenario == "matrix" or args.start == "cold"):
        parser.error("matrix and --start cold start their own gateways: leave out --url")
    if args.hog < 0 or args.hog_cores < 0 or args.clients < 1 or args.pages < 1:
        parser.error("--hog and --hog-cores are 0 or more, --clients and --pages 1 or more")
    if not 0 <= args.flood_nice <= 19:
        parser.error("--flood-nice is 0 to 19, a niceness added as nice -n does (below 0 the flood would run ahead)")
    unknown = set(args.mixes.split(",")) - set(MIXES)
    if args.scenario == "matrix" and unknown:
        parser.error(f"--mixes: unknown {', '.join(sorted(unknown))}; known: {', '.join(MIXES)}")
    return args


def load(args: argparse.Namespace, names: list[str]) -> list[PageMix]:
    """The documents to post: ``--file``, else each mix of ``names``.

    Exits with one line where the corpus a mix needs is absent or the file cannot be read."""
    try:
        if args.file:
            return [from_file(args.file)]
        corpus = locate_corpus()
        return [build_mix(name, args.pages, split=args.split, seed=args.seed, corpus=corpus) for name in names]
    except CorpusMissing as missing:
        sys.exit(str(missing))
    except (OSError, ValueError, ProblemError) as error:
        sys.exit(f"{args.file or ', '.join(names)}: {error}")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.scenario == "matrix":
        matrix(args, load(args, args.mixes.split(",")))
        return
    (mix,) = load(args, [args.mix])
    if args.scenario == "documents":
        case = documents_case(
            mix,
            clients=args.clients,
            timeout=args.timeout,
            start=args.start,
            hog=args.hog,
            retry=args.retry,
            url=args.url,
            log=args.log,
        )
        print_documents(case, mix)
    else:
        with gateway_at(args.url, args.log) as url, CpuHog(args.hog):
            case = mixed(url, mix, args)
        print_mixed(case, mix)
    record(args.json, case, mix, args)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("many_clients: interrupted", file=sys.stderr)
        sys.exit(130)
