"""The ``ocrserve`` command line (Typer + Rich): a module per command (``plan`` and ``models``, which
share the registry listings, live together in ``plan.py``)."""

from __future__ import annotations

import inspect

import typer

app = typer.Typer(
    name="ocrserve",
    help="Serve document OCR at scale: plan, launch, query and benchmark OCR engines.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Serve document OCR at scale: plan, launch, query and benchmark OCR engines."""


def _register() -> None:
    from ocrserve.cli import batch, bench, debug, engine, launch, ocr, plan, profiles

    app.command(name="launch")(launch.launch)
    app.command(name="ocr")(ocr.ocr)
    app.command(name="batch")(batch.batch)
    app.command(name="debug")(debug.debug)
    app.command(name="plan")(plan.plan)
    app.command(name="models")(plan.models)
    app.command(name="profiles")(profiles.profiles)
    app.command(name="bench")(bench.bench)
    app.command(name="capacity")(bench.capacity)
    app.add_typer(engine.app, name="engine")
    for command in [*app.registered_commands, *engine.app.registered_commands]:
        command.help = command.help or reflowed(inspect.getdoc(command.callback) or "")


def reflowed(doc: str) -> str:
    """``doc`` with each prose paragraph on one line, for Rich to wrap at the terminal's width:
    Typer's rich mode keeps a docstring's line breaks, so a terminal narrower than the source's
    lines wrapped each of them again. Paragraphs with an indented line (examples) or a list item
    (``- ``, ``* ``) keep theirs."""
    paragraphs = doc.split("\n\n")
    return "\n\n".join(p if _laid_out(p) else " ".join(p.splitlines()) for p in paragraphs)


def _laid_out(paragraph: str) -> bool:
    return any(line[:1].isspace() or line.startswith(("- ", "* ")) for line in paragraph.splitlines())


_register()


def main() -> None:
    """Entry point of the ``ocrserve`` console script."""
    app()
