"""A page's seconds in the engine, predicted before it runs from what the preprocessor sees, and
learned from the pages that finish; admission estimates how long the work ahead of a request
will take from it.

A page's :class:`Work` is three figures known before the engine sees it: the page itself (a fixed
part: its transfers, the engine's work per request), the pixels the engine reads (the detector's
input for the embedded engine, which magnifies a narrow strip many times:
:meth:`~ocrserve.engines.base.Engine.input_pixels`; the page's pixels, and so its visual tokens,
for a VLM), and its *line units*, the text lines a detector finds on a small copy of the page,
each weighed as recognition weighs it (:mod:`ocrserve.preprocess.lines`), which recognition (or a
VLM's decoding) grows with. The model is linear in them, ``seconds = a + b x megapixels + c x
kilo-units`` (a request's work is the sum of its pages'), in shares of the engine's seconds
(:class:`ShareClock`), fitted by exponentially weighted least squares over recent pages (the
newest weighs :data:`FIT_WEIGHT`), every coefficient kept at 0 or above, and drawn towards the
prior ``(initial_s, 0, 0)`` by a ridge of :data:`PRIOR_WEIGHT` pages. Measured on the development
half of ``../shared/corpus`` (embedded engine, 2 cores, one page at a time, 2026-12-05, the
engine's own stage timings): detection 0.3-0.4 s a megapixel of the detector's input (0.20 s for
a 640 x 480 page, 0.73 Mpx there; 1.44 s for the 56 x 392 px strip ``ocrmypdf/crom.png``,
magnified to 3.79 Mpx and detected twice), recognition 2.6-2.8 ms a line unit.

Admission does not trust the mean alone (:meth:`ServiceTime.upper_factor`): each finished page's
seconds over what the model predicted for it before it finished are kept (the last
:data:`RATIOS_KEPT`; none for the first :data:`FIT_PAGES`, whose predictions are the prior's or an
underdetermined fit's and say nothing of how far the fit is off), and estimates are multiplied by
their :data:`UPPER_QUANTILE` quantile, drawn towards their centre (:meth:`ServiceTime.centre`) for many pages
together (their centre, and at least a margin for what the model has not seen until
:data:`ENOUGH_PAGES` have been kept: :data:`UNSEEN_FACTOR` before the first, then their centre
times a factor narrowing from it with their number): wide while the model knows little,
tightening as evidence comes, and widening again when recent pages run slower than predicted (a
busy machine, pages of a kind it has not seen).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ocrserve.quantiles import nearest_rank, pseudo_median

#: Weight of the newest page in the fit (about the last 1 / FIT_WEIGHT pages count).
FIT_WEIGHT = 0.05
#: How many pages' worth the prior ``(initial_s, 0, 0)`` weighs in the fit (a ridge towards it):
#: enough to keep the fit defined after one page, too little to move a fit of three pages. At 0.05
#: it drew the calibration pages' fit (2026-12-05, 2 cores: the strip 1.79 Mpx at the detector and
#: 16 line units in 0.70 s, the full letter page 0.97 Mpx and 803 units in 2.66 s, the letter page
#: of one line 0.97 Mpx and 21 units in 0.31 s) to (0.36 s, 0.14 s/Mpx, 2.48 s/kilo-unit), which
#: priced the development half of ``../shared/corpus`` at 0.46-1.62 times its seconds (strips
#: under, near-blank pages over); at 0.001 the fit is (0, 0.34, 2.89), as the engine's own stage
#: timings have it (detection 0.3-0.4 s a megapixel, recognition 2.6-2.8 ms a unit), and the same
#: pages ran 0.73-1.27 times their prediction.
PRIOR_WEIGHT = 0.001
#: Pages measured before their predictions count as the fit's: one per feature (a fit of fewer is
#: underdetermined, and the prior's ``initial_s`` can be off many times over).
FIT_PAGES = 3
#: Ratios of actual to predicted seconds kept for :meth:`ServiceTime.upper_factor`.
RATIOS_KEPT = 64
#: The quantile of those ratios admission multiplies its estimates by.
UPPER_QUANTILE = 0.9
#: The newest ratios whose centre the ratios' centre is kept at or above
#: (:meth:`ServiceTime.centre`).
NEWEST_RATIOS = 8
#: Pages to see before the ratios alone set the factor (the 0.9 quantile of fewer is one of the
#: largest few, which says little).
ENOUGH_PAGES = 16
#: The factor before any ratio has been kept, narrowing towards their centre as ratios are
#: (:meth:`ServiceTime.prior_margin`): nothing yet says how far the calibration pages' fit is off
#: for the pages clients send. Measured on the development half of ``../shared/corpus``
#: (2026-12-05, 2 cores, one page at a time on a fresh engine, priced by the three calibration pages
#: alone): its pages ran 0.73-1.27 times their prediction, the most the turned pages, whose
#: orientation the engine confirms by recognizing lines both ways up (1.25 and 1.27), then the strips
#: the engine detects a second time (1.12, 1.16). Before the fit's ridge was narrowed (see
#: :data:`PRIOR_WEIGHT`) those strips ran 1.6 times it and this factor was 2; priced by
#: character-sized blobs of ink instead of lines, 4. At 1.3, just over the development pages' most,
#: a fresh gateway on a quiet machine admitted five 2-page documents of a noisy held-out form
#: scanned at 150 and 100 dpi (``funsd_82253362_3364.png``), and the fifth was answered 504: pages
#: the calibration fit has not seen can run further over it than the development pages did.
UNSEEN_FACTOR = 1.5
#: Units of the features: megapixels and thousands of line units keep the fit's numbers near 1.
MEGAPIXEL, KILO_UNITS = 1e6, 1e3


@dataclass(frozen=True)
class Work:
    """What pages ask of the engine; sums over pages, so a request's work is its pages' sum.

    Attributes:
        pages: how many pages.
        pixels: the pixels the engine reads for them (:meth:`~ocrserve.engines.base.Engine.input_pixels`).
        units: their line units (:mod:`ocrserve.preprocess.lines`), counted or, for pages not
            previewed, expected.
    """

    pages: float = 0.0
    pixels: float = 0.0
    units: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.pages + other.pages, self.pixels + other.pixels, self.units + other.units)

    def __sub__(self, other: Work) -> Work:
        return Work(self.pages - other.pages, self.pixels - other.pixels, self.units - other.units)

    def scaled(self, factor: float) -> Work:
        """This work times ``factor`` (a share of a request's pages: ``1 / pages``)."""
        return Work(self.pages * factor, self.pixels * factor, self.units * factor)

    def features(self) -> np.ndarray:
        """``(pages, megapixels, kilo-units)``: the model's inputs."""
        return np.array([self.pages, self.pixels / MEGAPIXEL, self.units / KILO_UNITS])


NO_WORK = Work()


class ShareClock:
    """The engine's time as each page in it sees it: seconds over the pages in the engine,
    ``integral of dt / n(t)`` (processor sharing). A page's *share* is how far the clock moved
    while it was in the engine: its wall seconds on an idle engine, a quarter of them beside three
    others on an engine that runs pages side by side only by sharing its cores (the embedded
    engine on a CPU), less where the engine batches pages (vLLM). Shares add up to the engine's
    busy time, so the seconds until a queue has drained are the sum of its pages' shares, however
    many pages the engine holds at once; a page's wall seconds alone would count pages timed on
    an idle engine (the calibration pages, a quiet hour) as if they ran that fast side by side.

    The clock has a reading for each engine class (:class:`Readings`). Where the engine runs
    background pages behind interactive ones (``background_share`` set: the embedded engine's
    background sessions under SCHED_IDLE), interactive pages split ``1 - background_share`` of
    each second while background pages are in it too, and the background pages split the rest;
    with pages of one class only, or without ``background_share``, every page gets an equal
    share. Counted as equal shares, a flood's background pages beside a single page every 0.5 s
    were charged 5 to 6 times their seconds (a turned page of 0.76 Mpx that takes 2.6 s alone:
    8.9 s, in 22.8 s of wall time), and the single pages 0.6 times theirs.

    There, too, each thread at a normal priority that runs beside the background pages
    (:meth:`pre_empting`: the gateway counting a request's line units) takes a core of the
    machine's ``cores`` from them while it runs. Measured (2026-12-05, 2 cores, the embedded engine
    alone, a phototest page as a background page, a counting thread at nice 10 counting back to
    back): 0.84 s a page beside it against 0.83 s alone on a quiet machine (a core free for it), and
    51.4 s against 0.83 s beside a CPU hog (none free). Uncounted, a burst of 2-page receipts beside
    a hog had its first pages charged 6.9 and 8.3 s against 2.8 s predicted while the burst was
    counted, and admission read that as a machine 1.5 to 1.8 times slower and refused a third of
    the burst; one core of two is what a count takes where the background pages fill both.
    """

    def __init__(self, background_share: float | None = None, cores: int | None = None):
        self.background_share = background_share
        self.cores = cores or os.cpu_count() or 1  # as the preprocessor sizes its counting threads
        self._readings = [0.0, 0.0]  # interactive pages', background pages'
        self._pages = [0, 0]
        self._pre_empting = 0
        self._at = time.monotonic()

    @property
    def pages(self) -> int:
        """Pages in the engine now."""
        return sum(self._pages)

    def now(self) -> Readings:
        """The clock's readings now."""
        at = time.monotonic()
        elapsed, self._at = at - self._at, at
        interactive, background = self._pages
        if self.background_share is not None and interactive and background:
            self._readings[0] += elapsed * (1 - self.background_share) / interactive
            self._readings[1] += elapsed * self.background_share * self._kept() / background
        else:  # one class, or equal shares; background pages alone keep what pre-empting threads leave
            kept = self._kept() if self.background_share is not None and background else 1.0
            self._readings = [reading + elapsed * kept / max(1, interactive + background) for reading in self._readings]
        return Readings(*self._readings)

    def _kept(self) -> float:
        """The share of the engine background pages keep beside the threads :meth:`pre_empting` them."""
        return max(0.0, 1.0 - self._pre_empting / self.cores)

    @contextmanager
    def pre_empting(self) -> Iterator[None]:
        """While inside, a thread at a normal priority runs beside the engine and takes a core from
        its background pages (where ``background_share`` is set; class docstring)."""
        self.now()
        self._pre_empting += 1
        try:
            yield
        finally:
            self.now()
            self._pre_empting -= 1

    def enter(self, interactive: bool) -> float:
        """A page entered the engine (an ``interactive`` one, else a background one); returns its
        class's reading when it entered."""
        reading = self.now().of(interactive)
        self._pages[0 if interactive else 1] += 1
        return reading

    def leave(self, entered: float, interactive: bool) -> float:
        """A page of that class that entered at reading ``entered`` left; returns its share, seconds."""
        share = self.now().of(interactive) - entered
        self._pages[0 if interactive else 1] -= 1
        return share


class Readings(NamedTuple):
    """The :class:`ShareClock`'s readings, seconds: the interactive pages' and the background pages'."""

    interactive: float
    background: float

    def of(self, interactive: bool) -> float:
        """The reading of a page's class (``interactive``, else background)."""
        return self.interactive if interactive else self.background

    def earliest(self, other: Readings) -> Readings:
        """Each class's earlier reading of the two."""
        return Readings(min(self.interactive, other.interactive), min(self.background, other.background))


class ServiceTime:
    """``seconds = a x pages + b x megapixels + c x kilo-units`` in the engine (module docstring).

    Args:
        initial_s: a page's seconds until pages have been measured (``router.initial_page_s``):
            the prior ``a``.
    """

    def __init__(self, initial_s: float):
        self.initial_s = initial_s
        self.measured = 0
        self._xx = np.zeros((3, 3))  # weighted sums of x x^T and x y
        self._xy = np.zeros(3)
        self._coefficients = np.array([initial_s, 0.0, 0.0])
        self.ratios: deque[float] = deque(maxlen=RATIOS_KEPT)  # actual / predicted seconds, newest last

    def record(self, work: Work, seconds: float) -> None:
        """One page of ``work`` (``pages`` 1) took ``seconds`` in the engine."""
        if self.measured >= FIT_PAGES:
            self.ratios.append(seconds / self.seconds(work))
        x = work.features()
        keep = 1 - FIT_WEIGHT if self.measured else 0.0
        self._xx = keep * self._xx + np.outer(x, x)
        self._xy = keep * self._xy + x * seconds
        self.measured += 1
        self._coefficients = self._fit()

    def _fit(self) -> np.ndarray:
        """The ridge least-squares coefficients, a feature whose coefficient comes out negative
        dropped (set to 0) and the rest fitted again without it."""
        prior = np.array([self.initial_s, 0.0, 0.0])
        free = [0, 1, 2]
        while True:
            xx = self._xx[np.ix_(free, free)] + PRIOR_WEIGHT * np.eye(len(free))
            solved = np.linalg.solve(xx, self._xy[free] + PRIOR_WEIGHT * prior[free])
            if (solved >= 0).all() or len(free) == 1:
                coefficients = np.zeros(3)
                coefficients[free] = np.maximum(solved, 0.0)
                return coefficients
            free = [f for f, c in zip(free, solved, strict=True) if c >= 0] or [0]

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """``(a, b, c)``: seconds per page, per megapixel, per thousand line units."""
        a, b, c = self._coefficients
        return float(a), float(b), float(c)

    def seconds(self, work: Work) -> float:
        """Seconds in the engine of ``work`` (one page or many, one after another); at least a
        millisecond a page."""
        return max(float(self._coefficients @ work.features()), 1e-3 * work.pages)

    def over_run(self, pages: float = 1.0) -> float:
        """How far ``pages`` pages together run over their prediction, from the recent actual /
        predicted ratios, at least 1 (1 before any): their centre (the pseudo-median,
        :func:`~ocrserve.quantiles.pseudo_median`), and once there are :data:`ENOUGH_PAGES`, the
        :data:`UPPER_QUANTILE` quantile's distance above it over ``sqrt(pages)``. What moves every
        page (a busy machine, pages of a kind the fit has not learned) moves the centre; what is
        one page's own (its text, how long it shared the engine's cores with which others) averages
        out over a sum of pages, whose spread shrinks as ``1 / sqrt(pages)`` (the central limit
        theorem), so one page's quantile would price the 20 pages ahead of a request as if each ran
        late. The 0.9 quantile of fewer ratios is the largest or the next: on the corpus, one dense
        page among the first light ones ran 9.1 times over a fit that had seen no dense text, the
        fit then learned it (the next four within 0.77-1.15), and that one page held a fresh
        gateway's bounds at 9 times its estimates.

        The centre is the pseudo-median rather than the median because two pages in the engine
        together split its seconds unevenly (the one whose lines are recognized first finishes
        first): on receipts beside a CPU hog (2026-12-05, 2 cores) the ratios alternated 0.54 and
        1.29, and one page more moved their median from 0.88 to 1.21, which turned the margin from
        1.14 to 1.37 and refused a document that the engine would have finished in time."""
        if not self.ratios:
            return 1.0
        centre = self.centre()
        if len(self.ratios) < ENOUGH_PAGES:
            return max(1.0, centre)
        upper = nearest_rank(sorted(self.ratios), UPPER_QUANTILE)
        return max(1.0, centre + max(0.0, upper - centre) / math.sqrt(max(1.0, pages)))

    def centre(self) -> float:
        """Where the kept ratios of actual to predicted seconds centre (1 with none): their
        pseudo-median (:func:`~ocrserve.quantiles.pseudo_median`), or the newest
        :data:`NEWEST_RATIOS` ratios' where higher, so a change that makes pages run slower (a
        kind of page the fit has not learned, a machine that got busier) moves it within a few
        pages rather than after a third of the kept ones. On scans at several dpi on a fresh
        gateway, a quiet machine, the first pages ran near their prediction and held the centre
        there while the next ones ran 1.3 to 1.6 times theirs, and a client that retried after
        its first refusal was admitted on that centre and answered after its timeout. Never
        lower than all kept ratios' centre: a few pages running faster say less of the next than
        a few running slower, whose cost a late answer pays."""
        if not self.ratios:
            return 1.0
        newest = list(self.ratios)[-NEWEST_RATIOS:]
        return max(pseudo_median(self.ratios), pseudo_median(newest))

    @property
    def warming(self) -> bool:
        """Whether fewer than :data:`ENOUGH_PAGES` ratios were kept: :meth:`prior_margin` is above 1."""
        return len(self.ratios) < ENOUGH_PAGES

    def prior_margin(self) -> float:
        """The margin for what the model has not seen: while :attr:`warming`, with ``n`` ratios
        kept, their centre (pseudo-median; at least 1, 1 with none) times
        ``1 + (UNSEEN_FACTOR - 1) / sqrt(n + 1)``:
        :data:`UNSEEN_FACTOR` before any, narrowing as pages come; then 1 (the ratios' own
        quantile takes over).

        The centre of ``n`` ratios is off by about their spread over ``sqrt(n)`` (the standard
        error of an estimate from ``n`` samples); until enough have been kept to measure that
        spread it is taken as the calibration fit's own (:data:`UNSEEN_FACTOR` - 1), with the
        calibration counted as one measurement more (``n + 1``). A flat margin until :data:`ENOUGH_PAGES`
        had been kept admitted 1 of 12 2-page documents of scans after 30 s of the same documents,
        where the engine alone would finish 3. A margin shrinking to 1 over those pages whatever
        the ratios said let a 2-page document of scans in at 1.6 after six pages, on a machine with
        a core kept busy, and it was answered after its client's timeout; here the centre carries
        such a machine's over-run."""
        if not self.warming:
            return 1.0
        return max(1.0, self.centre()) * (1.0 + (UNSEEN_FACTOR - 1.0) / math.sqrt(len(self.ratios) + 1))

    def upper_factor(self, pages: float = 1.0) -> float:
        """What admission multiplies an estimate of ``pages`` pages by (module docstring):
        :meth:`over_run`, and at least :meth:`prior_margin`."""
        return max(self.prior_margin(), self.over_run(pages))
