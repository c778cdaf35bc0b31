"""The OCR result document (DESIGN.md's result JSON) and its renderings: ``json``, ``text``, ``markdown``."""

from __future__ import annotations

import re
import uuid
from typing import Literal, get_args

#: The renderings a client may ask for (``format``).
Format = Literal["json", "text", "markdown"]
FORMATS = get_args(Format)
MEDIA_TYPES = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
}


def assemble_result(pages: list[dict], model: str, lane: str, seconds: float, result_id: str = "") -> dict:
    """The result dict of DESIGN.md from page dicts (``PageResult.to_dict()``) in order.

    Args:
        seconds: wall time of the whole document (``usage.seconds``); ``usage.pages`` counts the
            pages that succeeded, ``usage.blank_pages`` those of them answered blank (no ink, no OCR).
        result_id: the result's ``id``; a new random one when empty.
    """
    failed = sum(1 for page in pages if page.get("error"))
    blank = sum(1 for page in pages if page.get("source") == "blank")
    return {
        "id": result_id or uuid.uuid4().hex,
        "model": model,
        "lane": lane,
        "text": "\f".join(page["text"] for page in pages),
        "pages": pages,
        "usage": {"pages": len(pages) - failed, "blank_pages": blank, "seconds": round(seconds, 4)},
    }


def render_text(result: dict) -> str:
    """All pages' text, pages separated by a form feed (U+000C)."""
    return "\f".join(page.get("text", "") for page in result["pages"])


def render_markdown(result: dict) -> str:
    """One ``## Page N`` section per page; a failed page shows its error. A job's result of several
    documents starts each document with a ``# <file name>`` heading. A page's plain text is escaped
    (:func:`markdown_paragraphs`): each of its blocks is one paragraph that reads as the text; the
    Markdown or HTML a VLM was asked for (the page's ``markup``) is passed through."""
    documents = result.get("documents") or []
    sections, current = [], None
    for page in result["pages"]:
        if len(documents) > 1 and page["document"] != current:
            current = page["document"]
            sections.append(f"# {_escape_heading(documents[current]['name'])}\n")
        text = page.get("text", "")
        body = markdown_paragraphs(text) if page.get("markup", "text") == "text" else text.strip()
        if page.get("error"):
            body = f"> page failed: {escape_markdown_line(page['error'].get('detail', '') or '')}"
        sections.append(f"## Page {page['index'] + 1}\n\n{body}\n")
    return "\n".join(sections)


#: Characters Markdown reads anywhere in a line (emphasis, code, links, images, raw HTML, GFM tables
#: and strikethrough, escapes), a character reference (``&amp;``, ``&#35;``), and a carriage return
#: (a line break to a Markdown reader).
_INLINE = re.compile(r"[\\`*_\[\]<|~]|&(?=#?[0-9A-Za-z]+;)|\r")
#: A line starting with these starts a heading, block quote, list, setext underline or thematic break.
_LINE_START = "#>+-="
#: An ordered list item's number and delimiter (``1.``, ``2)``) at the start of a line.
_ORDERED = re.compile(r"^([0-9]+)([.)])")


def escape_markdown_line(line: str) -> str:
    """``line`` (one line of text, no ``\\n``) as Markdown that a CommonMark (or GitHub Flavored
    Markdown) reader shows as exactly ``line`` inside a paragraph: ASCII punctuation it would read
    as markup gets a backslash, ``&`` of a character reference too, a carriage return and the
    first and last character when they are whitespace (which a reader strips, or reads as code or
    a line break) become character references (``&#32;``). Not kept: a NUL (readers show U+FFFD),
    a vertical tab at either end of a paragraph (stripped)."""
    out = _INLINE.sub(lambda m: "&#13;" if m.group() == "\r" else "\\" + m.group(), line)
    out = "\\" + out if out[:1] and out[0] in _LINE_START else _ORDERED.sub(r"\1\\\2", out, count=1)
    if _stripped(out[:1]):
        out = f"&#{ord(out[0])};{out[1:]}"
    if _stripped(out[-1:]):
        out = f"{out[:-1]}&#{ord(out[-1])};"
    return out


def _stripped(char: str) -> bool:
    """Whether ``char`` is whitespace a reader strips from a line's ends, and a character reference
    can carry (not C0 and C1 controls: a vertical tab at a paragraph's ends is lost)."""
    return char.isspace() and (char in " \t\f" or ord(char) > 0x9F)


def markdown_paragraphs(text: str) -> str:
    """A page's text (lines joined by ``\\n``, blocks by a blank line) as Markdown: each block one
    paragraph, its lines escaped by :func:`escape_markdown_line` and joined by ``\\n`` (a soft
    break), paragraphs separated by a blank line. Empty lines, which a paragraph cannot hold, are
    left out; so is a block without text."""
    blocks = (
        "\n".join(escape_markdown_line(line) for line in block.split("\n") if line) for block in text.split("\n\n")
    )
    return "\n\n".join(block for block in blocks if block)


def _escape_heading(text: str) -> str:
    """``text`` (one line) as the content of an ATX heading: escaped as a line, and a closing ``#``
    that the heading would drop."""
    out = escape_markdown_line(" ".join(text.splitlines()))
    return out[:-1] + "\\#" if out.endswith("#") else out
