"""Text and markdown renderings of results."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

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


def _paragraphs(markdown: str) -> list[str]:
    """The text of each paragraph a CommonMark reader with GFM tables and strikethrough
    (markdown-it-py) finds in ``markdown``, soft breaks as ``\\n``; fails on any other markup
    (emphasis, code, links, raw HTML, lists, tables, ...) outside the ``## Page N`` headings."""
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(markdown)
    paragraphs, kinds = [], []
    for token in tokens:
        kinds.append(token.type)
        if token.type == "inline" and kinds[-2] == "paragraph_open":
            parts = []
            for child in token.children or []:
                assert child.type in ("text", "text_special", "softbreak"), (child.type, markdown)
                parts.append("\n" if child.type == "softbreak" else child.content)
            paragraphs.append("".join(parts))
    assert set(kinds) <= {"heading_open", "inline", "heading_close", "paragraph_open", "paragraph_close"}, kinds
    return paragraphs


#: Lines built from what Markdown reads as markup, and from any character but NUL (readers show
#: U+FFFD) and vertical tab (stripped at a paragraph's ends); surrogates are not text.
_LINE = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("#>-+*=_`[]()<>!&;|\\~:. \t\r1)aé")),
        st.characters(blacklist_characters="\n\x00\x0b", blacklist_categories=("Cs",)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(_LINE, min_size=1, max_size=4), min_size=1, max_size=4))
def test_markdown_of_any_text_reads_back_as_paragraphs_of_that_text(blocks):
    text = "\n\n".join("\n".join(lines) for lines in blocks)
    markdown = render_markdown({"pages": [{"index": 0, "text": text}]})
    assert markdown.startswith("## Page 1\n\n")
    assert _paragraphs(markdown) == ["\n".join(lines) for lines in blocks]


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("# total", "\\# total"),
        ("1. item\n2) other", "1\\. item\n2\\) other"),
        ("| a | b |\n|---|---|", "\\| a \\| b \\|\n\\|---\\|---\\|"),
        ("title\n---", "title\n\\---"),
        ("title\n===", "title\n\\==="),
        ("***", "\\*\\*\\*"),
        ("*x* and _y_", "\\*x\\* and \\_y\\_"),
        ("<b>bold</b>", "\\<b>bold\\</b>"),
        ("> quote", "\\> quote"),
        ("- a\n+ b", "\\- a\n\\+ b"),
        ("    code", "&#32;   code"),
        ("`x` ![i](u) [l](u)", "\\`x\\` !\\[i\\](u) \\[l\\](u)"),
        ("AT&T &amp; &#35; C:\\dir", "AT&T \\&amp; \\&#35; C:\\\\dir"),
        ("line break  ", "line break &#32;"),
        ("~~gone~~", "\\~\\~gone\\~\\~"),
    ],
)
def test_markdown_escapes_what_a_reader_would_take_as_markup(text, escaped):
    markdown = render_markdown({"pages": [{"index": 0, "text": text}]})
    assert markdown == f"## Page 1\n\n{escaped}\n"
    assert _paragraphs(markdown) == [text]


def test_markdown_keeps_blocks_as_paragraphs_and_escapes_names_and_errors():
    result = {
        "pages": [
            {"index": 0, "document": 0, "text": "# 1 total\nnext line\n\n2. second block\n\n\n"},
            {"index": 0, "document": 1, "text": "", "error": {"status": 415, "detail": "<not> an *image*"}},
        ],
        "documents": [{"name": "a_b*.pdf #"}, {"name": "c.tif"}],
    }
    markdown = render_markdown(result)
    assert markdown.startswith("# a\\_b\\*.pdf \\#\n\n## Page 1\n\n\\# 1 total\nnext line\n\n2\\. second block\n")
    assert "> page failed: \\<not> an \\*image\\*" in markdown
    inline = [t for t in MarkdownIt("commonmark").parse(markdown) if t.type == "inline"]
    assert "".join(c.content for c in inline[0].children) == "a_b*.pdf #"  # the heading reads as the name
    assert "".join(c.content for c in inline[-1].children) == "page failed: <not> an *image*"
    assert _paragraphs(markdown.split("\n# c.tif")[0]) == ["# 1 total\nnext line", "2. second block"]


@pytest.mark.parametrize("markup", ["markdown", "html"])
def test_markdown_passes_through_the_markup_a_vlm_was_asked_for(markup):
    """engine.vllm.task markdown or table: the model's own headings and tables stay markup."""
    text = (
        "# Invoice\n\n| qty | item |\n|---|---|\n| 2 | pens |"
        if markup == "markdown"
        else "<table><tr><td>2</td></tr></table>"
    )
    page = {"index": 0, "text": text, "markup": markup}
    assert render_markdown({"pages": [page]}) == f"## Page 1\n\n{text}\n"
    plain = render_markdown({"pages": [{**page, "markup": "text"}]})
    assert ("\\# Invoice" if markup == "markdown" else "\\<table>") in plain
