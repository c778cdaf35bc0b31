"""Profiles, overrides and the CLI's handling of bad configuration."""

from __future__ import annotations

import itertools
import re

import pytest
from typer.testing import CliRunner

from ocrserve.cli import app, engine, reflowed
from ocrserve.config import ConfigError, list_profiles, load_config, profile_path

runner = CliRunner()


def test_local_profile_defaults():
    cfg = load_config("local", environ={})
    assert cfg.profile == "local" and cfg.engine.kind == "onnx"
    assert (cfg.preprocess.factor, cfg.preprocess.max_side, cfg.preprocess.max_pages) == (1, 2000, 200)
    assert "local" in list_profiles()


def test_set_beats_environment_beats_file():
    env = {"OCRSERVE_SERVER__PORT": "9100", "OCRSERVE_ENGINE__ONNX__MAX_BATCH_SIZE": "8", "HOME": "/x"}
    cfg = load_config("local", ["server.port=9200", "server.api_keys=[a, b]"], environ=env)
    assert cfg.server.port == 9200 and cfg.engine.onnx.max_batch_size == 8
    assert cfg.server.api_keys == ["a", "b"]


@pytest.mark.parametrize(
    "overrides, env, message",
    [
        (["server.prot=1"], {}, "unknown key 'server.prot'"),
        (["nonsense=1"], {}, "unknown key 'nonsense'"),
        ([], {"OCRSERVE_ENGINE__ONNX__BATCH": "4"}, "unknown key 'engine.onnx.batch'"),
        (
            [],
            {"OCRSERVE_NONSENSE": "4"},
            "unknown key 'nonsense' (from OCRSERVE_NONSENSE)",
        ),  # pydantic-settings skips it
        ([], {"OCRSERVE_SERVER_PORT": "4"}, "unknown key 'server_port'"),
        ([], {"OCRSERVE_SERVER__PORT": "[1"}, "OCRSERVE_SERVER__PORT: not a valid YAML value"),
        (["_env_file=x"], {}, "unknown key '_env_file'"),  # not a BaseSettings argument
        (
            ["engine.onnx.max_batch_size=0"],
            {},
            "engine.onnx.max_batch_size: Input should be greater than or equal to 1",
        ),
        (["engine.kind=tpu"], {}, "engine.kind"),
        # each lane's own defaults keep the limits LaneConfig gives the field
        (["router.fast.aging_s=-1"], {}, "router.fast.aging_s: Input should be greater than or equal to 0"),
        (["router.fast.queue_pages=0"], {}, "router.fast.queue_pages: Input should be greater than or equal to 1"),
        (["router.bulk.weight=0"], {}, "router.bulk.weight: Input should be greater than or equal to 1"),
        (["server.port"], {}, "--set expects key=value"),
    ],
)
def test_bad_configuration_names_the_key(overrides, env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("local", overrides, environ=env)


def test_environment_and_set_values_are_yaml():
    env = {
        "OCRSERVE_SERVER__API_KEYS": "[k1, k2]",
        "OCRSERVE_ROUTER__OVERLOAD_STATUS": "429",
        "OCRSERVE_VLLM__GPU_MEMORY_GIB": "null",
        "OCRSERVE_STORE__CACHE_SYNC": "yes",
        "OCRSERVE_SERVER": "{host: 0.0.0.0}",
    }
    cfg = load_config("prod", ["engine.vllm.base_urls=[http://a:1,http://b:2]"], environ=env)
    assert cfg.engine.vllm.base_urls == ["http://a:1", "http://b:2"] and cfg.server.api_keys == ["k1", "k2"]
    assert (cfg.router.overload_status, cfg.vllm.gpu_memory_gib, cfg.store.cache_sync) == (429, None, True)
    assert cfg.server.host == "0.0.0.0" and cfg.server.port == 8000  # a section's mapping merges with the file


def test_real_environment_unless_one_is_injected(monkeypatch):
    monkeypatch.setenv("OCRSERVE_SERVER__PORT", "9500")
    assert load_config("local").server.port == 9500
    assert load_config("local", environ={}).server.port == 8000


def test_shipped_profiles_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert {"local", "prod"} <= set(list_profiles())
    assert load_config("prod", environ={}).engine.kind == "vllm"
    assert profile_path("local").parent.name == "profiles"


def test_client_variables_are_not_config():
    env = {"OCRSERVE_URL": "http://x:1", "OCRSERVE_API_KEY": "k", "OCRSERVE_CORPUS": "/c", "OCRSERVE_TEST_LOGS": "1"}
    env |= {"OCRSERVE_TEST_WITHOUT": "redis-server", "OCRSERVE_TEST_SKIPS": "/tmp/s"}
    assert load_config("local", environ=env).server.port == 8000


def test_unknown_profile_lists_available():
    with pytest.raises(ConfigError, match="available: .*local"):
        load_config("nope", environ={})


def test_profile_from_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("server:\n  port: 9300\npreprocess:\n  max_pages: 5\n")
    cfg = load_config(str(path), environ={})
    assert (cfg.profile, cfg.server.port, cfg.preprocess.max_pages) == ("mine", 9300, 5)


def test_cli_unknown_set_key_is_an_error():
    result = runner.invoke(app, ["launch", "--set", "server.prot=1"])
    assert result.exit_code == 2
    assert "unknown key 'server.prot'" in result.output


def test_cli_dry_run_and_profiles():
    result = runner.invoke(app, ["launch", "--dry-run", "--port", "9400", "--set", "router.fast.weight=5"])
    gateway = "ocrserve launch --profile local --host 127.0.0.1 --port 9400 --set router.fast.weight=5"
    assert result.exit_code == 0 and gateway in result.output
    banner = result.output.splitlines()[:2]  # the profile's file and the overrides, before anything else
    assert "profiles/local.yaml" in banner[0] and banner[1].strip() == "--set router.fast.weight=5"
    listed = runner.invoke(app, ["profiles"])
    assert listed.exit_code == 0 and "local" in listed.output and "onnx" in listed.output


def test_cli_help_has_examples():
    for command in ("launch", "ocr", "profiles"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
    assert "ocrserve ocr scans/" in runner.invoke(app, ["ocr", "--help"]).output
    launch_help = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "200"}).output
    assert "KEY=VALUE" in launch_help and "NAME|PATH" in launch_help
    assert not re.search(r"<(bool|str|int|list\[str\])>", launch_help), launch_help  # no Python types as metavars


def test_reflowed_joins_prose_paragraphs_and_keeps_laid_out_ones():
    prose = "Prose that the source\nbreaks at 100 columns."
    laid_out = "- a list\n- kept\n\nExamples:\n\n    ocrserve x\n    ocrserve y"
    assert reflowed(f"Summary.\n\n{prose}\n\n{laid_out}") == (
        f"Summary.\n\nProse that the source breaks at 100 columns.\n\n{laid_out}"
    )


COMMANDS = [[c.name] for c in app.registered_commands] + [
    ["engine", c.name or c.callback.__name__] for c in engine.app.registered_commands
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_prose_wraps_at_the_terminal_width(command):
    help_text = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}).output
    prose_lines = help_text.split("Examples:")[0].split("╭")[0].splitlines()
    # wrapped once: a line inside a paragraph fills the width (a 100-column source line wrapped
    # again at 80 leaves a short line after it, as does a paragraph indented like an example)
    short = [a for a, b in itertools.pairwise(prose_lines) if a.strip() and b.strip() and len(a.rstrip()) < 60]
    assert not short, short
