"""Renderers of a :class:`~ocrserve.gpu.planner.Plan` for ``ocrserve plan --format`` and ``ocrserve launch``.

The planner returns data (:class:`~ocrserve.gpu.planner.Plan`, its ``argv()`` and ``to_dict()``);
these turn it into text: a Rich table with each quantity's derivation, YAML, JSON, or the
shell-quoted ``vllm serve`` command line.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from ocrserve.gpu.defaults import Difference
from ocrserve.gpu.planner import Plan, Step
from ocrserve.gpu.registry import GIB


def render_argv(plan: Plan) -> str:
    """The command line, shell-quoted (``shlex.split`` gives :meth:`Plan.argv` back), after the
    environment the plan sets (``NAME=value ...``, a CPU plan's thread binding)."""
    env = "".join(f"{name}={shlex.quote(value)} " for name, value in plan.env.items())
    return env + shlex.join(plan.argv())


def render_json(plan: Plan) -> str:
    """The plan as indented JSON (:meth:`Plan.to_dict`)."""
    return json.dumps(plan.to_dict(), indent=2, ensure_ascii=False)


def render_yaml(plan: Plan) -> str:
    """The plan as YAML (block style, keys in plan order; :meth:`Plan.to_dict`)."""
    import yaml

    return yaml.safe_dump(plan.to_dict(), sort_keys=False, allow_unicode=True, width=100)


def _show(step: Step) -> str:
    """A step's value for the table: bytes in GiB/MiB/KiB with two decimals, integers with separators."""
    if step.unit == "bytes":
        for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
            if step.value >= size:
                return f"{step.value / size:.2f} {unit}"
        return f"{step.value} B"
    if isinstance(step.value, int):
        return f"{step.value:,}"
    return str(step.value)


def render_table(plan: Plan, command: bool = True):
    """A Rich renderable: one row per quantity with value and derivation, then (with ``command``)
    the command line, and the warnings."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    if plan.device == "cpu":
        host = plan.gpu
        title = (
            f"{plan.model.id} on vLLM's CPU backend: CPU host {host.name} ({len(host.cores)} cores, "
            f"{host.memory_gib:.1f} GiB available{'' if host.bf16 else ', no bf16'})"
        )
    else:
        title = (
            f"{plan.model.id} on {plan.gpus} x {plan.gpu.name} ({plan.gpu.memory_gib:.1f} GiB"
            f"{'' if plan.gpu.bf16 else ', no bf16'}) - {plan.strategy}"
        )
    table = Table("quantity", "value", "derivation", title=title, show_lines=False, expand=False)
    for step in plan.steps:
        table.add_row(escape(step.label), _show(step), escape(step.derivation))
    parts = [table]
    if plan.concurrency is not None:
        parts.append(render_concurrency(plan))
    parts += [Text("vLLM command line:", style="bold"), Text(render_argv(plan))] if command else []
    parts += [Text("warning: " + w, style="yellow") for w in plan.warnings]
    return Group(*parts)


def render_concurrency(plan: Plan):
    """A Rich table of ``plan.concurrency``: worst-case, statistical and vLLM's default
    ``--max-num-seqs`` with their overflow chance, expected KV use and the scheduler model's
    predicted pages/s, p95 and preemptions (labelled predictions)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    c = plan.concurrency
    planned = plan.vllm_args.get("max_num_seqs")
    table = Table(
        "--max-num-seqs",
        "N",
        "P(overflow)",
        "expected KV use",
        "pages/s (predicted)",
        "p95 s (predicted)",
        "preemptions/page (predicted)",
        title=f"pages at once: worst case vs statistical (target {c.target:g}) vs vLLM's default",
    )
    for cand in c.candidates:
        p = c.predictions.get(cand.seqs)
        mark = " (planned)" if cand.seqs == planned else ""
        table.add_row(
            cand.name + mark,
            f"{cand.seqs:,}",
            _share(cand.overflow),
            f"{cand.kv_use:.0%}",
            f"{p.pages_per_s:.2f}" if p else "-",
            f"{p.p95_s:.1f}" if p else "-",
            f"{p.preemptions_per_page:.3f}" if p else "-",
        )
    notes = [
        f"output lengths: {c.lengths.describe(_max_tokens(plan))}",
        "P(overflow): chance that N pages, all at their final lengths, need more KV blocks than the cache (exact); "
        "expected KV use: N pages' mean blocks over the cache. An overflow preempts the newest page, which later "
        "recomputes its prefill; no page is cut (max_tokens stays the full budget).",
    ]
    if c.predictions:
        notes.append(
            "predictions, not measurements: a model of vLLM's scheduler (block admission, decode steps, "
            f"preemption by recompute), closed loop with N pages in flight; {c.step_time}"
        )
    return Group(table, *(Text(n, style="dim") for n in notes))


def _share(p: float) -> str:
    if p >= 0.9995:
        return "~100%"
    if p == 0:
        return "0"
    return f"{p:.2%}" if p >= 0.0001 else f"{p:.1e}"


def _max_tokens(plan: Plan) -> int:
    try:
        return int(plan.value("output_tokens"))
    except KeyError:
        return plan.model.max_tokens


def render_defaults(plan: Plan, rows: list[Difference]):
    """A Rich table of :func:`~ocrserve.gpu.defaults.compare_defaults`: per flag, vLLM's default, the
    plan's value and what the default would do."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        "flag",
        "vLLM default",
        "planned",
        "what the default does",
        title=f"vLLM {plan.vllm_version} defaults vs the plan: {plan.model.id} on {plan.gpu.name}",
    )
    for row in rows:
        table.add_row(row.flag, escape(_compact(row.default)), escape(_compact(row.planned)), escape(row.consequence))
    return table


def _compact(value: object) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return f"{value:,}" if isinstance(value, int) else str(value)


RENDERERS: dict[str, Callable[[Plan], object]] = {
    "argv": render_argv,
    "json": render_json,
    "yaml": render_yaml,
    "table": render_table,
}
"""``--format`` name -> renderer (``table`` gives a Rich renderable, the others a string)."""
