"""The knee, the recommendation and capacity planning on figures with known answers."""

from __future__ import annotations

import math
import statistics

import pytest

from ocrserve.bench.analysis import Point, curves, knee, recommend
from ocrserve.bench.capacity import ServiceModel, in_flight, replicas, serve, simulate
from ocrserve.bench.load import Measurement, RequestOutcome
from ocrserve.cli.bench import _grid, _report

#: A recorded concurrency sweep (pages/s, p95 s): gains of 90%, 58%, 3.3%, 0.6%.
SWEEP = [Point(1, 1.0, 0.3), Point(2, 1.9, 0.4), Point(4, 3.0, 0.9), Point(8, 3.1, 2.0), Point(16, 3.12, 4.1)]


def test_the_knee_is_the_last_step_that_still_adds_the_gain():
    assert knee(SWEEP).value == 4  # 4 -> 8 adds 3.3%, under 5%
    assert knee(SWEEP, gain=0.02).value == 8  # 8 -> 16 adds 0.6%, under 2%; 4 -> 8 adds more
    assert knee(list(reversed(SWEEP))).value == 4  # the order of the points does not matter
    assert knee(SWEEP[:2]).value == 2  # every step adds more: the last point
    with pytest.raises(ValueError):
        knee([])


def test_the_recommendation_is_the_best_throughput_that_meets_the_target():
    assert recommend(SWEEP, p95_s=1.0).value == 4
    assert recommend(SWEEP, p95_s=2.0).value == 8
    assert recommend(SWEEP, p95_s=0.35).value == 1
    assert recommend(SWEEP, p95_s=0.1) is None
    tie = [Point(2, 3.0, 0.5), Point(4, 3.0, 0.6)]
    assert recommend(tie, p95_s=1.0).value == 2  # the same goodput for less: the smaller setting


def test_a_grid_of_two_sweeps_has_a_curve_and_a_knee_per_setting_of_the_second_key():
    settings = _grid(["engine.onnx.rec_batch_num=1,6,16", "engine.onnx.det_workers=1,2"])
    assert settings == [
        "engine.onnx.rec_batch_num=1 engine.onnx.det_workers=1",
        "engine.onnx.rec_batch_num=6 engine.onnx.det_workers=1",
        "engine.onnx.rec_batch_num=16 engine.onnx.det_workers=1",
        "engine.onnx.rec_batch_num=1 engine.onnx.det_workers=2",
        "engine.onnx.rec_batch_num=6 engine.onnx.det_workers=2",
        "engine.onnx.rec_batch_num=16 engine.onnx.det_workers=2",
    ]
    # recorded (pages/s, p95 s) for each setting, 10 s a point, one request of 1 page per 0.1 pages/s
    recorded = [(1.0, 2.0), (1.5, 3.0), (1.52, 3.5), (1.2, 2.5), (2.0, 4.0), (2.5, 9.0)]
    measured = []
    for setting, (rate, p95) in zip(settings, recorded, strict=True):
        outcomes = [RequestOutcome("a.png", 200, p95, 1, "text")] * int(rate * 10)
        value = float(setting.split()[0].partition("=")[2])
        measured.append(Measurement("closed", value, 10.0, outcomes, setting))
    by_curve = curves(measured, lambda m: m.setting, lambda m: m.value)
    assert list(by_curve) == ["engine.onnx.det_workers=1", "engine.onnx.det_workers=2"]
    report = _report(measured, "engine.onnx.rec_batch_num", "grid", 5.0, 0.05, None, {}, 0.02)
    # det_workers=1: 1 -> 6 adds 50%, 6 -> 16 adds 1.3%: knee 6; det_workers=2: every step adds 25%+
    assert [(k["value"], k["setting"].split()[1]) for k in report["knees"]] == [
        (6, "engine.onnx.det_workers=1"),
        (16, "engine.onnx.det_workers=2"),
    ]
    # the best throughput whose p95 meets 5 s: 2.0 pages/s at rec_batch_num=6, det_workers=2
    assert report["recommendation"]["setting"] == "engine.onnx.rec_batch_num=6 engine.onnx.det_workers=2"
    assert report["overlay"] == {"engine.onnx.rec_batch_num": 6, "engine.onnx.det_workers": 2}
    assert report["quality"]["baseline"] == 1 and report["quality"]["candidate"] == 6
    assert "service_model" not in report  # T(B) is fitted on concurrency sweeps only


def test_littles_law_and_the_replica_formula_on_hand_computed_cases():
    assert in_flight(rate=3.0, latency_s=2.0) == 6.0  # L = lambda x W
    assert replicas(rate=10.0, service_rate=3.0, utilization=0.7) == 5  # 10 / 2.1 = 4.76
    assert replicas(rate=2.1, service_rate=3.0, utilization=0.7) == 1  # exactly one replica's share
    assert replicas(rate=12.0, service_rate=3.0, utilization=1.0) == 4
    assert replicas(rate=0.0, service_rate=3.0) == 1
    with pytest.raises(ValueError):
        replicas(rate=1.0, service_rate=0.0)


def test_the_service_model_is_fitted_from_a_closed_loop_sweep():
    # T(B) = 0.2 + 0.1 B: 1 page in 0.3 s, 2 in 0.4 s, 4 in 0.6 s
    model = ServiceModel.fit([(1, 1 / 0.3), (2, 2 / 0.4), (4, 4 / 0.6)])
    assert (model.a, model.b, model.max_batch) == (pytest.approx(0.2), pytest.approx(0.1), 4)
    assert model.max_rate == pytest.approx(4 / 0.6)
    with pytest.raises(ValueError):
        ServiceModel.fit([(2, 5.0)])


def test_serving_hand_computed_arrivals():
    one_at_a_time = ServiceModel(a=0.0, b=1.0, max_batch=1)  # a page alone: 1 s
    # a 2-page document at 0 s (pages done at 1 and 2 s), then a page at 0.5 s (done at 3 s)
    assert serve(one_at_a_time, [(0.0, (1.0, 1.0)), (0.5, (1.0,))]) == pytest.approx([2.0, 2.5])
    # a page of twice the work at 0 s and an average page at 1 s: first come, first served
    assert serve(one_at_a_time, [(0.0, (2.0,)), (1.0, (1.0,))]) == pytest.approx([2.0, 2.0])
    two_at_once = ServiceModel(a=0.0, b=1.0, max_batch=2)  # two together: 2 s each, 1 page/s
    # alone for 0.5 s (half done), then both at half speed: the first ends at 1.5 s, the second
    # (half done by then) alone again, at 2 s
    assert serve(two_at_once, [(0.0, (1.0,)), (0.5, (1.0,))]) == pytest.approx([1.5, 1.5])


def test_the_simulation_matches_the_m_d_1_queue():
    """One page at a time, 0.1 s each, Poisson arrivals at 5 pages/s (utilization 0.5): the
    Pollaczek-Khinchine formula gives a mean wait of rho / (2 mu (1 - rho)) = 0.05 s, so a mean
    latency of 0.15 s."""
    latencies = simulate(ServiceModel(a=0.0, b=0.1, max_batch=1), rate=5.0)
    assert statistics.fmean(latencies) == pytest.approx(0.15, rel=0.05)
    assert min(latencies) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        simulate(ServiceModel(a=0.0, b=0.1, max_batch=1), rate=10.0)  # at the service rate: no steady state


def test_batching_lets_the_engine_keep_up_where_one_page_at_a_time_cannot():
    one = ServiceModel(a=0.2, b=0.1, max_batch=1)  # 0.3 s a page: 3.33 pages/s at most
    four = ServiceModel(a=0.2, b=0.1, max_batch=4)  # 0.6 s for 4: 6.67 pages/s at most
    p95 = sorted(simulate(four, rate=3.0))[math.ceil(0.95 * 20_000) - 1]
    assert p95 < 1.5
    with pytest.raises(ValueError):
        simulate(one, rate=3.5)
