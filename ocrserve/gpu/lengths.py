"""The output-length model: how many tokens a page's reply takes, as a distribution.

The planner used to size ``--max-num-seqs`` as if every page ran to ``max_tokens``; real pages stop
far earlier. :class:`OutputLengths` is a sample of output tokens per page, from one of three
places, and says which (``source``, ``kind``):

* ``report``: an ``ocrserve bench`` report (``report.json``): the completion tokens vLLM reported
  for each page (``usage.completion_tokens`` of the streamed reply, kept per point as
  ``completion_tokens``); the lengths the deployment really produced, runaway pages included.
* ``corpus``: a corpus's ground truth (``index.json`` with ``gt`` files, as ``../shared/corpus``),
  counted in tokens with a characters-per-token ratio per script
  (:data:`ocrserve.models.tokens.CHARS_PER_TOKEN`), since the model's tokenizer is not local, plus
  the end token. Ground truth never loops, so a corpus sample has no runaway
  page; the prior's runaway share is added to it (:meth:`OutputLengths.with_runaway`).
* ``prior``: the registry's prior per model and task (``output_tokens`` in the entry, cited), or
  :data:`DEFAULT_PRIOR` (an estimate) where the entry has none: a log-normal through the median and
  the 95th percentile, plus a share of pages that loop to ``max_tokens``.

Every draw is a whole number of tokens in ``[1, max_tokens]``: a page is never cut shorter than it
is (``max_tokens`` stays the full output budget).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ocrserve.models.tokens import describe, reply_tokens

PRIOR_POINTS = 400
"""Quantiles a prior's log-normal is drawn at (an even grid of probabilities)."""
DEFAULT_PRIOR = {
    "text": {"median": 900, "p95": 2000},
    "markdown": {"median": 1200, "p95": 2600},
    "table": {"median": 1500, "p95": 3500},
    "runaway": 0.002,
}
"""Prior for a model whose registry entry has no ``output_tokens``, estimate: a dense A4 page holds
~4,000-6,000 characters, ~1,500-2,000 tokens (the planner's p95 figure); markup adds tags. The
runaway share is the pages whose greedy decoding loops to ``max_tokens`` (HunyuanOCR's card ships
a clean-up for exactly that, ``clean_repeated_substrings``)."""


class LengthsError(ValueError):
    """An output-length source that cannot be read or holds no lengths."""


@dataclass(frozen=True)
class OutputLengths:
    """Output tokens per page, as an empirical sample.

    Attributes:
        samples: tokens of each page (each in ``[1, max_tokens]`` once :meth:`clipped`).
        kind: ``"report"``, ``"corpus"`` or ``"prior"``.
        source: where they come from, for the plan (a path, or the registry citation).
        runaway: share of pages that run to ``max_tokens`` on top of ``samples`` (0 for a report,
            whose samples already hold them).
    """

    samples: tuple[int, ...]
    kind: str
    source: str
    runaway: float = 0.0

    def __post_init__(self) -> None:
        if not self.samples:
            raise LengthsError(f"{self.source}: no output lengths")
        if not 0 <= self.runaway < 1:
            raise LengthsError(f"runaway share must be in [0, 1), got {self.runaway}")

    def distribution(self, max_tokens: int) -> dict[int, float]:
        """Output tokens -> probability, every length clipped to ``[1, max_tokens]``, the runaway
        share at ``max_tokens``."""
        weight = (1 - self.runaway) / len(self.samples)
        pmf: dict[int, float] = {}
        for n in self.samples:
            key = min(max(1, int(n)), max_tokens)
            pmf[key] = pmf.get(key, 0.0) + weight
        if self.runaway:
            pmf[max_tokens] = pmf.get(max_tokens, 0.0) + self.runaway
        return pmf

    def mean(self, max_tokens: int) -> float:
        """Mean output tokens per page (clipped, runaway share included)."""
        return sum(n * p for n, p in self.distribution(max_tokens).items())

    def quantile(self, q: float, max_tokens: int) -> int:
        """The ``q``-quantile (0-1) of output tokens per page."""
        total = 0.0
        for n, p in sorted(self.distribution(max_tokens).items()):
            total += p
            if total >= q - 1e-12:
                return n
        return max_tokens

    def with_runaway(self, share: float) -> OutputLengths:
        """The same sample with ``share`` of pages running to ``max_tokens``."""
        return OutputLengths(self.samples, self.kind, self.source, share)

    def describe(self, max_tokens: int) -> str:
        """One line for the plan: where from, how many, median / p95 / mean, runaway share."""
        runaway = f", {self.runaway:.2%} run to max_tokens" if self.runaway else ""
        return (
            f"{self.kind}: {self.source} ({len(self.samples)} page(s); median {self.quantile(0.5, max_tokens)}, "
            f"p95 {self.quantile(0.95, max_tokens)}, mean {self.mean(max_tokens):.0f} tokens{runaway})"
        )


def from_corpus(folder: Path | str) -> OutputLengths:
    """Lengths from a corpus's ground truth: ``folder/index.json`` lists documents, each with
    ``gt`` files (relative to ``folder``); every ``.gt.txt`` is one page's text, a form feed
    (``\\f``) separates pages within one. Files that are not ``.txt`` (zone files) are skipped.

    Raises:
        LengthsError: no ``index.json``, not a list of documents, or no ground-truth text at all.
    """
    root = Path(folder)
    index = root / "index.json"
    try:
        entries = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LengthsError(f"{index}: cannot read a corpus index: {exc}") from None
    if not isinstance(entries, list):
        raise LengthsError(f"{index}: a corpus index is a list of documents")
    samples = []
    for entry in entries:
        for name in entry.get("gt") or () if isinstance(entry, dict) else ():
            if not str(name).endswith(".txt"):
                continue
            try:
                text = (root / name).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            samples += [reply_tokens(page) for page in text.split("\f") if page.strip()]
    if not samples:
        raise LengthsError(f"{index}: no ground-truth text (.gt.txt) found")
    return OutputLengths(
        tuple(samples),
        "corpus",
        f"{root} ground truth, {describe()}, plus the end token",
    )


def from_report(path: Path | str) -> OutputLengths:
    """Lengths from an ``ocrserve bench`` report: every point's ``completion_tokens`` (one per page
    whose reply vLLM reported usage for). ``path`` is ``report.json`` or its folder.

    Raises:
        LengthsError: unreadable, or no point holds completion tokens (a report from before they
            were kept, or from an engine that does not report them).
    """
    file = Path(path)
    if file.is_dir():
        file = file / "report.json"
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LengthsError(f"{file}: cannot read a bench report: {exc}") from None
    points = report.get("points") if isinstance(report, dict) else None
    samples = [int(n) for p in points or () if isinstance(p, dict) for n in p.get("completion_tokens") or ()]
    if not samples:
        raise LengthsError(
            f"{file}: no completion_tokens in its points (the bench keeps them where vLLM reports usage); "
            "use a corpus folder or the registry's prior"
        )
    return OutputLengths(tuple(samples), "report", f"{file} (completion tokens vLLM reported)")


def load(path: Path | str) -> OutputLengths:
    """``--output-lengths``: a bench report (``report.json`` or a folder holding one) or a corpus
    folder (holding ``index.json``).

    Raises:
        LengthsError: neither.
    """
    where = Path(path)
    if where.is_file() or (where / "report.json").is_file():
        return from_report(where)
    if (where / "index.json").is_file():
        return from_corpus(where)
    raise LengthsError(f"{where}: neither a bench report (report.json) nor a corpus folder (index.json)")


def prior(model_id: str, task: str, output_tokens: Mapping | None, source: str = "") -> OutputLengths:
    """The prior for ``task``: a log-normal through the task's ``median`` and ``p95`` drawn at
    :data:`PRIOR_POINTS` quantiles, with the ``runaway`` share; from the registry entry's
    ``output_tokens`` (cited by ``source``) or :data:`DEFAULT_PRIOR` (an estimate)."""
    figures = output_tokens or DEFAULT_PRIOR
    where = source if output_tokens else "ocrserve's default prior (estimate: DEFAULT_PRIOR)"
    task_figures = figures.get(task) or figures.get("text") or DEFAULT_PRIOR["text"]
    median, p95 = float(task_figures["median"]), float(task_figures["p95"])
    sigma = math.log(p95 / median) / statistics.NormalDist().inv_cdf(0.95)
    normal = statistics.NormalDist(math.log(median), sigma)
    samples = tuple(max(1, round(math.exp(normal.inv_cdf((i + 0.5) / PRIOR_POINTS)))) for i in range(PRIOR_POINTS))
    return OutputLengths(
        samples,
        "prior",
        f"{model_id} {task}: log-normal median {median:g}, p95 {p95:g} [{where}]",
        float(figures.get("runaway", 0.0)),
    )
