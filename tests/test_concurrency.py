"""Planning for the pages served: the output-length model, the statistical --max-num-seqs, the
model of vLLM's scheduler, HunyuanOCR-1.5's registry entry and the plan that shows them."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from ocrserve.gpu import lengths as lengths_mod
from ocrserve.gpu.lengths import LengthsError, OutputLengths, from_corpus, from_report, load
from ocrserve.gpu.overflow import (
    block_pmf,
    model_checked_seqs,
    overflow_curve,
    statistical_seqs,
    worst_case_seqs,
)
from ocrserve.gpu.planner import PlanError, plan_serving
from ocrserve.gpu.registry import lookup
from ocrserve.gpu.scheduler_model import GpuStepTime, LinearStepTime, preempted_share, simulate, speedup_at
from ocrserve.models import RegistryError, get_model, load_registry
from ocrserve.models.schema import REGISTRY_DIR
from ocrserve.models.tokens import reply_tokens

# --- the output-length model ---------------------------------------------------------------


def _corpus(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "latin.gt.txt").write_text("x" * 400, encoding="utf-8")  # 120 tokens at 0.3 a char, + 1
    (tmp_path / "a" / "cjk.gt.txt").write_text("文" * 300, encoding="utf-8")  # 180 tokens at 0.6 a char, + 1
    (tmp_path / "a" / "two.gt.txt").write_text("y" * 40 + "\f" + "z" * 80, encoding="utf-8")  # 2 pages
    (tmp_path / "a" / "zones.uzn").write_text("not text", encoding="utf-8")
    index = [
        {"file": "a/latin.png", "gt": ["a/latin.gt.txt", "a/zones.uzn"]},
        {"file": "a/cjk.png", "gt": ["a/cjk.gt.txt"]},
        {"file": "a/two.tif", "gt": ["a/two.gt.txt"]},
        {"file": "a/none.png"},
    ]
    (tmp_path / "index.json").write_text(json.dumps(index), encoding="utf-8")
    return tmp_path


def test_reply_tokens_are_characters_at_their_scripts_ratio_plus_the_end():
    assert reply_tokens("") == 1
    assert reply_tokens("a" * 10) == 4  # 10 x 0.3 = 3 tokens, + the end token
    assert reply_tokens("a" * 11) == 5  # 3.3, rounded up
    assert reply_tokens("中文。，") == 4  # 4 x 0.6 = 2.4 (CJK punctuation and full-width forms are CJK)
    assert reply_tokens("ab中文") == 3  # 0.6 + 1.2, rounded up, + 1
    assert reply_tokens("한국어") == 3  # hangul: 1.8 -> 2, + 1


def test_corpus_lengths_count_latin_and_cjk_at_their_ratios(tmp_path):
    got = from_corpus(_corpus(tmp_path))
    assert sorted(got.samples) == [13, 25, 121, 181]  # one sample a page; the zone file skipped
    assert got.kind == "corpus" and "tokenizer is not local" in got.source
    assert load(tmp_path).samples == got.samples  # a folder with index.json is a corpus


def test_report_lengths_keep_every_points_completion_tokens(tmp_path):
    report = {"points": [{"value": 1, "completion_tokens": [1500, 1800]}, {"value": 2, "completion_tokens": [900]}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    got = from_report(tmp_path / "report.json")
    assert sorted(got.samples) == [900, 1500, 1800] and got.kind == "report" and got.runaway == 0
    assert load(tmp_path).samples == got.samples  # the report's folder works too
    assert got.quantile(0.5, 16384) == 1500 and got.mean(1000) == pytest.approx(2900 / 3)  # clipped
    (tmp_path / "old.json").write_text(json.dumps({"points": [{"value": 1}]}))
    with pytest.raises(LengthsError, match="no completion_tokens"):
        from_report(tmp_path / "old.json")
    with pytest.raises(LengthsError, match="neither a bench report"):
        load(tmp_path / "nothing-here")


def test_prior_has_its_median_p95_and_runaway_share():
    spec = get_model("tencent/HunyuanOCR-1.5")
    got = lengths_mod.prior(spec.id, "markdown", spec.output_tokens, spec.sources["output_tokens"])
    assert got.kind == "prior" and "estimate" in got.source
    assert got.quantile(0.5, spec.max_tokens) == pytest.approx(1200, rel=0.02)
    assert got.quantile(0.95, spec.max_tokens) == pytest.approx(2600, rel=0.03)
    assert got.distribution(spec.max_tokens)[spec.max_tokens] == pytest.approx(0.002)
    default = lengths_mod.prior("some/model", "text", None)
    assert "estimate" in default.source and default.runaway == lengths_mod.DEFAULT_PRIOR["runaway"]


# --- the statistical --max-num-seqs ---------------------------------------------------------


def test_statistical_n_by_hand():
    # prefix 16 tokens; output 16 tokens (2 blocks) or 48 (4 blocks), even odds; 10 blocks in the cache.
    pmf = block_pmf({16: 0.5, 48: 0.5}, 16)
    curve = overflow_curve(pmf, lambda n: 10, 6)
    # 3 pages: 6, 8, 10, 12 blocks with 1/8, 3/8, 3/8, 1/8 -> P(> 10) = 1/8; 4 pages: P(> 10) = 11/16
    assert curve[:4] == pytest.approx([0, 0, 1 / 8, 11 / 16])
    assert statistical_seqs(curve, 0.2) == 3 and statistical_seqs(curve, 0.1) == 2
    assert worst_case_seqs(4, lambda n: 10, 512) == 2


def test_statistical_n_grows_with_the_target_and_is_the_worst_case_when_every_page_is_longest():
    prior = lengths_mod.prior("m", "text", None).distribution(16384)
    pmf = block_pmf(prior, 4491)
    curve = overflow_curve(pmf, lambda n: 46_000 - n, 512)
    picks = [statistical_seqs(curve, t) for t in (0.0001, 0.001, 0.01, 0.1, 0.5)]
    assert picks == sorted(picks) and picks[0] < picks[-1]
    longest = block_pmf({16384: 1.0}, 4491)
    flat = overflow_curve(longest, lambda n: 46_000 - n, 512)
    worst = worst_case_seqs(len(longest) - 1, lambda n: 46_000 - n, 512)
    assert worst == 35
    for target in (0.0, 0.01, 0.5):
        assert statistical_seqs(flat, target) == worst


def test_model_checked_n_is_the_largest_within_the_target_between_the_bounds():
    share = {n: 0.0 if n <= 40 else (n - 40) / 200 for n in range(1, 60)}.__getitem__
    assert model_checked_seqs(50, 3, 0.01, share) == 42  # 2/200 = 1%, 3/200 above it
    assert model_checked_seqs(50, 3, 0.0, share) == 40
    assert model_checked_seqs(41, 3, 0.01, share) == 41  # the chance's own N already within it
    assert model_checked_seqs(50, 45, 0.01, share) == 45  # never below the worst case
    assert model_checked_seqs(0, 0, 0.01, share) == 0


# --- the model of vLLM's scheduler ------------------------------------------------------------

STEP = GpuStepTime(2 * 996_208_112, 98_304, 996_208_112, 2.0e12 * 0.8)


def _run(seqs, lengths, weights=None, kv_blocks=46_000, pages=400):
    return simulate(
        max_num_seqs=seqs,
        kv_blocks=kv_blocks,
        prefix_tokens=4491,
        lengths=lengths,
        weights=weights,
        step_time=STEP,
        batched_tokens=8192,
        pages=pages,
        warm_up=100,
    )


def test_scheduler_model_never_preempts_at_the_worst_case_n():
    worst = worst_case_seqs(-(-(4491 + 16384) // 16), lambda n: 46_000, 512)
    # every page at its longest: the worst case fills the cache without outgrowing it
    full = _run(worst, [16384], pages=120)
    assert full.preemptions_per_page == 0 and full.mean_running == pytest.approx(worst, rel=0.01)
    real = _run(worst, [800, 1500, 2500, 16384], [0.3, 0.4, 0.29, 0.01])
    assert real.preemptions_per_page == 0 and real.pages_per_s > 0 and real.p95_s >= real.p50_s


def test_scheduler_model_preempts_when_n_outgrows_the_cache():
    lengths, weights = [800, 1500, 2500, 16384], [0.3, 0.4, 0.29, 0.01]
    many = _run(512, lengths, weights)
    assert many.preemptions_per_page > 0 and many.preempted_share > 0
    assert many.mean_running < 512 and many.kv_use > 0.9  # the cache, not the flag, bounds the batch
    fewer = _run(64, lengths, weights)
    assert fewer.p95_s < many.p95_s


def test_preempted_share_is_zero_at_the_worst_case_and_grows_past_the_cache():
    scenario = {"kv_blocks": 393, "prefix_tokens": 346, "lengths": [100, 400, 1400], "weights": None}
    scenario |= {"batched_tokens": 2048, "block": 128, "pages": 300, "warm_up": 50}
    assert preempted_share(max_num_seqs=3, **scenario) == 0.0
    shares = [preempted_share(max_num_seqs=n, **scenario) for n in (30, 60, 90)]
    assert shares[0] == 0.0 < shares[1] < shares[2]  # 60 pages average 6 blocks: 360 of 393


def test_a_window_measures_the_pages_that_finish_in_it():
    step = LinearStepTime(0.01, 0.001)
    run = simulate(
        max_num_seqs=4, kv_blocks=1000, prefix_tokens=100, lengths=[50], weights=None, step_time=step,
        batched_tokens=2048, in_flight=8, window=(2.0, 12.0),
    )  # fmt: skip
    # 4 at once, 50 steps of 14 ms a page: 4 pages every 0.7 s (plus the prefill steps); 15 such groups in 10 s
    assert run.pages_per_s == pytest.approx(4 / (50 * 0.014), rel=0.1)
    assert run.p50_s == pytest.approx(2 * 50 * 0.014, rel=0.1)  # half the clients queue behind the others
    assert run.mean_running == pytest.approx(4, rel=0.02)


def test_step_time_fits_a_plus_b_batch_and_speculation_fades_with_batch():
    fitted = LinearStepTime.fit([(1, 1, 0, 0.012), (1, 4, 0, 0.018), (1, 8, 0, 0.026)])
    assert fitted.a == pytest.approx(0.01, abs=1e-3) and fitted.b == pytest.approx(0.002, abs=2e-4)
    # windows of many steps, as vLLM's counters give them: 3 ms a step, 0.4 ms a running page, 20 us a prefill token
    windows = [
        (s, g, p, s * 0.003 + g * 0.0004 + p * 0.00002)
        for s, g, p in [(900, 2700, 700), (400, 9000, 2800), (350, 16000, 7000)]
    ]
    fitted = LinearStepTime.fit(windows)
    assert (fitted.a, fitted.b, fitted.prefill_per_token) == pytest.approx((0.003, 0.0004, 0.00002))
    # a negative intercept from noise is dropped, not kept
    assert LinearStepTime.fit([(1, 1, 0, 0.001), (1, 10, 0, 0.012)]).a == 0.0
    with pytest.raises(ValueError, match="two mean batch sizes"):
        LinearStepTime.fit([(1, 4, 0, 0.1), (2, 8, 0, 0.2)])
    points = [(1, 2.14), (32, 1.80)]
    assert speedup_at(points, 1) == 2.14 and speedup_at(points, 32) == 1.80 and speedup_at(points, 256) == 1.80
    assert 1.80 < speedup_at(points, 8) < 2.14
    run = {
        "max_num_seqs": 4,
        "kv_blocks": 46_000,
        "prefix_tokens": 4491,
        "lengths": [1500],
        "weights": None,
        "step_time": fitted,
        "batched_tokens": 8192,
        "pages": 50,
        "warm_up": 10,
    }
    plain, drafted = simulate(**run), simulate(**run, speedup=points)
    assert drafted.pages_per_s > plain.pages_per_s * 1.5


# --- the registry -------------------------------------------------------------------------------


def test_hunyuanocr_15_derives_from_10_with_its_cards_figures():
    old, new = get_model("tencent/HunyuanOCR"), get_model("tencent/HunyuanOCR-1.5")
    assert new.kv_bytes_per_token() == old.kv_bytes_per_token() and new.parameters == old.parameters
    assert new.max_tokens == 32768 and old.max_tokens == 16384
    assert {k: new.sampling[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")} == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.08,
    }
    assert new.speculative["method"] == "dflash" and new.speculative["speedup"] == [[1, 2.14], [32, 1.80]]
    assert "94.74" in new.notes and "92.03" in new.notes
    for key in ("sampling", "speculative", "output_tokens"):
        assert new.sources[key].strip()
    assert old.speculative is None


def _registry_copy(tmp_path):
    folder = tmp_path / "registry"
    folder.mkdir()
    for f in REGISTRY_DIR.iterdir():
        if f.name.endswith(".yaml"):
            (folder / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: d["speculative"]["value"].update(speedup=[[0, 2.0]]), "speedup"),
        (lambda d: d["speculative"]["value"].update(method="lookahead"), "method"),
        (lambda d: d["speculative"].pop("source"), "speculative"),
        (lambda d: d["output_tokens"]["value"].update(text={"median": 900, "p95": 800}), "median < p95"),
        (lambda d: d["output_tokens"]["value"].update(runaway=1.5), "runaway"),
        (lambda d: d["output_tokens"]["value"].update(poem={"median": 1, "p95": 2}), "unknown task"),
    ],
)
def test_broken_speculative_or_length_prior_names_file_and_key(tmp_path, change, expected):
    folder = _registry_copy(tmp_path)
    path = folder / "hunyuanocr-1.5.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    with pytest.raises(RegistryError) as err:
        load_registry(folder)
    assert str(path) in str(err.value) and expected in str(err.value), str(err.value)


# --- the plan -------------------------------------------------------------------------------------


def test_plan_compares_the_three_n_and_takes_the_statistical_one_only_when_asked():
    spec, gpu = get_model("tencent/HunyuanOCR"), lookup("RTX 4090")
    worst = plan_serving(spec, gpu, max_pixels=4_194_304)
    shown = plan_serving(spec, gpu, max_pixels=4_194_304, output_lengths=lengths_mod.prior(spec.id, "text", None))
    assert shown.vllm_args["max_num_seqs"] == worst.vllm_args["max_num_seqs"]  # shown beside, not planned
    names = [c.name for c in shown.concurrency.candidates]
    assert names == ["worst case", "statistical", "vLLM default"]
    stat = shown.concurrency.candidate("statistical")
    assert stat.seqs > worst.vllm_args["max_num_seqs"] and stat.overflow <= 0.01
    assert shown.concurrency.candidate("vLLM default").seqs == 256 and not shown.concurrency.predictions
    planned = plan_serving(spec, gpu, max_pixels=4_194_304, overflow_target=0.01, predict=True)
    assert planned.vllm_args["max_num_seqs"] == stat.seqs
    assert set(planned.concurrency.predictions) == {c.seqs for c in planned.concurrency.candidates}
    assert planned.to_dict()["concurrency"]["candidates"][1]["predicted"]["pages_per_s"] > 0
    with pytest.raises(PlanError, match="overflow"):
        plan_serving(spec, gpu, overflow_target=1.5)


def test_speculative_plan_adds_the_drafts_memory_and_config():
    spec, gpu = get_model("tencent/HunyuanOCR-1.5"), lookup("H100 80GB")
    plain = plan_serving(spec, gpu, max_pixels=4_194_304)
    drafted = plan_serving(spec, gpu, max_pixels=4_194_304, speculative=True)
    assert drafted.vllm_args["speculative_config"] == {
        "method": "dflash",
        "model": "tencent/HunyuanOCR-1.5-DFlash",
        "num_speculative_tokens": 15,  # serve_DFlash.sh's NUM_SPEC_TOKENS
    }
    assert drafted.value("weights_bytes") > plain.value("weights_bytes")
    assert drafted.value("kv_bytes_per_token") > plain.value("kv_bytes_per_token")
    assert "falls" in next(s.derivation for s in drafted.steps if s.key == "speculative")
    assert drafted.model.id == spec.id and drafted.argv()[2] == spec.id
    with pytest.raises(PlanError, match="records no speculative decoder"):
        plan_serving(get_model("tencent/HunyuanOCR"), gpu, speculative=True)


def test_glm_ocr_mtp_plan_adds_one_layer_and_no_draft_model():
    spec, gpu = get_model("zai-org/GLM-OCR"), lookup("H100 80GB")
    plain = plan_serving(spec, gpu)
    drafted = plan_serving(spec, gpu, speculative=True)
    # the vLLM recipe's --speculative-config.method mtp --speculative-config.num_speculative_tokens 1
    assert drafted.vllm_args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert "speculative_config" not in plain.vllm_args
    # the MTP block's weights (35,400,192 x 2 bytes) and one more layer of K and V per token
    assert drafted.value("weights_bytes") - plain.value("weights_bytes") == 35_400_192 * 2
    assert drafted.value("kv_bytes_per_token") == plain.value("kv_bytes_per_token") * 17 // 16
    assert drafted.model.id == spec.id and drafted.argv()[2] == spec.id
    step = next(s for s in drafted.steps if s.key == "speculative")
    assert "mtp" in step.value and "35,400,192" in step.derivation and "reported speedup none" in step.derivation


def _cli():
    from ocrserve.cli import app

    return app


def test_cli_plan_table_shows_both_n_and_predictions(tmp_path):
    report = {"points": [{"completion_tokens": [1200, 1500, 1800, 2100, 900]}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    args = ["plan", "--gpu", "RTX 4090", "--overflow", "0.01", "--output-lengths", str(tmp_path / "report.json")]
    result = CliRunner().invoke(_cli(), args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for words in (
        "worst case",
        "statistical (planned)",
        "vLLM default",
        "pages/s (predicted)",
        "report:",
        "predictions, not measurements",
    ):
        assert words in result.stdout, words
    argv = CliRunner().invoke(_cli(), [*args, "--format", "argv"])
    seqs = int(shlex.split(argv.stdout)[shlex.split(argv.stdout).index("--max-num-seqs") + 1])
    data = json.loads(CliRunner().invoke(_cli(), [*args, "--format", "json"]).stdout)
    assert data["concurrency"]["candidates"][1]["max_num_seqs"] == seqs == data["vllm_args"]["max_num_seqs"]
    assert data["concurrency"]["output_lengths"]["kind"] == "report"


def test_cli_capacity_predicts_t_of_b_for_a_gpu_with_the_scheduler_model():
    args = ["capacity", "--rate", "4", "--p95", "600", "--gpu", "RTX 4090", "--overflow", "0.01"]
    result = CliRunner().invoke(_cli(), args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "predicted, not measured: tencent/HunyuanOCR on RTX 4090 (profile prod), --max-num-seqs 31" in result.stdout
    assert "(statistical)" in result.stdout and "replicas:" in result.stdout
    both = CliRunner().invoke(_cli(), [*args, "--a", "0.1"])
    assert both.exit_code == 2 and "takes no --from-bench" in both.output


def test_cli_plan_speculative_flag(tmp_path):
    args = ["plan", "--gpu", "H100 80GB", "--model", "tencent/HunyuanOCR-1.5", "--speculative", "--format", "argv"]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    assert "--speculative-config" in shlex.split(result.stdout)
    glm = CliRunner().invoke(_cli(), [*args[:4], "zai-org/GLM-OCR", *args[5:]])
    assert glm.exit_code == 0, glm.output
    argv = shlex.split(glm.stdout)
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'


def _vllm_parser():
    from tests.test_planner import _vllm_parser as parser

    return parser()


@pytest.mark.vllm
def test_statistical_and_speculative_argv_parse_with_vllms_own_parser():
    parser, validate = _vllm_parser()
    for plan in (
        plan_serving(get_model("tencent/HunyuanOCR"), lookup("H100 80GB"), overflow_target=0.01),
        plan_serving(get_model("tencent/HunyuanOCR-1.5"), lookup("H100 80GB"), speculative=True),
        plan_serving(get_model("zai-org/GLM-OCR"), lookup("H100 80GB"), speculative=True),
    ):
        args = parser.parse_args(plan.argv()[2:])
        validate(args)
        assert args.max_num_seqs == plan.vllm_args["max_num_seqs"]
        if "speculative_config" in plan.vllm_args:
            assert args.speculative_config == plan.vllm_args["speculative_config"]


def test_lengths_source_must_hold_lengths():
    with pytest.raises(LengthsError):
        OutputLengths((), "corpus", "empty")
