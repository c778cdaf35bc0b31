"""How engine failures become problems."""

from ocrserve.engines.base import PageError
from ocrserve.pipeline import TRANSIENT_RETRY_AFTER_S, page_problem


def test_transient_engine_failure_is_503_with_retry_after():
    problem = page_problem(2, PageError("connection refused", transient=True))
    assert problem.status == 503 and problem.headers == {"Retry-After": str(TRANSIENT_RETRY_AFTER_S)}
    assert problem.detail == "page 3: connection refused"


def test_permanent_engine_failure_is_502():
    problem = page_problem(0, PageError("image too large for the model"))
    assert problem.status == 502 and not problem.headers
