#!/usr/bin/env python3
"""The long fuzzing run: the properties of tests/test_fuzz_preprocess.py and tests/test_fuzz_api.py
(strategies and checks in tests/fuzzing.py) for many more examples, with a summary.

- ``preprocess``: random bytes, truncations and header mutations of the samples, decoded in this
  process with the profile's ``preprocess`` section; each must end as pages, failed pages or a 4xx
  problem within ``tests.fuzzing.DOCUMENT_TIME_LIMIT_S``.
- ``api``: requests from the gateway's OpenAPI schema (schemathesis), valid and invalid, against a
  gateway this script starts on loopback (or ``--url``); no 5xx, no traceback or server path in a
  body, an answer within ``tests.fuzzing.REQUEST_TIME_LIMIT_S``; tracebacks in the gateway's log
  count as findings too.

Each target runs in rounds of fresh random examples until ``--examples`` or ``--duration`` is
spent; a failure is shrunk to a minimal input, written to ``--out`` (the input, exactly, and the
traceback) and the run goes on. A document still decoding after ``--hang-s`` stops the run with
that document saved. Exit status 1 when anything was found. Needs ``pip install -e '.[test]'``.

    python scripts/fuzz.py                                   # both targets, 5 minutes each
    python scripts/fuzz.py --target preprocess --examples 100000 --duration 3600 --out out/fuzz
    python scripts/fuzz.py --target api --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from ocrserve.bench.harness import REPO, LocalGateway
from ocrserve.config import load_config

sys.path.insert(0, str(REPO))  # the strategies and checks are the CI tests' own
from tests import fuzzing  # noqa: E402

#: Examples per hypothesis run; each round draws fresh ones from its own seed.
ROUND_EXAMPLES = 200
#: Log lines that mean the gateway raised while serving a fuzzed request.
LOG_TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Finding:
    """One distinct failure, shrunk: its input, exactly, and what it raised."""

    target: str
    signature: str
    input: str
    traceback: str


@dataclass
class Stats:
    """What one target's run did."""

    target: str
    examples: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)


class Watchdog:
    """Ends the process when one example runs past ``limit_s`` seconds (a decoder stuck in C code
    cannot be interrupted otherwise), after saving that example to ``out/hang.txt``.

    Args:
        limit_s: longest one example may run, seconds.
        out: where the hung input is written.
    """

    def __init__(self, limit_s: float, out: Path):
        self.limit_s, self.out = limit_s, out
        self.current: tuple[float, str] | None = None
        threading.Thread(target=self._watch, daemon=True, name="fuzz-watchdog").start()

    def start(self, description: str) -> None:
        """An example begins; ``description`` reproduces it."""
        self.current = (time.monotonic(), description)

    def stop(self) -> None:
        """The example ended."""
        self.current = None

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            current = self.current
            if current and time.monotonic() - current[0] > self.limit_s:
                self.out.mkdir(parents=True, exist_ok=True)
                (self.out / "hang.txt").write_text(current[1] + "\n", encoding="utf-8")
                print(f"fuzz: an example ran past {self.limit_s:g} s; saved to {self.out / 'hang.txt'}", flush=True)
                os._exit(2)


def signature(exc: BaseException) -> str:
    """What makes two failures the same bug: the exception type and its first line."""
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:160]}"


@dataclass
class Campaign:
    """One target's run: ``check`` on examples of ``strategy`` until a deadline.

    Attributes:
        stats: what it did so far.
        strategy: the examples.
        check: returns an outcome label; raises on a finding.
        describe: an example as text that reproduces it.
        deadline: ``time.monotonic()`` after which examples are skipped.
        watchdog: watches each example's time.
    """

    stats: Stats
    strategy: st.SearchStrategy
    check: Callable[[object], object]
    describe: Callable[[object], str]
    deadline: float
    watchdog: Watchdog

    def round(self, round_seed: int, examples: int) -> Finding | None:
        """Up to ``examples`` fresh examples from ``round_seed``; the shrunk failure, if any."""
        failed: list[tuple[object, BaseException, str]] = []

        @seed(round_seed)
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate, Phase.shrink],
        )
        @given(self.strategy)
        def one_round(value):
            if time.monotonic() >= self.deadline:
                return
            try:
                self._example(value)
            except Exception as exc:
                failed.append((value, exc, traceback.format_exc()))
                raise

        try:
            one_round()
        except Exception:
            if not failed:  # hypothesis itself failed, not a check
                raise
            value, exc, trace = failed[-1]  # hypothesis replays the shrunk example last
            return Finding(self.stats.target, signature(exc), self.describe(value), trace)
        return None

    def _example(self, value) -> None:
        """Check one example, counting its outcome, under the watchdog."""
        self.stats.examples += 1
        self.watchdog.start(self.describe(value))
        try:
            self.stats.outcomes[self.check(value)] += 1
        finally:
            self.watchdog.stop()


def fuzz(
    target: str,
    strategy: st.SearchStrategy,
    check: Callable[[object], object],
    describe: Callable[[object], str],
    args: argparse.Namespace,
    watchdog: Watchdog,
) -> Stats:
    """Run ``check`` on examples of ``strategy`` in rounds until ``args.examples`` or
    ``args.duration`` seconds are spent; each distinct failure is recorded once, shrunk."""
    started = time.monotonic()
    campaign = Campaign(Stats(target), strategy, check, describe, started + args.duration, watchdog)
    stats, known = campaign.stats, set()
    for round_number in itertools.count():
        if stats.examples >= args.examples or time.monotonic() >= campaign.deadline:
            break
        finding = campaign.round(args.seed + round_number, min(ROUND_EXAMPLES, args.examples - stats.examples))
        if finding and finding.signature not in known:
            known.add(finding.signature)
            stats.findings.append(finding)
    stats.seconds = time.monotonic() - started
    return stats


def describe_document(document: fuzzing.Document) -> str:
    """A document as code that rebuilds it exactly."""
    return f"tests.fuzzing.{document!r}.data  # {len(document.data)} bytes"


@contextlib.contextmanager
def native_stderr_to(path: Path):
    """Send what C libraries write to file descriptor 2 (libtiff and libjpeg complain about each
    broken file there, a few lines apiece) to ``path`` meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def fuzz_preprocess(args: argparse.Namespace, watchdog: Watchdog) -> Stats:
    """The preprocessor target, in this process (the decoders' own messages go to
    ``out/decoders.log``)."""
    cfg = load_config(args.profile).preprocess
    with native_stderr_to(args.out / "decoders.log"):
        return fuzz(
            "preprocess",
            fuzzing.documents(),
            lambda document: fuzzing.check_document(document, cfg),
            describe_document,
            args,
            watchdog,
        )


def fuzz_api(args: argparse.Namespace, watchdog: Watchdog) -> Stats:
    """The API target, against ``--url`` or a gateway started here, its jobs in a temporary folder
    (its log scanned afterwards)."""
    if args.url:
        return _fuzz_api_at(args.url, args, watchdog)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "gateway.log"
    with (
        tempfile.TemporaryDirectory(prefix="ocrserve-fuzz-") as data_dir,
        log_path.open("wb") as log,
        LocalGateway(f"preprocess.workers={args.workers}", f"store.data_dir={data_dir}", log=log) as gateway,
    ):
        stats = _fuzz_api_at(gateway.url, args, watchdog)
    tracebacks = log_path.read_text(encoding="utf-8", errors="replace").count(LOG_TRACEBACK)
    if tracebacks:
        stats.findings.append(
            Finding("api", f"{tracebacks} tracebacks in the gateway's log", str(log_path), "see the log")
        )
    return stats


def _fuzz_api_at(url: str, args: argparse.Namespace, watchdog: Watchdog) -> Stats:
    return fuzz(
        "api",
        fuzzing.api_cases(fuzzing.load_schema(url)),
        lambda case: fuzzing.check_call(case, url),
        lambda case: case.as_curl_command(base_url=url),
        args,
        watchdog,
    )


TARGETS = {"preprocess": fuzz_preprocess, "api": fuzz_api}


def report(runs: list[Stats], console: Console) -> None:
    """The summary table and each finding."""
    table = Table(title="fuzzing")
    for column in ("target", "examples", "seconds", "outcomes (most common)", "findings"):
        table.add_column(column)
    for run in runs:
        common = ", ".join(f"{outcome}: {n}" for outcome, n in run.outcomes.most_common(6))
        table.add_row(run.target, str(run.examples), f"{run.seconds:.0f}", common, str(len(run.findings)))
    console.print(table)
    for run in runs:
        for finding in run.findings:
            console.rule(f"{finding.target}: {finding.signature}")
            console.print(finding.input, markup=False, highlight=False)
            console.print(finding.traceback, markup=False, highlight=False)


def save(runs: list[Stats], out: Path) -> None:
    """``summary.json`` and one ``finding-N.txt`` per finding in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    findings = [finding for run in runs for finding in run.findings]
    for number, finding in enumerate(findings, 1):
        text = f"{finding.signature}\n\n{finding.input}\n\n{finding.traceback}"
        (out / f"finding-{number}.txt").write_text(text, encoding="utf-8")
    summary = [{**asdict(run), "outcomes": dict(run.outcomes)} for run in runs]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    parser.add_argument("--examples", type=int, default=20_000, help="most examples per target")
    parser.add_argument("--duration", type=float, default=300.0, help="most seconds per target")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="first round's seed (default: now)")
    parser.add_argument("--profile", default="local", help="profile whose preprocess section is fuzzed")
    parser.add_argument("--url", help="fuzz this gateway instead of starting one")
    parser.add_argument("--workers", type=int, default=1, help="decoding processes of the gateway started here")
    parser.add_argument("--hang-s", type=float, default=120.0, help="an example running longer stops the run")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "fuzz", help="findings and summary.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Pillow warns about the broken files it still reads (the gateway's decoding processes rate-limit these)
    warnings.filterwarnings("ignore", category=UserWarning)
    console = Console()
    console.print(f"fuzz: seed {args.seed}, up to {args.examples} examples or {args.duration:g} s per target")
    watchdog = Watchdog(args.hang_s, args.out)
    targets = list(TARGETS) if args.target == "all" else [args.target]
    runs = [TARGETS[name](args, watchdog) for name in targets]
    report(runs, console)
    save(runs, args.out)
    console.print(f"written to {args.out}")
    return 1 if any(run.findings for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
