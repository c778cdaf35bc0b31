"""Text and markdown renderings of results."""

from __future__ import annotations

from ocrserve.formats import render_markdown, render_text


def test_markdown_heads_each_document_of_a_job_and_shows_failed_pages():
    result = {
        "pages": [
            {"index": 0, "document": 0, "text": "first"},
            {"index": 1, "document": 0, "text": "second"},
            {"index": 0, "document": 1, "text": "", "error": {"status": 413, "detail": "too many pixels"}},
        ],
        "documents": [{"name": "a.pdf"}, {"name": "b.tif"}],
    }
    assert render_markdown(result) == (
        "# a.pdf\n\n## Page 1\n\nfirst\n\n## Page 2\n\nsecond\n\n"
        "# b.tif\n\n## Page 1\n\n> page failed: too many pixels\n"
    )
    assert render_text(result) == "first\fsecond\f"


def test_markdown_of_one_document_has_page_sections_only():
    result = {"pages": [{"index": 2, "text": "only page 3"}]}
    assert render_markdown(result) == "## Page 3\n\nonly page 3\n"
