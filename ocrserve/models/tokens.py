"""Output tokens of a text, estimated from its characters where the model's tokenizer is not local.

One ratio per script, for every estimate ocrserve makes (the planner's output-length model,
:mod:`ocrserve.gpu.lengths`; the bench's OCR-shaped lengths, :mod:`ocrserve.bench.forced_lengths`).
"""

from __future__ import annotations

import math

CHARS_PER_TOKEN = {"latin": 1 / 0.3, "cjk": 1 / 0.6}
"""Characters per token by script, from DeepSeek's API documentation, "Token & Token Usage"
(https://api-docs.deepseek.com/quick_start/token_usage): "1 English character ≈ 0.3 token, 1
Chinese character ≈ 0.6 token", for its ~128k-entry byte-level BPE vocabulary, the kind HunyuanOCR's
(~120k) and the Qwen2 family's (~150k) are; an estimate for them. "Latin" is every character
outside CJK scripts (digits, punctuation, whitespace, other alphabets), "CJK" kana, hangul,
ideographs and full-width forms (:func:`is_cjk`)."""


def is_cjk(char: str) -> bool:
    """Whether ``char`` belongs to a CJK script: CJK punctuation and kana (3000-30FF), ideographs
    (3400-4DBF, 4E00-9FFF, F900-FAFF, 20000-2FFFF), hangul syllables (AC00-D7AF) and full-width
    forms (FF00-FFEF)."""
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF
        or 0x3400 <= code <= 0x4DBF
        or 0x4E00 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x2FFFF
    )


def reply_tokens(text: str) -> int:
    """Tokens of ``text`` as a model's reply: CJK characters / :data:`CHARS_PER_TOKEN` ``cjk`` +
    the others / ``latin``, rounded up, plus the end token."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    return math.ceil(cjk / CHARS_PER_TOKEN["cjk"] + (len(text) - cjk) / CHARS_PER_TOKEN["latin"] - 1e-9) + 1


def describe() -> str:
    """The ratios, for a plan or a bench report."""
    return (
        f"{CHARS_PER_TOKEN['latin']:.2f} characters a token outside CJK scripts, {CHARS_PER_TOKEN['cjk']:.2f} in them "
        "(estimate: DeepSeek's API documentation, the model's tokenizer is not local)"
    )
