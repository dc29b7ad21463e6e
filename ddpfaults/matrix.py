"""``python -m ddpfaults matrix [PATHS...] [--json PATH] [--seed N]``: run every scenario case, print a truth table.
``python -m ddpfaults.matrix`` prints ``docs/scenarios.md`` (the cases, without running them).

Each case (see :func:`ddpfaults.scenario.discover`; the built-ins by default) runs in a real world;
the table has one row per case: scenario, variant, expected, observed verdict, root cause,
seconds. The exit code is 1 when any case mismatches its ``Expect``, 2 on bad input (a path that
does not exist, a module that fails to import, no scenarios found).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

from ddpfaults.judge.checks import fidelity
from ddpfaults.scenario import discover
from ddpfaults.spec import RunSpec, output_problem

COLUMNS = ("scenario", "variant", "expected", "observed", "root cause", "seconds", "ok")


@dataclass
class Row:
    """The outcome of one case against its expectation."""

    scenario: str
    variant: str
    expected: str
    observed: str
    root_cause: str
    seconds: float
    mismatches: list = field(default_factory=list)
    root_rank: int | None = None  # the rank the root cause was found on (None: no failure, or none to blame)
    result: object = field(default=None, repr=False, compare=False)  # the WorldResult, for its report when wanted
    latency: float | None = None  # seconds from the failure forming to the verdict (None: nothing formed)
    root_matched: bool | None = None  # the root-cause rank is the expected one (None: the case expects no rank)
    divergence_matched: bool | None = None  # the first divergence names the expected collective (None: none expected)

    @property
    def ok(self) -> bool:
        """True if the case matched its expectation."""
        return not self.mismatches

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "expected": self.expected,
            "observed": self.observed,
            "root_cause": self.root_cause,
            "seconds": round(self.seconds, 2),
            "ok": self.ok,
            "mismatches": self.mismatches,
        }


def run_case(case, options: RunSpec) -> Row:
    """Run one case and compare it with its expectation; measure how its verdict compares with the failure
    (:mod:`ddpfaults.judge.checks.fidelity`): the latency from the failure forming to the verdict, and whether the
    root-cause rank and the first divergence are the ones expected."""
    started = time.monotonic()
    result = case.run(options)
    expect = case.expect
    return Row(
        case.scenario.name,
        case.variant.name if case.variant else "",
        case.expect.describe(),
        str(result.outcome),
        result.root_cause,
        time.monotonic() - started,
        [str(m) for m in case.expect.mismatches(result)],
        root_rank=result.root_rank,
        result=result,
        latency=fidelity.verdict_latency(result),
        root_matched=None if expect.rank is None else result.root_rank == expect.rank,
        divergence_matched=None
        if expect.collective is None
        else fidelity.divergence_matches(result.divergence, expect.rank, expect.collective),
    )


def _cell(text: str, width: int = 120) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown_header() -> str:
    """The table's header and separator lines."""
    return "| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" for _ in COLUMNS) + "|"


def markdown_row(row: Row) -> str:
    """One table line."""
    cells = [
        row.scenario,
        row.variant,
        row.expected,
        row.observed,
        row.root_cause,
        f"{row.seconds:.2f}",
        "yes" if row.ok else "**MISMATCH**",
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def summary(rows: list[Row], wall: float) -> str:
    """The lines after the table: totals, then every mismatch in full."""
    bad = [r for r in rows if not r.ok]
    lines = [f"\n{len(rows) - len(bad)}/{len(rows)} cases matched their expectation in {wall:.1f} s"]
    for r in bad:
        lines += [f"- {r.scenario}[{r.variant}]: {m}" for m in r.mismatches]
    return "\n".join(lines)


REFERENCE_HEADER = """# Built-in scenarios

Generated from the scenario modules in `scenarios/` by `python -m ddpfaults.matrix > docs/scenarios.md`;
`tests/test_scenarios_doc.py` fails when this file and the code disagree. Each module reproduces one failure seen
in the field (its first line says which; its docstring says what each variant does on gloo, as measured), with
naive variants that fail the way the field saw and fixed variants that complete. `python -m ddpfaults matrix` runs
every case below and prints what it observed next to what is expected (the exit code is 1 if any differs); the
test suite runs them too (`tests/scenarios/`). How an expectation reads: [pytest.md](pytest.md).
"""


def reference(cases=None) -> str:
    """``docs/scenarios.md``: every case (default: the built-ins) by module, with its world size, its faults and its
    expectation, after the module docstring's first line."""
    cases = discover() if cases is None else cases
    parts, module = [REFERENCE_HEADER], None
    for case in cases:
        declared_in = case.scenario.module or getattr(case.scenario.fn, "__module__", None)
        if declared_in != module:
            module = declared_in
            doc = (getattr(sys.modules.get(module), "__doc__", None) or "").strip()
            first = " ".join(doc.split("\n\n")[0].split())
            parts.append(f"\n## `{module}.py`\n\n{first}\n\n| case | ranks | faults | expected |\n|---|---|---|---|")
        spec = case.resolve(RunSpec())
        faults = ", ".join(repr(f) for f in spec.faults) or "none"
        cells = [f"`{case.id}`", str(spec.spec.world_size), faults, case.expect.describe()]
        parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(parts) + "\n"


def add_parser(sub) -> None:
    """Add the ``matrix`` subcommand to an argparse subparsers object."""
    parser = sub.add_parser("matrix", help="run every scenario case (default: the built-ins) and print a truth table")
    parser.add_argument("paths", nargs="*", help="scenario files or directories (default: the built-in scenarios)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        nargs="?",
        const=JSON_TO_STDOUT,
        help="also write the rows as JSON to PATH (as run --json PATH and soak --json PATH do); --json alone, the "
        "old form, prints them instead of the table (deprecated)",
    )
    parser.add_argument("--seed", type=int, default=0)


#: ``--json`` given without a path: the old flag, which printed the rows as JSON instead of the table
JSON_TO_STDOUT = "-"


def json_option(args) -> tuple[str | None, bool]:
    """``(path, to_stdout)`` of the ``--json`` option: a path to write the rows to, or the deprecated flag form
    (``--json`` alone, or followed by what is a scenario path: an existing ``.py`` file or folder, which the old
    flag never took), which prints them to stdout; a deprecation line on stderr says so."""
    value = args.json
    if value is not None and value != JSON_TO_STDOUT and (os.path.isdir(value) or value.endswith(".py")):
        args.paths = [value, *args.paths]  # argparse gave the flag its following path
        value = JSON_TO_STDOUT
    if value != JSON_TO_STDOUT:
        return value, False
    print(
        "ddpfaults: matrix --json without a path is deprecated: give one (--json rows.json), as run and soak take",
        file=sys.stderr,
    )
    return None, True


def main(args) -> int:
    """Run the matrix for parsed ``args``; returns the exit code (bad input raises DDPFaultsError)."""
    from ddpfaults.errors import DDPFaultsError, ReportFileError
    from ddpfaults.report.document import write_json

    path, to_stdout = json_option(args)
    if path is not None:
        problem = output_problem(path)
        if problem:
            raise ReportFileError(f"--json {path!r} cannot be written: {problem}")
    cases = discover(args.paths or None)
    if not cases:
        raise DDPFaultsError(f"no scenarios found in {' '.join(args.paths) or 'the built-ins'}")
    options = RunSpec(seed=args.seed)
    started, rows = time.monotonic(), []
    if not to_stdout:
        print(markdown_header(), flush=True)
    for case in cases:
        rows.append(run_case(case, options))
        if not to_stdout:
            print(markdown_row(rows[-1]), flush=True)
    document = {
        "rows": [r.to_dict() for r in rows],
        "ok": all(r.ok for r in rows),
        "seconds": round(time.monotonic() - started, 2),
    }
    if path is not None:
        write_json(path, document, what="--json", indent=2)
    if to_stdout:
        print(json.dumps(document, indent=2))
    else:
        print(summary(rows, time.monotonic() - started))
    sys.stdout.flush()
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    print(reference(), end="")
