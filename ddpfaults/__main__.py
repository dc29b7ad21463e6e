"""Command line: ``python -m ddpfaults {demo,run,matrix,soak,html,trace} ...``.

``run``'s exit code: with ``--expect``, 0 if the expectation held, else 1; without, 0 for a completed world, 1 for
a hung or crashed one, 3 for one that timed out while still making progress (:data:`EXIT_TIMED_OUT`); with
``--check-resume``, also 1 when the resume check did not find the resumed run equivalent (it differs, or the check
could not run). 2 is bad input, for every command."""

from __future__ import annotations

import argparse
import os
import sys

from ddpfaults import faults as faults_module
from ddpfaults.errors import DDPFaultsError, FaultNeverFired, ReportFileError, ScenarioError
from ddpfaults.expect import Expect, Expectation, require_faults_fired
from ddpfaults.faults.base import Plan, check_plan
from ddpfaults.faults.plan import parse_plan
from ddpfaults.judge.results import Outcome
from ddpfaults.scenario import load_function
from ddpfaults.spec import CLI, STEP_CLOCKS, RunSpec, output_problem, parse_bool, settable

#: ``run``'s exit code for a world that timed out still making progress (no expectation given): not a failure found
#: in the job, a deadline too short for it
EXIT_TIMED_OUT = 3


def _parse_faults(text: str | None) -> Plan:
    """The ``--faults`` plan, parsed and validated (without a world) where it enters."""
    return check_plan(parse_plan(text) if text else [])


def _world_args(parser: argparse.ArgumentParser) -> None:
    """The run spec's settings a command line may set, as options; defaults, help and choices come from
    :mod:`ddpfaults.spec`."""
    for param in settable(CLI):
        flag = {"nargs": "?", "const": True} if param.parse is parse_bool else {}  # --check-resume alone: true
        parser.add_argument(
            param.option,
            dest=param.name,
            type=param.parse if param.parse in (int, float, parse_bool) else None,
            **flag,
            default=param.default,
            choices=param.choices or None,
            metavar=None if param.choices else param.metavar,
            help=f"{param.help}: {param.kind} (default {param.text(param.default)})",
        )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the world, and its expectation if any, as a report document (docs/report-schema.md) to "
        "PATH; `python -m ddpfaults html PATH` draws it",
    )


def _parse_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise DDPFaultsError(f"--kwargs {text!r}: not a Python dict literal ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise DDPFaultsError(f"--kwargs {text!r}: expected a dict such as \"{{'steps': 3}}\"")
    return value


def _settings(args) -> dict:
    """The run settings the command line gave (or defaulted)."""
    return {param.name: getattr(args, param.name) for param in settable(CLI)}


def _run(args, script_argv: list[str]):
    """The world ``run`` names: a rank function (``FILE.py:NAME``, ``MODULE:NAME``), a script (``FILE.py``) or a
    module (``-m MODULE``) run as torchrun would."""
    faults = _parse_faults(args.faults)
    spec = RunSpec(**_settings(args))  # refused before torch is imported
    if args.module or (args.target and ":" not in args.target):
        if args.kwargs:
            raise DDPFaultsError("--kwargs is for rank functions (FILE.py:NAME); give a script's arguments after --")
        from ddpfaults.engine.scripts import ScriptRun

        target = ScriptRun.of(args.target, script_argv, module=args.module, step_clock=args.step_clock, cwd=args.cwd)
        return _run_world(target, faults, spec)
    if args.cwd is not None:
        raise DDPFaultsError("--cwd is for scripts (FILE.py, -m MODULE); a rank function runs in this directory")
    if not args.target:
        raise DDPFaultsError("run: name what to run: FILE.py (a script), -m MODULE, or FILE.py:NAME (a rank function)")
    if script_argv:
        raise DDPFaultsError(f"arguments after -- are for scripts; {args.target} is a rank function (use --kwargs)")
    kwargs, fn = _parse_kwargs(args.kwargs), load_function(args.target)
    from ddpfaults.engine.launcher import FunctionTarget  # imports torch: not before the arguments are known good

    return _run_world(FunctionTarget.of(fn, kwargs=kwargs), faults, spec)


def _run_world(target, faults, spec: RunSpec, require_faults_fire: bool = False):
    """The command line's world: one request (:class:`~ddpfaults.engine.world.WorldRequest`), run whole; a fault
    that never fired is for the caller to judge (``run`` names --allow-unfired)."""
    from ddpfaults.engine import world

    return world.run(world.WorldRequest.of(target, faults, spec, require_faults_fire=require_faults_fire))


def _writable(path: str, what: str) -> str:
    """``path``, once it is known that it can be written (checked before any world runs)."""
    problem = output_problem(path)
    if problem:
        raise ReportFileError(f"{what} {path!r} cannot be written: {problem}")
    return path


def _expect(text: str | None):
    """The ``--expect`` option as an :class:`~ddpfaults.expect.Expect` (None without one), checked before any
    world starts."""
    if text is None:
        return None
    try:
        return Expect.parse(text)
    except ScenarioError as exc:
        raise ScenarioError(f"--expect: {exc}") from None


def _report(result, args, expect) -> int:
    """Write ``--json``, then print the world's report and, with ``expect``, whether it held; return the exit code
    (0: the expectation held, or without one the world completed; without one, :data:`EXIT_TIMED_OUT` for a world
    that timed out, else 1). The document is written first: a closed stdout (``| head``) cannot lose it."""
    from ddpfaults.report.document import write_document

    expectation = Expectation.of(expect, result) if expect is not None else None
    if args.json:
        write_document(args.json, [result], expectations=[expectation])
    print(result.report())
    if expectation is None:
        code = {Outcome.COMPLETED: 0, Outcome.TIMED_OUT: EXIT_TIMED_OUT}.get(result.outcome, 1)
        return 1 if result.resume is not None and not result.resume["equivalent"] else code
    verdict = "OK" if expectation.held else "MISMATCH"
    print(f"\nexpected {expect.describe()}, observed {result.outcome}: {verdict}")
    for mismatch in expectation.mismatches:
        print(f"- {mismatch}")
    return 0 if expectation.held else 1


def _stdout_closed() -> int:
    """Whoever read stdout stopped (``| head``): say nothing more there (Python would complain at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


def main(argv=None) -> int:
    """Entry point; returns the process exit code. Ctrl-C ends a run with one line (the world's ranks are killed
    on the way out) and exit status 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(
            "ddpfaults: interrupted (Ctrl-C); the world was stopped, nothing it started is left running",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:
        return _stdout_closed()


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpfaults", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a 4-rank DDP world where rank 2 skips the last logging all_reduce; expect hung"
    )
    _world_args(demo)
    run = sub.add_parser(
        "run",
        help="run (or replay) a torchrun script unmodified (FILE.py [-- ARGS], -m MODULE) or a rank function "
        "(FILE.py:NAME, MODULE:NAME)",
    )
    run.add_argument("target", nargs="?", help="train.py (run as __main__), or FILE.py:NAME / MODULE:NAME")
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a module as python -m would (a script world)")
    run.add_argument(
        "--step-clock",
        choices=STEP_CLOCKS,
        default=STEP_CLOCKS[0],
        help="scripts: what counts steps for step-keyed faults: optimizer steps (default) or DataLoader batches",
    )
    run.add_argument(
        "--cwd",
        metavar="DIR",
        help="scripts: the ranks' working directory, where the script's relative paths lead (default: this one, "
        "as under torchrun); the script path is relative to it",
    )
    run.add_argument(
        "--faults",
        help="a list of fault constructors with literal arguments, e.g. '[EmptyBatch(rank=1, step=1)]' (parsed, "
        "never evaluated)",
    )
    run.add_argument(
        "--kwargs", help="keyword arguments for the function, a Python dict literal, e.g. \"{'steps': 3}\""
    )
    run.add_argument(
        "--expect",
        metavar="EXPECT",
        help="what the world must do: completed, hung, crashed or 'timed out', optionally followed by "
        "'with ErrorType', 'on rank N', 'in collective' (e.g. 'crashed with KeyError on rank 1'); every fault must "
        "fire; then the resume check's finding: 'resumed equivalent', 'resume differs [from step N][: CAUSE]' (alone: "
        "completed and it). Exit code 0 if it held, 1 if not (without --expect: 0 completed, 1 hung or crashed, 3 "
        "timed out; 1 too when --check-resume did not find the resume equivalent)",
    )
    run.add_argument(
        "--allow-unfired",
        action="store_true",
        help="do not fail (exit 1) when a fault never fires though a rank it targets finished its function",
    )
    _world_args(run)
    from ddpfaults import matrix, soak

    matrix.add_parser(sub)
    soak.add_parser(sub)
    html = sub.add_parser("html", help="render a report JSON (--ddpfaults-report) as one self-contained HTML page")
    html.add_argument("report", help="the report document, e.g. report.json")
    html.add_argument("-o", "--output", help="where to write the page (default: the report path with .html)")
    trace = sub.add_parser(
        "trace", help="convert a report JSON (--ddpfaults-report) into a Chrome Trace Event file (Perfetto)"
    )
    trace.add_argument("report", help="the report document, e.g. report.json")
    trace.add_argument("-o", "--output", help="where to write the trace (default: the report path with .trace.json)")
    argv = list(sys.argv[1:] if argv is None else argv)
    script_argv = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(script_argv) - 1] if "--" in argv else argv)
    try:
        if args.command in ("run", "demo") and args.json:
            _writable(args.json, "--json")
        if args.command == "matrix":
            return matrix.main(args)
        if args.command == "soak":
            return soak.main(args)
        if args.command == "html":
            from ddpfaults.report.document import read_document
            from ddpfaults.report.html import write_html

            output = _writable(args.output or os.path.splitext(args.report)[0] + ".html", "the page")
            print(write_html(output, read_document(args.report)))
            return 0
        if args.command == "trace":
            from ddpfaults.report.chrome_trace import write_trace
            from ddpfaults.report.document import read_document

            output = _writable(args.output or os.path.splitext(args.report)[0] + ".trace.json", "the trace")
            print(write_trace(output, read_document(args.report)))
            return 0
        if args.command == "demo":
            from ddpfaults.engine.launcher import FunctionTarget
            from ddpfaults.toy.demo import train

            plan = [faults_module.SkippedCollective(rank=2, step=3, op="all_reduce")]
            result = _run_world(FunctionTarget.of(train), plan, RunSpec(**_settings(args)), require_faults_fire=True)
            return _report(result, args, Expect.parse("hung"))
        expect = _expect(args.expect)
        if expect is not None and expect.checks_resume:  # an expected finding needs the check, as a scenario's does
            args.check_resume = True
        result = _run(args, script_argv)
        code = _report(result, args, expect)
        if expect is None and not args.allow_unfired:  # an expectation judges unfired faults itself
            try:
                require_faults_fired(result, allow="rerun with --allow-unfired")
            except FaultNeverFired as exc:
                print(f"\nddpfaults: {exc}", file=sys.stderr)
                return 1
        return code
    except DDPFaultsError as exc:
        print(f"ddpfaults: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
