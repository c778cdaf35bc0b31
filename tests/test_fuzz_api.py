"""Fuzzing the REST API from its own OpenAPI schema (schemathesis) against a real gateway on
loopback: valid and invalid requests to every operation get no 5xx, no traceback or server path in
the body, and an answer in bounded time. ``scripts/fuzz.py --target api`` runs it for longer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzzing
from tests.conftest import Gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A gateway of its own, its jobs in a folder of their own: the fuzzed jobs and uploads stay
    out of other tests' figures."""
    gw = Gateway(f"store.data_dir={tmp_path_factory.mktemp('fuzz')}").wait_ready()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def cases(gateway):
    return fuzzing.api_cases(fuzzing.load_schema(gateway.url))


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_requests_from_the_schema_get_no_server_error(gateway, cases, data):
    fuzzing.check_call(data.draw(cases, label="case"), gateway.url)
