"""``python -m ddpfaults soak --rounds N --hogs K [PATHS...]``: do the verdicts hold while the CPU is busy?

Every scenario case under ``PATHS`` (the built-ins by default; found and run as ``matrix`` does) runs ``N``
rounds while ``K`` busy processes (hogs: ``while True`` loops started by this command) compete for the CPU.
Per case the command prints its verdict counts over the rounds and its mismatches against the ``Expect``, and
flags every FLIP: a case whose observed verdict or root-cause rank changed from one round to the next. It also
measures each case's fidelity, as papers on distributed hang detection publish it: the p50 and p99 time from the
failure forming (a deadlock, or the first failure: :mod:`ddpfaults.judge.checks.fidelity`) to the verdict, and in how
many runs the root-cause rank and the first divergence were the expected ones (where the case expects a rank, a
collective). A run that
mismatched or flipped prints its world's whole report as it happens (seed, replay command, every rank's error,
stack and output), so a rare event can be read and replayed. The last
line sums it up; the exit code is 1 on any flip or mismatch, 2 on bad input, 130 if stopped by Ctrl-C (the
counts so far are still printed). The hogs are killed on every way out: normal end, exception, Ctrl-C, SIGTERM,
and (through ``PR_SET_PDEATHSIG``) even SIGKILL of this process.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise

from ddpfaults.errors import ConfigError, DDPFaultsError
from ddpfaults.matrix import Row, run_case
from ddpfaults.report.document import write_json
from ddpfaults.scenario import case_id, discover
from ddpfaults.spec import PARAM, Param, RunSpec

ROUNDS = Param("rounds", 50, "an int >= 1", lambda v: isinstance(v, int) and v >= 1, int)
HOGS = Param("hogs", 2, "an int >= 0", lambda v: isinstance(v, int) and v >= 0, int)
FLIPS_SHOWN = 5  # per case in the text output (the JSON has them all)

#: a hog: die with the soak (PR_SET_PDEATHSIG, checked against a parent already gone), then spin
HOG_CODE = """\
import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 9)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
while True:
    pass
"""

Observation = tuple  # (observed verdict, root-cause rank or None)


@dataclass(frozen=True)
class Flip:
    """A case observed differently in ``round`` than in the round before it."""

    round: int
    before: Observation
    after: Observation

    def describe(self) -> str:
        """``round 7: hung (root rank 2), was crashed (root rank 1)``."""
        return f"round {self.round}: {_observation(self.after)}, was {_observation(self.before)}"

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return {
            "round": self.round,
            "before": {"verdict": self.before[0], "root_rank": self.before[1]},
            "after": {"verdict": self.after[0], "root_rank": self.after[1]},
        }


def _observation(obs: Observation) -> str:
    return obs[0] + (f" (root rank {obs[1]})" if obs[1] is not None else "")


def flips(observed: list[tuple[int, Observation]]) -> list[Flip]:
    """Every change between consecutive runs of one case; ``observed`` is (round, observation) in round order."""
    return [Flip(r, before, after) for (_, before), (r, after) in pairwise(observed) if before != after]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0 < q <= 100) of ``values`` by the nearest-rank method: the smallest value with at
    least q% of the values at or below it (None for no values)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else None


@dataclass(frozen=True)
class Matched:
    """In how many of ``runs`` runs a verdict named what was expected."""

    matched: int
    runs: int

    def text(self) -> str:
        """``48/50``."""
        return f"{self.matched}/{self.runs}"

    def to_dict(self) -> dict:
        """``{"matched", "runs", "rate"}``."""
        return {"matched": self.matched, "runs": self.runs, "rate": round(self.matched / self.runs, 4)}


@dataclass
class CaseTally:
    """One case over the rounds: what each round observed, how often each mismatch appeared, and its fidelity: each
    run's latency from the failure forming to the verdict, and whether its root-cause rank and its first divergence
    were the expected ones (recorded only where the case expects a rank, a collective)."""

    case: str
    expected: str
    observed: list = field(default_factory=list)  # (round, (verdict, root rank)) in round order
    mismatches: Counter = field(default_factory=Counter)  # mismatch text -> runs it appeared in
    mismatched_runs: int = 0
    seconds_max: float = 0.0
    latencies: list = field(default_factory=list)  # seconds, one per run whose failure formed
    root_matches: list = field(default_factory=list)  # bools
    divergence_matches: list = field(default_factory=list)  # bools

    def latency(self, q: float) -> float | None:
        """The ``q``-th percentile of the latencies (None: no run's failure formed)."""
        return percentile(self.latencies, q)

    @property
    def root_rank(self) -> Matched | None:
        """How often the root-cause rank was the expected one (None: the case expects none)."""
        return Matched(sum(self.root_matches), len(self.root_matches)) if self.root_matches else None

    @property
    def first_divergence(self) -> Matched | None:
        """How often the first divergence named the expected collective and rank (None: the case expects none)."""
        found = self.divergence_matches
        return Matched(sum(found), len(found)) if found else None

    def figures(self) -> str:
        """``verdict 2.04/2.07 s after the failure (p50/p99); root rank 50/50; divergence 50/50``, or ""."""
        latency = self.fidelity()["verdict_latency"]
        parts = [f"verdict {latency['p50']:.2f}/{latency['p99']:.2f} s after the failure (p50/p99)"] if latency else []
        matched = (("root rank", self.root_rank), ("divergence", self.first_divergence))
        return "; ".join(parts + [f"{name} {m.text()}" for name, m in matched if m])

    def fidelity(self) -> dict:
        """The figures as data: ``verdict_latency`` (``p50``, ``p99``, ``runs``: seconds from the failure forming
        to the verdict), ``root_rank`` and ``first_divergence`` (:meth:`Matched.to_dict`); each null where it does
        not apply."""
        runs = len(self.latencies)
        latency = {"p50": round(self.latency(50), 4), "p99": round(self.latency(99), 4), "runs": runs} if runs else None
        return {
            "verdict_latency": latency,
            "root_rank": self.root_rank.to_dict() if self.root_rank else None,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
        }

    @property
    def verdicts(self) -> Counter:
        """Verdict -> runs, in the order the verdicts were first seen."""
        return Counter(obs[0] for _, obs in self.observed)

    @property
    def flips(self) -> list[Flip]:
        """Every change of verdict or root-cause rank between consecutive rounds."""
        return flips(self.observed)

    def counts(self) -> str:
        """``crashed 50`` or ``completed 49, hung 1``."""
        return ", ".join(f"{verdict} {n}" for verdict, n in self.verdicts.items())

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        ranks = Counter(obs for _, obs in self.observed)
        return {
            "case": self.case,
            "expected": self.expected,
            "runs": len(self.observed),
            "verdicts": dict(self.verdicts),
            "observations": [{"verdict": v, "root_rank": r, "runs": n} for (v, r), n in ranks.items()],
            "mismatched_runs": self.mismatched_runs,
            "mismatches": dict(self.mismatches),
            "flips": [f.to_dict() for f in self.flips],
            "seconds_max": round(self.seconds_max, 2),
            "fidelity": self.fidelity(),
        }


def tally(runs: list[tuple[int, Row]]) -> list[CaseTally]:
    """Group (round, row) pairs by case, in the order the cases first appear."""
    cases: dict[str, CaseTally] = {}
    for round_, row in runs:
        case = case_id(row.scenario, row.variant)
        entry = cases.setdefault(case, CaseTally(case, row.expected))
        entry.observed.append((round_, (row.observed, row.root_rank)))
        entry.mismatches.update(dict.fromkeys(row.mismatches, 1))
        entry.mismatched_runs += not row.ok
        entry.seconds_max = max(entry.seconds_max, row.seconds)
        entry.latencies += [row.latency] if row.latency is not None else []
        entry.root_matches += [row.root_matched] if row.root_matched is not None else []
        entry.divergence_matches += [row.divergence_matched] if row.divergence_matched is not None else []
    return list(cases.values())


@dataclass(frozen=True)
class Totals:
    """The soak in numbers: cases, runs, flipping cases, runs with a mismatch."""

    cases: int
    runs: int
    flips: int
    mismatches: int

    @property
    def ok(self) -> bool:
        """No flip and no mismatch."""
        return not self.flips and not self.mismatches


def totals(tallies: list[CaseTally]) -> Totals:
    """Sum the tallies up."""
    return Totals(
        cases=len(tallies),
        runs=sum(len(t.observed) for t in tallies),
        flips=sum(1 for t in tallies if t.flips),
        mismatches=sum(t.mismatched_runs for t in tallies),
    )


def case_lines(tallies: list[CaseTally]) -> list[str]:
    """One line per case (its verdict counts and fidelity figures), then its flips and mismatches, indented."""
    width = max((len(t.case) for t in tallies), default=0)
    lines = []
    for t in tallies:
        marks = ("  FLIP" if t.flips else "") + ("  MISMATCH" if t.mismatched_runs else "")
        figures = f"  ({t.figures()})" if t.figures() else ""
        lines.append(f"{t.case:<{width}}  {t.counts()}{marks}{figures}")
        shown = t.flips[:FLIPS_SHOWN]
        lines += [f"    FLIP {f.describe()}" for f in shown]
        if len(t.flips) > len(shown):
            lines.append(f"    ... and {len(t.flips) - len(shown)} more flips")
        lines += [f"    mismatch in {n}/{len(t.observed)} runs: {text}" for text, n in t.mismatches.items()]
    return lines


def summary_line(tallies: list[CaseTally], rounds: int, hogs: int, wall: float) -> str:
    """``soak: 32 cases x 50 rounds under 2 hogs: 0 flips, 0 mismatches in 1600 runs (912 s)``."""
    t = totals(tallies)
    return (
        f"soak: {_n(t.cases, 'case')} x {_n(rounds, 'round')} under {_n(hogs, 'hog')}: "
        f"{_n(t.flips, 'flip')}, {_n(t.mismatches, 'mismatch')} in {_n(t.runs, 'run')} ({wall:.0f} s)"
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def progress_line(round_: int, rounds: int, runs: int, tallies: list[CaseTally], seconds: float) -> str:
    """``round 3/50: 32 runs in 30.2 s; so far 0 flips, 0 mismatches`` (``runs``: this round's)."""
    t = totals(tallies)
    return (
        f"round {round_}/{rounds}: {_n(runs, 'run')} in {seconds:.1f} s; "
        f"so far {_n(t.flips, 'flip')}, {_n(t.mismatches, 'mismatch')}"
    )


# -- the hogs -------------------------------------------------------------------------------------


class Hogs:
    """``count`` busy processes for the length of a ``with`` block, all killed and reaped however it ends.

    Inside the block a default-handled SIGTERM raises SystemExit, so the block's exit runs (the launcher then
    leaves SIGTERM alone, as it only takes over a default handler). ``stopped`` counts the hogs reaped,
    ``survivors`` lists any that would not die.
    """

    def __init__(self, count: int):
        self.count = count
        self.procs: list[subprocess.Popen] = []
        self.stopped = 0
        self.survivors: list[int] = []
        self._previous = None

    @property
    def pids(self) -> list[int]:
        """Every hog's pid."""
        return [p.pid for p in self.procs]

    def __enter__(self) -> Hogs:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            for _ in range(self.count):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", HOG_CODE, str(os.getpid())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
            for proc in self.procs:
                try:
                    proc.wait(timeout=10)
                    self.stopped += 1
                except subprocess.TimeoutExpired:
                    self.survivors.append(proc.pid)
        finally:
            if self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous)
                self._previous = None


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


# -- the command ----------------------------------------------------------------------------------


def add_parser(sub) -> None:
    """Add the ``soak`` subcommand to an argparse subparsers object."""
    parser = sub.add_parser(
        "soak", help="run every scenario case N rounds under K CPU hogs; report verdict counts, flips, mismatches"
    )
    parser.add_argument("paths", nargs="*", help="scenario files or directories (default: the built-in scenarios)")
    parser.add_argument(
        "--rounds", default=str(ROUNDS.default), help=f"rounds, {ROUNDS.kind} (default {ROUNDS.default})"
    )
    parser.add_argument(
        "--hogs", default=str(HOGS.default), help=f"busy processes, {HOGS.kind} (default {HOGS.default})"
    )
    parser.add_argument("--seed", default="0", help="the worlds' seed, an int (default 0)")
    parser.add_argument(
        "--json", metavar="PATH", help="also write the counts and fidelity figures (per case) as JSON to PATH"
    )


def _json_path(path: str | None) -> str | None:
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder):
        raise ConfigError(f"--json {path!r}: not a file in an existing directory")
    return path


def main(args) -> int:
    """Run the soak for parsed ``args``; returns the exit code (bad input raises DDPFaultsError first)."""
    rounds = ROUNDS.from_text(str(args.rounds), "--rounds")
    hogs = HOGS.from_text(str(args.hogs), "--hogs")
    json_path = _json_path(args.json)
    options = RunSpec(seed=PARAM["seed"].from_text(str(args.seed), "--seed"))  # before the scenarios import torch
    cases = discover(args.paths or None)
    if not cases:
        raise DDPFaultsError(f"no scenarios found in {' '.join(args.paths) or 'the built-ins'}")
    for case in cases:
        case.resolve(options)  # a case invalid for its world: the ScenarioError now, before any hog or world
    started, runs, done, interrupted, last = time.monotonic(), [], 0, False, {}
    print(f"soak: {_n(len(cases), 'case')} x {_n(rounds, 'round')} under {_n(hogs, 'hog')}", flush=True)
    with Hogs(hogs) as hog_set:
        try:
            for round_ in range(1, rounds + 1):
                round_started = time.monotonic()
                for case in cases:
                    row = run_case(case, options)
                    print(unusual_run(round_, row, last), end="", flush=True)
                    last[case.id] = (row.observed, row.root_rank)
                    runs.append((round_, dataclasses.replace(row, result=None)))  # the counts are all that stay
                done = round_
                seconds = time.monotonic() - round_started
                print(progress_line(round_, rounds, len(cases), tally(runs), seconds), flush=True)
        except KeyboardInterrupt:
            interrupted = True
    wall = time.monotonic() - started
    tallies = tally(runs)
    print("\n".join(case_lines(tallies)))
    print(f"hogs: {hog_set.count} started, {hog_set.stopped} stopped" + _survivors(hog_set))
    if interrupted:
        print(f"interrupted (Ctrl-C) after {_n(done, 'complete round')}")
    print(summary_line(tallies, done, hogs, wall), flush=True)
    if json_path is not None:
        write_json(json_path, _document(tallies, rounds, done, hog_set, wall, interrupted), what="--json", indent=2)
    if interrupted:
        return 130
    return 0 if totals(tallies).ok and not hog_set.survivors else 1


def unusual_run(round_: int, row: Row, last: dict) -> str:
    """The world's whole report (its seed and replay command, every rank's error, stack and output) when ``row``
    mismatched its expectation or flipped from the case's previous round; else nothing."""
    case = case_id(row.scenario, row.variant)
    before = last.get(case)
    what = [f"mismatch: {'; '.join(row.mismatches)}"] if row.mismatches else []
    if before is not None and before != (row.observed, row.root_rank):
        what.append(f"FLIP: {_observation((row.observed, row.root_rank))}, was {_observation(before)}")
    if not what:
        return ""
    report = (row.result.report() if row.result is not None else "").replace("\n", "\n    ")
    return f"round {round_}, {case}: {' / '.join(what)}\n    {report}\n"


def _survivors(hog_set: Hogs) -> str:
    return f", {len(hog_set.survivors)} SURVIVED: {hog_set.survivors}" if hog_set.survivors else ""


def _document(tallies: list[CaseTally], rounds: int, done: int, hog_set: Hogs, wall: float, interrupted: bool):
    t = totals(tallies)
    return {
        "rounds": rounds,
        "rounds_done": done,
        "interrupted": interrupted,
        "hogs": {
            "count": hog_set.count,
            "pids": hog_set.pids,
            "stopped": hog_set.stopped,
            "survivors": hog_set.survivors,
        },
        "cases": [c.to_dict() for c in tallies],
        "runs": t.runs,
        "flips": t.flips,
        "mismatches": t.mismatches,
        "ok": t.ok and not hog_set.survivors and not interrupted,
        "seconds": round(wall, 2),
    }
