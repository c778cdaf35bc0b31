"""``scripts/many_clients.py``: how a burst's answers are counted, the matrix's table, the CPU hog
it starts and stops, and its one-line exit where the corpus is missing, without a gateway; the
``mixed`` scenario against the session's gateway."""

from __future__ import annotations

import argparse

import pytest

from ocrserve.bench.hog import CpuHog
from tests.scripts import load_script

many_clients = load_script("many_clients")
Outcome = many_clients.Outcome


def test_a_burst_is_counted_by_what_each_client_got():
    outcomes = [
        Outcome(200, 10.0),
        Outcome(200, 61.0),  # answered, but after the 60-s timeout: late
        Outcome(504, 60.0),
        Outcome(500, 3.0),
        Outcome(503, 0.2, "7", problem="admission-timeout"),
        Outcome(429, 0.4, None, problem="rate-limited"),
        Outcome(413, 0.1),
        Outcome(0, 1.0),
    ]
    refused = many_clients.refusals(outcomes)
    figures = many_clients.tally(outcomes, timeout=60, pages=2, window=61.0, rate=0.5, answers_refused=refused)
    assert figures["accepted"] == 4
    assert figures["completed_in_time"] == 1 and figures["completed_at_s"] == [10.0]
    assert (figures["late"], figures["late_504"], figures["late_after_timeout"], figures["late_5xx"]) == (3, 1, 1, 1)
    assert figures["refused"] == 2 and figures["refused_with_retry_after"] == 1
    assert figures["refused_all_retry_after"] is False and figures["refused_slowest_s"] == 0.4
    assert figures["refused_median_s"] == pytest.approx(0.3)
    assert figures["refused_by_problem"] == {"admission-timeout": 1, "rate-limited": 1}
    assert (figures["other_4xx"], figures["no_answer"]) == (1, 1)
    assert figures["pages_done"] == 2 and figures["engine_alone_pages"] == 30.5
    assert figures["pages_done_pct"] == pytest.approx(6.6)
    # the engine alone takes 4 s a document: 8 documents' pages would be done within the 60 s, had 8 been sent
    assert figures["engine_alone_in_time_pages"] == 16 and figures["in_time_pct"] == pytest.approx(12.5)


def test_a_retrying_client_waits_its_retry_after_and_posts_again_with_what_is_left():
    answers = [Outcome(503, 0.1, "1"), Outcome(429, 0.1, "1"), Outcome(200, 0.2)]
    timeouts: list[float] = []

    def send(timeout: float) -> Outcome:
        timeouts.append(timeout)
        return answers.pop(0)

    last, refused = many_clients.retrying(send, budget=10.0)
    assert last.status == 200 and 2.0 <= last.seconds < 3.0 and last.posts == 3  # two 1-s waits
    assert [o.status for o in refused] == [503, 429]
    assert timeouts[0] == pytest.approx(10.0, abs=0.05) and timeouts[2] == pytest.approx(8.0, abs=0.3)


def test_a_retrying_client_gives_up_where_the_wait_leaves_too_little():
    answers = [Outcome(503, 0.1, "7"), Outcome(503, 0.1, None)]
    last, refused = many_clients.retrying(lambda timeout: answers.pop(0), budget=10.0)
    assert last.status == 503 and last.seconds < 0.5 and len(refused) == 1  # 7 s would leave under 3
    last, refused = many_clients.retrying(lambda timeout: answers.pop(0), budget=10.0)
    assert last.status == 503 and len(refused) == 1  # no Retry-After: no retry


def test_the_matrix_table_has_a_row_per_case():
    answers = [Outcome(200, 5.0), Outcome(503, 0.1, "3")]
    case = many_clients.tally(answers, timeout=40, pages=2, window=5, rate=1, answers_refused=answers[1:])
    row = {"mix": "receipts", "hog": 1, "start": "cold", "retry": False, **case}
    retried = many_clients.tally(
        [Outcome(200, 9.0), Outcome(503, 0.3, "9")],
        timeout=40,
        pages=2,
        window=9,
        rate=1,
        answers_refused=[Outcome(503, 0.2, "4"), Outcome(503, 0.3, "9")],
    )
    lines = many_clients.table([row, {**row, **retried, "retry": True}]).splitlines()
    assert lines[0].startswith("| mix | machine | start | accepted |")
    assert lines[2] == "| receipts | hog 1 | cold | 1 | 1 | 1 (all) | 0 | 2 / 5 (40%) | 2 / 4 (50%) |"
    # retrying: one client refused to the end, of two refused answers
    assert lines[3] == (
        "| receipts | hog 1 | cold | 1 (1 at the first post) | 1 | 1 of 2 (all) | 0 | 2 / 9 (22%) | 2 / 4 (50%) |"
    )


def test_the_hog_stops_however_the_block_is_left():
    hog = CpuHog(1)
    with pytest.raises(KeyboardInterrupt), hog:
        (process,) = hog.processes
        assert process.is_alive()
        raise KeyboardInterrupt
    assert not process.is_alive() and not hog.processes


def test_a_corpus_mix_without_the_corpus_exits_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OCRSERVE_CORPUS", str(tmp_path))  # a folder without index.json: no corpus
    with pytest.raises(SystemExit) as exited:
        many_clients.main(["documents", "--mix", "dense"])
    message = str(exited.value.code)
    assert "OCRSERVE_CORPUS" in message and "\n" not in message


def test_cold_and_matrix_start_their_own_gateways():
    with pytest.raises(SystemExit):
        many_clients.parse(["documents", "--start", "cold", "--url", "http://127.0.0.1:1"])
    with pytest.raises(SystemExit):
        many_clients.parse(["matrix", "--mixes", "dense,nonesuch"])


@pytest.mark.parametrize("nice", ["-1", "20"])
def test_the_floods_clients_never_run_ahead_of_the_small_page(nice, capsys):
    with pytest.raises(SystemExit):
        many_clients.parse(["mixed", "--flood-nice", nice])
    assert "--flood-nice is 0 to 19," in capsys.readouterr().err
    assert many_clients.parse(["mixed"]).flood_nice == 19


def test_a_small_pages_seconds_split_into_the_gateways_timings_and_the_rest():
    outcomes = [
        Outcome(200, 1.0, timings={"queue_s": 0.1, "preprocess_s": 0.2, "engine_s": 0.5, "det_s": 0.3}),
        Outcome(200, 2.0, timings={"queue_s": 0.5, "preprocess_s": 0.2, "engine_s": 0.7}),
    ]
    assert many_clients.parts(outcomes) == {"queue_s": 0.3, "preprocess_s": 0.2, "engine_s": 0.6, "other_s": 0.4}
    assert many_clients.parts([]) is None


def test_the_small_pages_idle_p95_is_timed_before_the_flood_and_after_it(gateway, monkeypatch):
    monkeypatch.setattr(many_clients, "IDLE_PAGES", 3)
    args = argparse.Namespace(clients=1, seconds=2.0, interval=0.5, priority="bulk", hog=0, pages=1, flood_nice=19)
    case = many_clients.mixed(gateway.url, many_clients.build_mix("phototest", 1), args)
    assert case["small_idle_pages"] == 6  # 3 before, 3 after, all answered
    assert min(case["small_idle_before_p95_s"], case["small_idle_after_p95_s"], case["small_idle_p95_s"]) > 0
    assert case["small_answered"] >= 1 and case["small_late"] == 0 and case["flood_late"] == 0
    assert case["flood_requests"] >= 1 and case["flood_nice"] == 19  # the flood's client, in its own process
    assert set(case["small_idle_parts_s"]) == {*many_clients.PARTS, "other_s"}
