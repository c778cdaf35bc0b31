"""Fuzzing the preprocessor (hypothesis, a few dozen documents a kind): random bytes, truncations
and header mutations of the real samples must end as pages, failed pages or 4xx problems, never
another exception, in bounded time. ``scripts/fuzz.py`` runs the same properties for longer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from ocrserve.config import load_config
from tests import fuzzing

# Pillow warns about the broken files it still reads; the decoding processes rate-limit these.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CFG = load_config("local").preprocess
SHORT = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_sample_decodes_whole():
    """The mutations start from documents that decode: a failure below is the mutation's."""
    for name in fuzzing.sample_documents():
        assert fuzzing.check_document(fuzzing.Document(name), CFG) == "pages", name


@SHORT
@given(fuzzing.random_documents())
def test_random_bytes_are_refused_as_client_errors(document):
    fuzzing.check_document(document, CFG)


@SHORT
@given(fuzzing.truncated_documents())
def test_truncated_samples_end_as_pages_or_client_errors(document):
    fuzzing.check_document(document, CFG)


@SHORT
@given(fuzzing.mutated_documents())
def test_header_mutations_end_as_pages_or_client_errors(document):
    fuzzing.check_document(document, CFG)
