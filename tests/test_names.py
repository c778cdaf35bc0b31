"""One name, one thing: every public class and every module of the package has a name of its own."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ocrserve"
#: Module names any package may have.
SHARED_MODULES = {"__init__.py", "__main__.py", "base.py"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_module_names_are_unique():
    where = defaultdict(list)
    for path in _modules():
        where[path.name].append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert set(shared) <= SHARED_MODULES, shared


def test_public_class_names_are_unique():
    where = defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared
