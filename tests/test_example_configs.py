"""The example profiles under ``configs/profiles/`` load and validate as ``ocrserve launch
--profile FILE`` loads them, so an operator's copy starts from a file that works."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocrserve.config import load_config

PROFILES = sorted((Path(__file__).resolve().parents[1] / "configs" / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda path: path.name)
def test_example_profile_loads(path: Path):
    cfg = load_config(str(path), environ={})
    assert cfg.profile == path.stem and cfg.description
    assert cfg.server.host == "0.0.0.0" and cfg.server.api_keys and cfg.server.log_format == "json"


def test_there_are_example_profiles():
    assert {p.name for p in PROFILES} >= {"gpu-host.yaml", "gateway-fleet.yaml", "cpu-host.yaml"}
