"""The documents a command is given: files, folders searched recursively, and globs, each with the
name its result takes under an output folder (``ocrserve ocr --out``, ``ocrserve batch``)."""

from __future__ import annotations

import glob
import itertools
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

#: File suffixes taken from folders and globs (a file named directly is read whatever its suffix).
DOCUMENT_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp", ".gif", ".pdf"}
#: The characters that make an input a glob (:mod:`glob`'s wildcards).
GLOB_CHARS = "*?["
#: The ``skipped`` count of entries under a folder that are not regular files (a FIFO, a dangling link).
NOT_A_FILE = "not a regular file"


def collect_documents(
    paths: list[Path], skipped: Counter[str] | None = None, *, exclude: Path | None = None
) -> dict[Path, Path]:
    """The documents of ``paths``, sorted, each with its result's name (a relative path).

    A file named directly is a document whatever its suffix, named by its file name. Under a folder,
    files with a suffix of :data:`DOCUMENT_SUFFIXES` are documents, found recursively (following
    links to folders, each folder once; leaving hidden folders such as ``.git``, and ``exclude``,
    an output folder inside an input one), named relative to the folder (``scans/a/x.tif`` under
    ``scans/`` -> ``a/x.tif``). A path that does not exist and holds a wildcard is a recursive glob
    (``scans/**/*.pdf``): what it matches is taken as above, named relative to the folder before
    its first wildcard (``scans/a/x.pdf`` -> ``a/x.pdf``). The same file reached twice (two
    spellings of one folder) is one document.

    Args:
        paths: files, folders and globs.
        skipped: when given, counts the other entries found, by suffix (lower case, ``""`` for
            none), or :data:`NOT_A_FILE`.
        exclude: a folder never searched.

    Raises:
        FileNotFoundError: a named path does not exist, is not a file or folder, or a glob
            matches nothing.
        ValueError: two different documents would take the same name.
    """
    collector = _Collector(Counter() if skipped is None else skipped, exclude)
    found: dict[Path, tuple[Path, Path]] = {}  # real path -> (path, name)
    for path in paths:
        for doc, name in collector.named(path):
            found.setdefault(doc.resolve(), (doc, name))
    return _unique_names(dict(sorted(found.values())))


class _Collector:
    """One :func:`collect_documents` call: what it left, and the folders it has searched."""

    def __init__(self, skipped: Counter[str], exclude: Path | None):
        self.skipped = skipped
        self.excluded = os.path.realpath(exclude) if exclude is not None else None
        self.searched: set[str] = set()  # real paths: each folder is searched once

    def named(self, path: Path) -> Iterator[tuple[Path, Path]]:
        """``(document, name)`` of one input: a file, a folder or a glob."""
        if path.is_file():
            yield path, Path(path.name)
        elif path.is_dir():
            yield from ((doc, doc.relative_to(path)) for doc in self.under(path))
        elif not path.exists() and any(c in str(path) for c in GLOB_CHARS):
            yield from self.globbed(str(path))
        elif path.exists() or path.is_symlink():
            raise FileNotFoundError(f"not a regular file or folder: {path}")
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")

    def globbed(self, pattern: str) -> Iterator[tuple[Path, Path]]:
        """What ``pattern`` matches (recursively), named relative to the folder before its first wildcard."""
        root = Path(*itertools.takewhile(lambda part: not any(c in part for c in GLOB_CHARS), Path(pattern).parts))
        matched = 0
        for match in map(Path, sorted(glob.glob(pattern, recursive=True))):
            if match.is_dir():
                docs = list(self.under(match))
            elif match.is_file() and match.suffix.lower() in DOCUMENT_SUFFIXES:
                docs = [match]
            else:
                self.skipped[match.suffix.lower() if match.is_file() else NOT_A_FILE] += 1
                continue
            matched += len(docs)
            yield from ((doc, doc.relative_to(root)) for doc in docs)
        if not matched:
            raise FileNotFoundError(f"no document matches {pattern}")

    def under(self, folder: Path) -> Iterator[Path]:
        """The documents under ``folder`` by suffix, recursively (see :func:`collect_documents`)."""
        for here, folders, files in os.walk(folder, followlinks=True):
            real = os.path.realpath(here)
            if real in self.searched or real == self.excluded:
                folders[:] = []  # searched already (a link back, a folder named twice), or the output
                continue
            self.searched.add(real)
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            for name in sorted(files):
                file = Path(here, name)
                if not file.is_file():
                    self.skipped[NOT_A_FILE] += 1
                elif file.suffix.lower() in DOCUMENT_SUFFIXES:
                    yield file
                else:
                    self.skipped[file.suffix.lower()] += 1


def _unique_names(found: dict[Path, Path]) -> dict[Path, Path]:
    seen: dict[Path, Path] = {}
    for doc, name in found.items():
        other = seen.setdefault(name, doc)
        if other != doc:
            raise ValueError(f"{other} and {doc} would both be written as {name}; name them in separate runs")
    return found
