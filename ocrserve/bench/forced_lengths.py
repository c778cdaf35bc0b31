"""OCR-shaped output lengths for a model that never stops by itself (bench tooling, not the gateway).

A random-weight test model (``tests/tiny_hunyuan.py``) decodes until ``max_tokens``, so a load test
against it measures pages of the longest possible reply. To shape the load like OCR, each request
is ended after a length drawn from the real output lengths of a corpus: the token count of each
page's ground truth (``NAME.gt.txt``, pages split at form feeds, as ``../shared/corpus`` keeps them).

The real tokenizer is not local, so tokens are estimated from characters, at the ratios of
:data:`ocrserve.models.tokens.CHARS_PER_TOKEN` (:func:`ocrserve.models.tokens.reply_tokens`).

:class:`ForcedEnd` is the per-batch state of vLLM's logits processor
:class:`ocrserve.bench.vllm_lengths.ForcedLengths` (loaded into ``vllm serve`` with
``--logits-processors``): it draws a length for each request vLLM adds to its batch, masks the end
token until then and forces it at that length. It imports nothing of vLLM, so it runs in tests.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from ocrserve.models.tokens import describe, reply_tokens

#: The lengths file (JSON: a list of token counts, or an object with ``lengths``) the processor reads.
LENGTHS_ENV = "OCRBENCH_OUTPUT_LENGTHS"
#: The seed of its draws (default 0).
SEED_ENV = "OCRBENCH_OUTPUT_SEED"
#: Partial ground truth (facts or headings only) says nothing of a page's length.
PARTIAL = "partial"


def corpus_output_lengths(corpus: Path) -> list[dict]:
    """One entry per page with ground truth in ``corpus`` (``index.json``'s documents whose
    ``gt_quality`` is not partial, else every ``*.gt.txt`` below it): ``file``, ``page`` (from 1),
    ``chars`` and ``tokens`` (:func:`ocrserve.models.tokens.reply_tokens`). Blank pages are skipped."""
    index = corpus / "index.json"
    if index.is_file():
        entries = json.loads(index.read_text(encoding="utf-8"))
        names = [e["file"] for e in entries if not str(e.get("gt_quality", "")).startswith(PARTIAL)]
        truths = [(name, corpus / (name.rsplit(".", 1)[0] + ".gt.txt")) for name in names]
    else:
        truths = [(str(p.relative_to(corpus)), p) for p in sorted(corpus.rglob("*.gt.txt"))]
    rows = []
    for name, path in truths:
        if not path.is_file():
            continue
        for number, page in enumerate(path.read_text(encoding="utf-8").split("\f"), 1):
            if page.strip():
                rows.append({"file": name, "page": number, "chars": len(page), "tokens": reply_tokens(page)})
    return rows


def read_lengths(path: str | Path) -> list[int]:
    """The token counts of a lengths file: a JSON list of numbers, or an object whose ``lengths`` is
    one (what ``scripts/bench_vllm_cpu.py`` writes).

    Raises:
        ValueError: no lengths, or one below 1.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    lengths = [int(n) for n in (data["lengths"] if isinstance(data, dict) else data)]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"{path}: output lengths must be a non-empty list of counts >= 1")
    return lengths


class LengthSampler:
    """Lengths drawn uniformly, with replacement, from ``lengths`` by a ``random.Random(seed)``: the
    same seed gives the same sequence, so each run of a sweep sees the same lengths in arrival order."""

    def __init__(self, lengths: Sequence[int], seed: int = 0):
        if not lengths or min(lengths) < 1:
            raise ValueError("output lengths must be a non-empty list of counts >= 1")
        self.lengths = list(lengths)
        self.seed = seed
        self._rng = random.Random(seed)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LengthSampler:
        """From :data:`LENGTHS_ENV` (required) and :data:`SEED_ENV`.

        Raises:
            RuntimeError: :data:`LENGTHS_ENV` is not set.
        """
        env = os.environ if environ is None else environ
        path = env.get(LENGTHS_ENV)
        if not path:
            raise RuntimeError(f"{LENGTHS_ENV} must name a lengths file (JSON list of output token counts)")
        return cls(read_lengths(path), int(env.get(SEED_ENV) or 0))

    def draw(self) -> int:
        return self._rng.choice(self.lengths)

    def describe(self) -> str:
        mean = sum(self.lengths) / len(self.lengths)
        return (
            f"{len(self.lengths)} output lengths (mean {mean:.0f}, {min(self.lengths)}..{max(self.lengths)} tokens), "
            f"seed {self.seed}"
        )


class ForcedEnd:
    """Which request sits at which batch row, with its drawn length and its growing output.

    :meth:`update` follows vLLM v1's ``BatchUpdate`` (removed, then added ``(index, params,
    prompt_ids, output_ids)``, then moved ``(i1, i2, directionality)``; a ``SWAP`` exchanges the rows,
    otherwise i1's request moves to i2); :meth:`apply` masks each row's end token while its output
    is shorter than its length - 1 and forces it at length - 1, so every reply is exactly its length
    in tokens, the end token included.

    Args:
        sampler: where each added request's length comes from.
        eos: the end token when a request's sampling parameters do not name one.
    """

    def __init__(self, sampler: LengthSampler, eos: int | None = None):
        self.sampler = sampler
        self.eos = eos
        self.rows: dict[int, tuple[int, int, Sequence[int]]] = {}  # row -> (length, end token, output ids)
        self.drawn: list[int] = []

    def update(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            eos = getattr(params, "eos_token_id", None)
            if eos is None:
                stops = getattr(params, "all_stop_token_ids", None) or ()
                eos = min(stops) if stops else self.eos
            if eos is None:
                self.rows.pop(index, None)
                continue
            length = self.sampler.draw()
            self.drawn.append(length)
            self.rows[index] = (length, eos, output)
        for first, second, direction in batch_update.moved:
            a, b = self.rows.pop(first, None), self.rows.pop(second, None)
            if getattr(direction, "name", str(direction)).endswith("SWAP") and b is not None:
                self.rows[first] = b
            if a is not None:
                self.rows[second] = a

    def apply(self, logits):
        """``logits`` (rows x vocabulary) with each tracked row's end token masked or forced, in place."""
        for index, (length, eos, output) in self.rows.items():
            if index >= logits.shape[0]:
                continue
            row = logits[index]
            if len(output) + 1 >= length:
                row.fill_(-math.inf)
                row[eos] = 0.0
            else:
                row[eos] = -math.inf
        return logits


def write_lengths(path: Path, rows: Iterable[dict]) -> list[int]:
    """Write a lengths file from :func:`corpus_output_lengths` rows (the lengths, the ratio and the
    pages they came from); return the lengths."""
    rows = list(rows)
    lengths = [r["tokens"] for r in rows]
    path.write_text(
        json.dumps({"tokens": describe(), "lengths": lengths, "pages": rows}, indent=1),
        encoding="utf-8",
    )
    return lengths
