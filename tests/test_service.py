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


def test_a_4xx_from_the_engines_server_is_422_the_page_will_never_pass():
    error = PageError("http://vllm answered 400: Input length (16543) exceeds model's maximum context", status=400)
    problem = page_problem(0, error)
    assert problem.status == 422 and not problem.headers and "answered 400" in problem.detail
    assert page_problem(0, PageError("answered 500: boom", transient=True, status=500)).status == 503
