"""Generated multi-column pages with a known reading order: a test set nobody tuned on (issue 35).

Each page is set from public-domain text (``texts/founding.txt``: the Declaration of
Independence, 1776, the Constitution of the United States, 1787, and the Gettysburg Address,
1863; works of the United States government, in the public domain) in the DejaVu or Liberation
fonts Debian installs (``fonts-dejavu-core``, ``fonts-liberation``), on a US-letter page at
150 dpi (1275 x 1650 pixels). What a page holds is drawn from a seed, so a set is the same on every
machine: :func:`page_set` with one seed is the development set, with another the held-out set.

Layout kinds (:data:`KINDS`), and the reading order their ground truth follows:

* ``two_columns``, ``three_columns``: text flowing down each column in turn, the last column
  shorter (unequal heights); on some two-column pages a picture with its caption inside a column.
* ``headline``: a headline spanning the columns close above them, and a byline; then the columns.
* ``figure``: a headline, then a picture spanning all columns or the first two of three, its
  caption under it; read headline, caption, then the columns left to right.
* ``pull_quote``: two columns, a quotation in larger italics between rules inside one column,
  read where it stands in its column.
* ``footnotes``: two columns of unequal height, then full-width footnotes in smaller type under a
  rule, read last.
* ``skewed``: a ``headline``, ``figure`` or ``footnotes`` page as a grey scan: turned 1.5 to 4
  degrees either way, blurred and speckled.

The ground truth is the page's lines in reading order, one a line, blocks separated by blank lines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

#: The layout kinds a set holds, in report order.
KINDS = ("two_columns", "three_columns", "headline", "figure", "pull_quote", "footnotes", "skewed")
#: US letter at 150 dpi, pixels.
PAGE_SIZE = (1275, 1650)
#: Page margin, pixels (0.6 inch at 150 dpi).
MARGIN = 90
#: Where Debian's font packages put their files.
FONT_DIR = Path("/usr/share/fonts/truetype")
#: Font files per family and style (``fonts-liberation``, ``fonts-dejavu-core``).
FONTS = {
    "liberation": {
        "body": "liberation/LiberationSerif-Regular.ttf",
        "italic": "liberation/LiberationSerif-Italic.ttf",
        "head": "liberation/LiberationSans-Bold.ttf",
    },
    "dejavu": {
        "body": "dejavu/DejaVuSerif.ttf",
        "italic": "dejavu/DejaVuSerif-Italic.ttf",
        "head": "dejavu/DejaVuSans-Bold.ttf",
    },
}
INK = (20, 20, 20)
#: Marks a paragraph's end among the words being set.
PARAGRAPH = "\u00b6"


@dataclass(frozen=True)
class GeneratedPage:
    """One generated page.

    Attributes:
        kind: its layout kind (:data:`KINDS`).
        name: ``{kind}-{seed}-{number}``, unique within a set.
        image: the RGB page, :data:`PAGE_SIZE` (``skewed``: somewhat larger, turned).
        text: the ground truth: lines in reading order, blocks separated by blank lines.
    """

    kind: str
    name: str
    image: Image.Image
    text: str


def page_set(seed: int, per_kind: int) -> list[GeneratedPage]:
    """``per_kind`` pages of each of :data:`KINDS` drawn from ``seed``, kind by kind.

    Raises:
        FileNotFoundError: the fonts are missing (``apt-get install fonts-dejavu-core fonts-liberation``).
    """
    return [generate(kind, seed, number) for kind in KINDS for number in range(per_kind)]


def generate(kind: str, seed: int, number: int = 0) -> GeneratedPage:
    """Page ``number`` of ``kind`` drawn from ``seed`` (module docstring).

    Raises:
        ValueError: an unknown ``kind``.
        FileNotFoundError: the fonts are missing (``apt-get install fonts-dejavu-core fonts-liberation``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rng = random.Random(f"{seed}:{kind}:{number}")  # a str seed is hashed with SHA-512: the same everywhere
    setter = _Setter(rng)
    if kind == "skewed":
        getattr(setter, rng.choice(("headline", "figure", "footnotes")))()
        image = _scanned(setter.image, rng)
    else:
        getattr(setter, kind)()
        image = setter.image
    text = "\n\n".join("\n".join(block) for block in [*setter.blocks, setter.footer] if block)
    return GeneratedPage(kind, f"{kind}-{seed}-{number}", image, text)


def _font(family: str, style: str, size: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / FONTS[family][style]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: apt-get install fonts-dejavu-core fonts-liberation")
    return ImageFont.truetype(str(path), size)


def _paragraphs() -> list[str]:
    return [p.strip() for p in resources.files(__package__).joinpath("texts/founding.txt").read_text().split("\n\n")]


class _Setter:
    """Sets one page: type sizes, text and columns drawn from ``rng``; ``blocks`` the ground truth."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.image = Image.new("RGB", PAGE_SIZE, "white")
        self.draw = ImageDraw.Draw(self.image)
        self.blocks: list[list[str]] = []
        self.footer: list[str] = []  # the page number at the foot, read last
        family = rng.choice(sorted(FONTS))
        self.size = rng.randint(19, 23)
        self.body = _font(family, "body", self.size)
        self.italic = _font(family, "italic", self.size)
        self.small = _font(family, "body", round(self.size * 0.78))
        self.quote = _font(family, "italic", round(self.size * 1.4))
        self.head = _font(family, "head", rng.randint(40, 56))
        self.family = family
        self.leading = round(self.size * rng.uniform(1.2, 1.45))
        self.justified = rng.random() < 0.6
        self.indented = rng.random() < 0.5  # paragraphs by a first-line indent, else by a little space
        self.ruled = rng.random() < 0.3  # a vertical rule in each gutter
        paragraphs = _paragraphs()
        start = rng.randrange(len(paragraphs))
        self.text = paragraphs[start:] + paragraphs[:start]
        self.words = f" {PARAGRAPH} ".join(self.text).split()
        self.at = 0
        self.top = MARGIN
        self.left, self.right, self.bottom = MARGIN, PAGE_SIZE[0] - MARGIN, PAGE_SIZE[1] - MARGIN
        if rng.random() < 0.5:
            self._running_head()

    # layout kinds

    def two_columns(self) -> None:
        columns = self._columns(2, self.top, self.bottom)
        figure = self.rng.random() < 0.5
        self._flow(columns, fill=self.rng.uniform(0.6, 0.9), figure_in=1 if figure else None)

    def three_columns(self) -> None:
        self._flow(self._columns(3, self.top, self.bottom), fill=self.rng.uniform(0.7, 0.92))

    def headline(self) -> None:
        self._headline()
        count = self.rng.choice((2, 3))
        self._flow(self._columns(count, self.top, self.bottom), fill=self.rng.uniform(0.6, 0.9))

    def figure(self) -> None:
        self._headline()
        count = self.rng.choice((2, 3))
        columns = self._columns(count, self.top, self.bottom)
        span = count if count == 2 or self.rng.random() < 0.5 else 2
        x0, x1 = columns[0][0], columns[span - 1][1]
        height = self.rng.randint(280, 420)
        if self.rng.random() < 0.5:  # at the top of the columns, or at their foot
            below = self._picture(x0, x1, self.top, height)
            caption_bottom = self._caption(x0, x1, below + 12)
            under = caption_bottom + round(self.leading * self.rng.uniform(0.8, 1.6))
            columns = [(a, b, under if i < span else self.top, bottom) for i, (a, b, _, bottom) in enumerate(columns)]
            self._flow(columns, fill=self.rng.uniform(0.6, 0.9))
            return
        lines = 1 + len(self._wrap("Figure 0. " + " ".join(["word"] * 22), self.small, x1 - x0))
        top = self.bottom - height - 12 - lines * self.leading
        above = top - round(self.leading * self.rng.uniform(0.8, 1.6))
        columns = [(a, b, t, above if i < span else bottom) for i, (a, b, t, bottom) in enumerate(columns)]
        self._flow(columns, fill=1.0)
        self._caption(x0, x1, self._picture(x0, x1, top, height) + 12)

    def pull_quote(self) -> None:
        columns = self._columns(2, self.top, self.bottom)
        self._flow(columns, fill=self.rng.uniform(0.65, 0.9), quote_in=self.rng.randrange(2))

    def footnotes(self) -> None:
        notes = [f"{i + 1} {self._sentence(8, 18)}" for i in range(self.rng.randint(2, 4))]
        wrapped = [line for note in notes for line in self._wrap(note, self.small, self.right - self.left)]
        step = round(self.small.size * 1.3)
        note_top = self.bottom - step * len(wrapped)
        self.draw.line((self.left, note_top - 14, self.left + 300, note_top - 14), fill=INK, width=2)
        columns = self._columns(2, self.top, note_top - 40)
        self._flow(columns, fill=self.rng.uniform(0.6, 0.85))
        for i, line in enumerate(wrapped):
            self.draw.text((self.left, note_top + i * step), line, font=self.small, fill=INK)
        self.blocks.append(wrapped)

    # pieces

    def _columns(self, count: int, top: int, bottom: int) -> list[tuple[int, int, int, int]]:
        gutter = self.rng.randint(20, 56) if count == 2 else self.rng.randint(18, 44)
        width = (self.right - self.left - gutter * (count - 1)) // count
        for i in range(1, count) if self.ruled else ():
            x = self.left + i * (width + gutter) - gutter // 2
            self.draw.line((x, top, x, bottom), fill=INK, width=1)
        return [
            (self.left + i * (width + gutter), self.left + i * (width + gutter) + width, top, bottom)
            for i in range(count)
        ]

    def _headline(self) -> None:
        words = self._sentence(3, 8).rstrip(".;,:").split()
        lines = self._wrap(" ".join(w.capitalize() for w in words), self.head, self.right - self.left)
        for line in lines:
            self.draw.text((self.left, self.top), line, font=self.head, fill=INK)
            self.top += round(self.head.size * 1.2)
        byline = f"From the public record, {self.rng.choice(('Philadelphia', 'Gettysburg', 'Washington'))}"
        self.top += round(self.size * self.rng.uniform(0.2, 0.8))
        self.draw.text((self.left, self.top), byline, font=self.italic, fill=INK)
        self.top += round(self.leading * self.rng.uniform(1.1, 2.2))
        self.blocks += [lines, [byline]]

    def _picture(self, x0: int, x1: int, top: int, height: int) -> int:
        """A picture of shapes (no text) from ``x0`` to ``x1`` below ``top``; returns its bottom."""
        rng = self.rng
        base = tuple(rng.randint(150, 230) for _ in range(3))
        self.draw.rectangle((x0, top, x1, top + height), fill=base)
        for _ in range(rng.randint(6, 14)):
            w, h = rng.randint(40, (x1 - x0) // 2), rng.randint(30, height // 2)
            x, y = rng.randint(x0, x1 - w), rng.randint(top, top + height - h)
            shape = self.draw.ellipse if rng.random() < 0.5 else self.draw.rectangle
            shape((x, y, x + w, y + h), fill=tuple(rng.randint(30, 250) for _ in range(3)))
        return top + height

    def _caption(self, x0: int, x1: int, top: int) -> int:
        """A caption in italics under a picture; returns its bottom."""
        lines = self._wrap(f"Figure {self.rng.randint(1, 9)}. {self._sentence(8, 22)}", self.italic, x1 - x0)
        for i, line in enumerate(lines):
            self.draw.text((x0, top + i * self.leading), line, font=self.italic, fill=INK)
        self.blocks.append(lines)
        return top + len(lines) * self.leading

    def _flow(
        self,
        columns: list[tuple[int, int, int, int]],
        fill: float,
        figure_in: int | None = None,
        quote_in: int | None = None,
    ) -> None:
        """The text set down ``columns`` (x0, x1, top, bottom) in turn until ``fill`` of their lines
        are used; a picture and caption, or a pull quote, inside column ``figure_in``/``quote_in``."""
        capacity = sum((bottom - top) // self.leading for _, _, top, bottom in columns)
        budget = round(capacity * fill)
        indent = 0
        for index, (x0, x1, top, bottom) in enumerate(columns):
            block: list[str] = []
            y = top
            insert_at = top + round((bottom - top) * self.rng.uniform(0.3, 0.55))
            while budget > 0 and y + self.leading <= bottom:
                if index in (figure_in, quote_in) and y >= insert_at:
                    self.blocks.append(block)
                    block, y = [], self._insert(x0, x1, y, figure=index == figure_in)
                    figure_in = quote_in = None
                    continue
                line = self._line(x1 - x0 - indent)
                if line is None:  # a paragraph's end: a little space, or an indent on the next line
                    y += 0 if self.indented else self.leading // 2
                    indent = 2 * self.size if self.indented else 0
                    continue
                last = self.at >= len(self.words) or self.words[self.at] == PARAGRAPH
                self._set(line, x0 + indent, x1, y, justify=self.justified and not last)
                block.append(line)
                indent = 0
                y += self.leading
                budget -= 1
            self.blocks.append(block)

    def _set(self, line: str, x0: int, x1: int, y: int, justify: bool) -> None:
        """One line of body text from ``x0``, its words spread to ``x1`` where ``justify``."""
        words = line.split()
        if not justify or len(words) < 2:
            self.draw.text((x0, y), line, font=self.body, fill=INK)
            return
        space = (x1 - x0 - sum(self.body.getlength(w) for w in words)) / (len(words) - 1)
        x = float(x0)
        for word in words:
            self.draw.text((round(x), y), word, font=self.body, fill=INK)
            x += self.body.getlength(word) + space

    def _running_head(self) -> None:
        """A running head (a title left, the page number right) and a page number at the foot."""
        title = " ".join(w.capitalize() for w in self._sentence(2, 4).rstrip(".;,:").split())
        number = str(self.rng.randint(2, 399))
        self.draw.text((self.left, self.top - 40), title, font=self.small, fill=INK)
        self.draw.text((self.right - self.small.getlength(number), self.top - 40), number, font=self.small, fill=INK)
        self.draw.line((self.left, self.top - 12, self.right, self.top - 12), fill=INK, width=1)
        folio = str(int(number) + 1)
        self.draw.text(
            ((self.left + self.right - self.small.getlength(folio)) / 2, self.bottom + 30),
            folio,
            font=self.small,
            fill=INK,
        )
        self.blocks.append([f"{title} {number}"])
        self.footer.append(folio)
        self.top += 10

    def _insert(self, x0: int, x1: int, y: int, figure: bool) -> int:
        """A picture with its caption, or a pull quote between rules, across a column at ``y``;
        returns where the column's text goes on."""
        y += self.leading // 2
        if figure:
            bottom = self._caption(x0, x1, self._picture(x0, x1, y, self.rng.randint(160, 260)) + 10)
            return bottom + self.leading
        self.draw.line((x0, y, x1, y), fill=INK, width=3)
        lines = self._wrap(f"\u201c{self._sentence(8, 16)}\u201d", self.quote, x1 - x0 - 20)
        step = round(self.quote.size * 1.3)
        for i, line in enumerate(lines):
            self.draw.text((x0 + 10, y + 16 + i * step), line, font=self.quote, fill=INK)
        bottom = y + 16 + len(lines) * step + 10
        self.draw.line((x0, bottom, x1, bottom), fill=INK, width=3)
        self.blocks.append(lines)
        return bottom + self.leading

    def _line(self, width: int) -> str | None:
        """The next line of at most ``width`` pixels of the text, or None at a paragraph's end."""
        line = ""
        while self.at < len(self.words):
            word = self.words[self.at]
            if word == PARAGRAPH:
                if not line:
                    self.at += 1
                return line or None
            trial = f"{line} {word}" if line else word
            if line and self.body.getlength(trial) > width:
                return line
            line, self.at = trial, self.at + 1
        return line or None

    def _sentence(self, least: int, most: int) -> str:
        """``least`` to ``most`` consecutive words from somewhere in the text."""
        words = " ".join(self.text).split()
        count = self.rng.randint(least, most)
        start = self.rng.randrange(len(words) - count)
        return " ".join(words[start : start + count])

    def _wrap(self, text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
        lines: list[str] = []
        for word in text.split():
            if lines and font.getlength(f"{lines[-1]} {word}") <= width:
                lines[-1] += f" {word}"
            else:
                lines.append(word)
        return lines


def _scanned(image: Image.Image, rng: random.Random) -> Image.Image:
    """``image`` as a grey scan: turned 1.5 to 4 degrees either way, blurred, speckled."""
    angle = rng.uniform(1.5, 4.0) * rng.choice((-1, 1))
    grey = image.convert("L").rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255)
    grey = grey.filter(ImageFilter.GaussianBlur(0.7))
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 12, (grey.height, grey.width))
    pixels = np.clip(np.asarray(grey, dtype=np.float64) * 0.92 + 12 + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).convert("RGB")
