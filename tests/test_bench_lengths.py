"""OCR-shaped output lengths for the random model (``ocrserve.bench.forced_lengths``), the vLLM logits
processor that imposes them (run against a stand-in of vLLM's interface: no vLLM here), and
``ocrserve bench --set`` reaching every gateway a sweep starts."""

from __future__ import annotations

import importlib
import json
import math
import sys
import types
from enum import Enum
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="the logits processor works on torch tensors: pip install -e '.[debug]'")

from ocrserve.bench import forced_lengths as lengths  # noqa: E402
from ocrserve.bench.forced_lengths import (  # noqa: E402
    LENGTHS_ENV,
    SEED_ENV,
    ForcedEnd,
    LengthSampler,
    corpus_output_lengths,
    read_lengths,
    write_lengths,
)
from ocrserve.bench.load import Measurement, RequestOutcome  # noqa: E402


class Move(Enum):
    UNIDIRECTIONAL = 1
    SWAP = 2


def batch(removed=(), added=(), moved=()):
    return SimpleNamespace(batch_size=0, removed=list(removed), added=list(added), moved=list(moved))


def params(eos=7):
    return SimpleNamespace(eos_token_id=eos, all_stop_token_ids={eos})


def test_corpus_lengths_come_from_each_page_of_non_partial_ground_truth(tmp_path):
    (tmp_path / "a.gt.txt").write_text("x" * 30 + "\f" + "y" * 3 + "\f  \n", encoding="utf-8")
    (tmp_path / "b.gt.txt").write_text("中文", encoding="utf-8")
    (tmp_path / "c.gt.txt").write_text("facts only", encoding="utf-8")
    index = [
        {"file": "a.tif", "gt_quality": "exact"},
        {"file": "b.png", "gt_quality": "transcribed"},
        {"file": "c.pdf", "gt_quality": "partial (unit-test facts)"},
        {"file": "d.png", "gt_quality": "exact"},  # no ground truth file: skipped
    ]
    (tmp_path / "index.json").write_text(json.dumps(index))
    rows = corpus_output_lengths(tmp_path)
    assert [(r["file"], r["page"], r["chars"], r["tokens"]) for r in rows] == [
        ("a.tif", 1, 30, 10),
        ("a.tif", 2, 3, 2),
        ("b.png", 1, 2, 3),
    ]
    (tmp_path / "index.json").unlink()  # without an index: every *.gt.txt
    assert len(corpus_output_lengths(tmp_path)) == 4
    written = write_lengths(tmp_path / "lengths.json", rows)
    assert written == read_lengths(tmp_path / "lengths.json") == [10, 2, 3]


def test_the_sampler_repeats_its_draws_for_a_seed_and_reads_the_environment(tmp_path):
    (tmp_path / "l.json").write_text("[5, 50, 500]")
    env = {LENGTHS_ENV: str(tmp_path / "l.json"), SEED_ENV: "3"}
    first, second = LengthSampler.from_env(env), LengthSampler.from_env(env)
    draws = [first.draw() for _ in range(50)]
    assert draws == [second.draw() for _ in range(50)]
    assert set(draws) == {5, 50, 500}
    assert draws != [LengthSampler([5, 50, 500], seed=4).draw() for _ in range(50)]
    assert "3 output lengths" in first.describe() and "seed 3" in first.describe()
    with pytest.raises(RuntimeError, match=LENGTHS_ENV):
        LengthSampler.from_env({})
    (tmp_path / "bad.json").write_text('{"lengths": [3, 0]}')
    with pytest.raises(ValueError):
        read_lengths(tmp_path / "bad.json")


def decode(state: ForcedEnd, outputs: dict[int, list[int]], rows: int, vocab: int = 10, steps: int = 20):
    """Greedy decoding where token 1 always wins unless the processor says otherwise; a row stops at its EOS."""
    for _ in range(steps):
        state.update(None)
        logits = torch.zeros(rows, vocab)
        logits[:, 1] = 5.0
        logits[:, 7] = 4.0  # the end token is the runner-up: masked until the length
        picked = state.apply(logits).argmax(dim=1)
        for index, out in outputs.items():
            if not out or out[-1] != 7:
                out.append(int(picked[index]))


def test_each_reply_is_exactly_its_drawn_length_with_the_end_token_last():
    state = ForcedEnd(LengthSampler([3, 6]), eos=None)
    outputs = {0: [], 1: [], 2: []}
    state.update(batch(added=[(i, params(), [9, 9], out) for i, out in outputs.items()]))
    decode(state, outputs, rows=3)
    for out, length in zip(outputs.values(), state.drawn, strict=True):
        assert len(out) == length and out[-1] == 7 and 7 not in out[:-1], (out, length)


def test_rows_follow_removals_moves_and_swaps():
    state = ForcedEnd(LengthSampler([4]))
    a, b, c = [], [], []
    state.update(batch(added=[(0, params(), None, a), (1, params(), None, b), (2, params(), None, c)]))
    state.update(batch(removed=[0], moved=[(2, 0, Move.UNIDIRECTIONAL)]))
    assert set(state.rows) == {0, 1} and state.rows[0][2] is c
    state.update(batch(moved=[(0, 1, Move.SWAP)]))
    assert state.rows[0][2] is b and state.rows[1][2] is c
    # the end token from the request's stop tokens, else the model's; none at all: left alone
    state = ForcedEnd(LengthSampler([1]), eos=3)
    state.update(batch(added=[(0, SimpleNamespace(all_stop_token_ids={9, 4}), None, [])]))
    state.update(batch(added=[(1, SimpleNamespace(), None, [])]))
    assert state.rows[0][1] == 4 and state.rows[1][1] == 3
    logits = state.apply(torch.zeros(3, 10))
    assert logits[0].argmax() == 4 and math.isinf(logits[0, 0]) and logits[1].argmax() == 3
    assert not torch.isinf(logits[2]).any()  # an untracked row is left alone
    state = ForcedEnd(LengthSampler([1]))
    state.update(batch(added=[(0, SimpleNamespace(), None, [])]))
    assert state.rows == {}


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.v1.sample.logits_processor`` as far as the adapter uses it."""
    module = types.ModuleType("vllm.v1.sample.logits_processor")

    class LogitsProcessor:
        pass

    module.LogitsProcessor = LogitsProcessor
    module.BatchUpdate = object
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.logits_processor", module)
    monkeypatch.delitem(sys.modules, "ocrserve.bench.vllm_lengths", raising=False)
    yield module
    sys.modules.pop("ocrserve.bench.vllm_lengths", None)


def test_the_vllm_processor_reads_the_lengths_file_and_ends_replies_there(fake_vllm, tmp_path, monkeypatch):
    (tmp_path / "l.json").write_text('{"lengths": [2]}')
    monkeypatch.setenv(LENGTHS_ENV, str(tmp_path / "l.json"))
    vllm_lengths = importlib.import_module("ocrserve.bench.vllm_lengths")
    assert issubclass(vllm_lengths.ForcedLengths, fake_vllm.LogitsProcessor)
    config = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace(eos_token_id=5)))
    processor = vllm_lengths.ForcedLengths(config, torch.device("cpu"), False)
    assert processor.is_argmax_invariant() is False
    out = [1]
    processor.update_state(batch(added=[(0, SimpleNamespace(), None, out)]))
    assert processor.apply(torch.zeros(1, 8))[0].argmax() == 5  # 1 token so far, length 2: the end
    assert lengths.LENGTHS_ENV == "OCRBENCH_OUTPUT_LENGTHS"  # not OCRSERVE_*: the config would read it


def test_bench_set_items_reach_every_gateway_of_a_sweep(monkeypatch):
    from ocrserve.cli import bench

    started = []

    class Gateway:
        url = "http://gateway"

        def __init__(self, *overrides, profile):
            started.append((overrides, profile))

        def wait_ready(self, timeout):
            assert timeout == bench.GATEWAY_START_S
            return self

        def stop(self):
            pass

    async def point(url, documents, concurrency, seconds, setting, tick):
        return Measurement("closed", 0, 1.0, [RequestOutcome("a.png", 200, 1.0, 1, "")], setting)

    monkeypatch.setattr(bench, "LocalGateway", Gateway)
    monkeypatch.setattr(bench, "_server_point", point)
    run = bench.Run(None, "cpu-vllm", ["vllm.max_num_seqs=1,4"], [8], [], 1.0, None, 5.0, ["engine.model=/m"])
    measured = bench._run_sweep(run, bench._grid(run.sweep), [])
    assert started == [
        (("engine.model=/m", "vllm.max_num_seqs=1"), "cpu-vllm"),
        (("engine.model=/m", "vllm.max_num_seqs=4"), "cpu-vllm"),
    ]
    assert [m.value for m in measured] == [1, 4]
