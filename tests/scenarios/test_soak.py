"""The soak command: counting and flip logic on fake rows; hogs that die on every way out; the command itself in
real worlds under a real hog (tests/support/soak_scenarios.py: one case that completes, one that crashes)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from ddpfaults.judge.checks.fidelity import formed_at, verdict_time
from ddpfaults.matrix import Row, run_case
from ddpfaults.scenario import discover
from ddpfaults.soak import Flip, Hogs, Totals, case_lines, percentile, summary_line, tally, totals, unusual_run
from ddpfaults.spec import RunSpec
from processes import EVENT_GUARD, alive, descendants, interruptible

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
TINY = os.path.join(ROOT, "tests", "support", "soak_scenarios.py")
RUN_TIMEOUT = EVENT_GUARD  # a guard: a cold fork server under a hog on a busy 2-core machine


def _row(variant, observed, root_rank=None, mismatches=(), expected="completed"):
    return Row("s", variant, expected, observed, "no failure", 0.5, list(mismatches), root_rank=root_rank)


# -- counting and flips (pure) ------------------------------------------------------------------------


def test_stable_cases_are_counted_per_verdict_with_no_flip():
    runs = [(r, _row("ok", "completed")) for r in (1, 2, 3)]
    runs += [(r, _row("boom", "crashed", 1, expected="crashed on rank 1")) for r in (1, 2, 3)]
    tallies = tally(runs)
    assert [(t.case, t.counts(), t.flips) for t in tallies] == [
        ("s[ok]", "completed 3", []),
        ("s[boom]", "crashed 3", []),
    ]
    assert totals(tallies).ok and totals(tallies).runs == 6
    assert case_lines(tallies) == ["s[ok]    completed 3", "s[boom]  crashed 3"]
    assert (
        summary_line(tallies, 3, 2, 12.4)
        == "soak: 2 cases x 3 rounds under 2 hogs: 0 flips, 0 mismatches in 6 runs (12 s)"
    )


def test_a_verdict_that_changes_between_rounds_is_a_flip_and_a_mismatch():
    miss = "expected completed, observed hung"
    runs = [(1, _row("v", "completed")), (2, _row("v", "hung", 2, [miss])), (3, _row("v", "completed"))]
    (t,) = tally(runs)
    assert t.counts() == "completed 2, hung 1"
    assert t.flips == [Flip(2, ("completed", None), ("hung", 2)), Flip(3, ("hung", 2), ("completed", None))]
    assert t.mismatched_runs == 1 and dict(t.mismatches) == {miss: 1}
    assert case_lines([t]) == [
        "s[v]  completed 2, hung 1  FLIP  MISMATCH",
        "    FLIP round 2: hung (root rank 2), was completed",
        "    FLIP round 3: completed, was hung (root rank 2)",
        f"    mismatch in 1/3 runs: {miss}",
    ]
    assert summary_line([t], 3, 1, 1.0) == "soak: 1 case x 3 rounds under 1 hog: 1 flip, 1 mismatch in 3 runs (1 s)"
    assert not totals([t]).ok
    assert t.to_dict()["flips"][0] == {
        "round": 2,
        "before": {"verdict": "completed", "root_rank": None},
        "after": {"verdict": "hung", "root_rank": 2},
    }


def test_the_same_verdict_blaming_another_rank_is_a_flip_without_a_mismatch():
    runs = [(1, _row("v", "crashed", 1, expected="crashed")), (2, _row("v", "crashed", 3, expected="crashed"))]
    (t,) = tally(runs)
    assert t.counts() == "crashed 2" and t.mismatched_runs == 0
    assert t.flips == [Flip(2, ("crashed", 1), ("crashed", 3))]
    assert totals([t]) == Totals(cases=1, runs=2, flips=1, mismatches=0)
    assert [o["root_rank"] for o in t.to_dict()["observations"]] == [1, 3]


def test_a_mismatch_in_every_round_is_counted_per_run_and_is_no_flip():
    miss = "expected hung, observed completed"
    (t,) = tally([(r, _row("w", "completed", mismatches=[miss], expected="hung")) for r in (1, 2)])
    assert t.flips == [] and t.mismatched_runs == 2
    assert case_lines([t]) == ["s[w]  completed 2  MISMATCH", f"    mismatch in 2/2 runs: {miss}"]


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unordered
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([0.3], 50) == percentile([0.3], 99) == 0.3 and percentile([], 50) is None
    assert (percentile([1.0, 2.0], 50), percentile([1.0, 2.0], 99)) == (1.0, 2.0)


def test_each_case_publishes_its_verdict_latency_and_how_often_rank_and_divergence_matched():
    """A hang case over four rounds: latencies 2.03-2.1 s after the deadlock formed, rank 1 named in three runs, the
    first divergence right in two; a case expecting no rank or collective publishes latency only; a completed case
    publishes nothing."""
    hung = [
        dataclasses.replace(
            _row("hang", "hung", r, expected="hung on rank 1 in all_reduce"),
            latency=lat,
            root_matched=r == 1,
            divergence_matched=div,
        )
        for r, lat, div in ((1, 2.05, True), (1, 2.03, True), (1, 2.1, False), (0, 2.04, False))
    ]
    crashed = [dataclasses.replace(_row("crash", "crashed", 1, expected="crashed"), latency=0.52) for _ in (1, 2)]
    tallies = tally([(i + 1, row) for i, row in enumerate(hung)] + [(i + 1, row) for i, row in enumerate(crashed)])
    tallies += tally([(1, _row("ok", "completed"))])
    hang, crash, ok = tallies
    assert hang.to_dict()["fidelity"] == {
        "verdict_latency": {"p50": 2.04, "p99": 2.1, "runs": 4},
        "root_rank": {"matched": 3, "runs": 4, "rate": 0.75},
        "first_divergence": {"matched": 2, "runs": 4, "rate": 0.5},
    }
    assert crash.to_dict()["fidelity"] == {
        "verdict_latency": {"p50": 0.52, "p99": 0.52, "runs": 2},
        "root_rank": None,
        "first_divergence": None,
    }
    assert ok.to_dict()["fidelity"] == {"verdict_latency": None, "root_rank": None, "first_divergence": None}
    lines = case_lines([hang, crash, ok])
    assert lines[0] == (
        "s[hang]   hung 4  FLIP  (verdict 2.04/2.10 s after the failure (p50/p99); root rank 3/4; divergence 2/4)"
    )
    assert "s[crash]  crashed 2  (verdict 0.52/0.52 s after the failure (p50/p99))" in lines
    assert "s[ok]     completed 1" in lines


def test_a_latency_on_a_rounding_boundary_reads_the_same_in_the_line_and_the_data():
    """0.015004 s is 0.015 in the data, which prints 0.01; the line must print what the data holds, not 0.02."""
    (case,) = tally([(1, dataclasses.replace(_row("crash", "crashed", expected="crashed"), latency=0.015004))])
    latency = case.to_dict()["fidelity"]["verdict_latency"]
    assert latency["p50"] == 0.015
    assert f"(verdict {latency['p50']:.2f}/{latency['p99']:.2f} s after" in case_lines([case])[0]


def test_a_real_hang_cases_figures_come_from_its_own_data():
    """all_ranks_train[uneven_naive] (4 ranks: rank 1's loader is short, it finishes while the others wait in the
    next gradient all_reduce): the expected rank and collective are named, and the latency runs to the verdict from
    the deadlock forming, which the world's own timeline places: not before rank 1 finished nor before any other
    rank's last step began, not after the verdict."""
    (case,) = [c for c in discover() if c.id == "all_ranks_train[uneven_naive]"]
    row = run_case(case, RunSpec())
    result = row.result
    assert row.ok and (row.root_matched, row.divergence_matched) == (True, True), result.report()
    formed, verdict = formed_at(result), verdict_time(result)
    assert formed is not None and row.latency == pytest.approx(verdict - formed)
    finished = [e["t"] for e in result.ranks[1].events if e["k"] == "finished"]
    last_steps = [max(e["t"] for e in r.events if e["k"] == "step") for r in result.ranks if r.rank != 1]
    assert max(finished + last_steps) <= formed <= verdict, (formed, finished, last_steps, verdict)


def test_a_run_that_flips_or_mismatches_prints_its_worlds_report_as_it_happens():
    """A rare event can be read and replayed: the soak prints such a run's whole report (seed, replay command, every
    rank's end) at once; a run like its case's previous one prints nothing."""
    text = "ddpfaults: 2-rank gloo world CRASHED\nreplay: python -m ddpfaults run s.py:s --seed 0"
    world = SimpleNamespace(report=lambda: text)  # a WorldResult's report(), all unusual_run asks of it
    crashed_on = {r: dataclasses.replace(_row("v", "crashed", r, expected="crashed"), result=world) for r in (1, 3)}
    last = {}
    assert unusual_run(1, crashed_on[1], last) == ""  # the first round: nothing to flip from
    last["s[v]"] = ("crashed", 1)
    assert unusual_run(2, crashed_on[1], last) == ""
    printed = unusual_run(2, crashed_on[3], last)
    assert printed.startswith("round 2, s[v]: FLIP: crashed (root rank 3), was crashed (root rank 1)\n")
    assert "\n    replay: python -m ddpfaults run s.py:s --seed 0\n" in printed
    missed = dataclasses.replace(crashed_on[1], mismatches=["expected hung, observed crashed"])
    assert unusual_run(3, missed, last).startswith("round 3, s[v]: mismatch: expected hung, observed crashed\n")


# -- hogs ---------------------------------------------------------------------------------------------


def _cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_hogs_spin_and_are_killed_when_the_block_raises():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="inside"):
        with Hogs(2) as hogs:
            pids = hogs.pids
            assert len(pids) == 2 and alive(pids) == pids
            deadline = time.monotonic() + EVENT_GUARD
            while min(_cpu_ticks(p) for p in pids) < 10 and time.monotonic() < deadline:  # 0.1 s of CPU each
                # fixed: the poll interval: the event ends the wait, this only spaces the looks
                time.sleep(0.05)
            assert min(_cpu_ticks(p) for p in pids) >= 10
            raise RuntimeError("inside")
    assert alive(pids) == [] and hogs.stopped == 2 and hogs.survivors == []
    assert signal.getsignal(signal.SIGTERM) is previous


# -- the command --------------------------------------------------------------------------------------


def _soak(*args, out):
    return subprocess.Popen(
        [sys.executable, "-m", "ddpfaults", "soak", *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        preexec_fn=interruptible,
    )


def _watch(proc, until=None) -> set:
    """Every process seen below ``proc`` until it exits (or ``until(seen)`` is true); fails after RUN_TIMEOUT.

    Each hog seen is reniced to 19: these tests need a hog to exist and die, not its load, and at nice 0 it took a
    core from the other workers of a ``pytest -n`` run for the whole soak."""
    seen, niced, deadline = set(), set(), time.monotonic() + RUN_TIMEOUT
    while proc.poll() is None and not (until and until(seen)):
        assert time.monotonic() < deadline, "the soak did not finish in time"
        seen.update(descendants(proc.pid))
        for hog in _hog_pids(seen - niced):
            niced.add(hog)
            try:
                os.setpriority(os.PRIO_PROCESS, hog, 19)
            except OSError:  # gone already
                pass
        # fixed: the poll interval: the event ends the wait, this only spaces the looks
        time.sleep(0.05)
    return seen


def _ranks(soak_pid, pids) -> list[int]:
    """The live processes of ``pids`` that the soak did not start itself: ranks, forked by its fork server."""
    found = []
    for pid in alive(pids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != soak_pid:
                    found.append(pid)
        except (OSError, ValueError, IndexError):
            pass
    return found


def _hog_pids(pids) -> list[int]:
    found = []
    for pid in alive(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"while True" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _gone(pids, seconds: float = EVENT_GUARD) -> list[int]:
    """``pids`` still alive after ``seconds`` (the fork server exits when it notices its parent has gone)."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        # fixed: the poll interval: the event ends the wait, this only spaces the looks
        time.sleep(0.05)
    return alive(pids)


@pytest.mark.slow
def test_soak_two_rounds_under_a_hog_counts_verdicts_and_leaves_nothing_behind(tmp_path):
    with open(tmp_path / "out.txt", "wb") as out:
        proc = _soak("--rounds", "2", "--hogs", "1", TINY, "--json", str(tmp_path / "soak.json"), out=out)
    try:
        seen = _watch(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, output
    data = json.loads((tmp_path / "soak.json").read_text())
    hogs = data["hogs"]["pids"]
    assert len(hogs) == 1 and set(hogs) <= seen and data["hogs"]["stopped"] == 1
    assert alive(hogs) == [], "a hog outlived the soak"
    assert _gone(seen) == [], f"processes of the soak (ranks, fork server) left: {_gone(seen)}"
    assert len(seen) > 1 + 2  # the hog, the fork server and at least one world's 2 ranks were seen
    lines = output.splitlines()
    assert lines[0] == "soak: 2 cases x 2 rounds under 1 hog"
    assert lines[1].startswith("round 1/2: 2 runs in ") and lines[1].endswith("so far 0 flips, 0 mismatches")
    assert lines[2].startswith("round 2/2: 2 runs in ")
    assert lines[3] == "reduce_steps[clean]  completed 2"
    assert re.fullmatch(
        r"reduce_steps\[crash\]  crashed 2  \(verdict (\d+\.\d\d)/(\d+\.\d\d) s after the failure \(p50/p99\); "
        r"root rank 2/2\)",
        lines[4],
    ), lines[4]
    assert lines[5] == "hogs: 1 started, 1 stopped"
    assert lines[6].startswith("soak: 2 cases x 2 rounds under 1 hog: 0 flips, 0 mismatches in 4 runs (")
    assert len(lines) == 7, output
    assert [(c["case"], c["verdicts"], c["observations"][0]["root_rank"]) for c in data["cases"]] == [
        ("reduce_steps[clean]", {"completed": 2}, None),
        ("reduce_steps[crash]", {"crashed": 2}, 1),
    ]
    assert (data["runs"], data["flips"], data["mismatches"], data["ok"]) == (4, 0, 0, True)
    clean, crash = (c["fidelity"] for c in data["cases"])
    assert clean == {"verdict_latency": None, "root_rank": None, "first_divergence": None}
    latency = crash["verdict_latency"]
    assert latency["runs"] == 2 and 0 <= latency["p50"] <= latency["p99"] < 60
    assert f"verdict {latency['p50']:.2f}/{latency['p99']:.2f} s" in lines[4]
    assert (crash["root_rank"], crash["first_divergence"]) == ({"matched": 2, "runs": 2, "rate": 1.0}, None)


@pytest.mark.slow
def test_a_soak_stopped_mid_round_by_ctrl_c_prints_its_counts_and_leaves_nothing(tmp_path):
    """Ctrl-C after the first round, while a world runs: the counts so far, exit 130, and no hog, rank or fork
    server left. (SIGTERM and SIGKILL: the hogs' part is the next test; a launcher's ranks dying on either is
    tests/engine/test_teardown.py's.)"""
    out_path = tmp_path / "out.txt"
    with open(out_path, "wb") as out:
        proc = _soak("--rounds", "1000", "--hogs", "1", TINY, out=out)  # one hog: a second would starve other tests
    try:
        seen = _watch(proc, until=lambda seen: "round 1/1000" in out_path.read_text())
        assert proc.poll() is None, out_path.read_text()
        seen.update(descendants(proc.pid))
        hogs = _hog_pids(seen)
        assert len(hogs) == 1 and _ranks(proc.pid, seen), seen
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=EVENT_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    output = out_path.read_text()
    assert alive(hogs) == [], f"a hog outlived the soak:\n{output}"
    assert _gone(seen) == [], f"processes of the soak left: {_gone(seen)}\n{output}"
    assert proc.returncode == 130, output
    assert "hogs: 1 started, 1 stopped" in output, output
    assert "reduce_steps[clean]  completed " in output, output
    assert re.search(r"\ninterrupted \(Ctrl-C\) after (\d+) complete rounds?\n", output), output
    last = output.splitlines()[-1]
    assert re.fullmatch(
        r"soak: 2 cases x \d+ rounds? under 1 hog: 0 flips, 0 mismatches in \d+ runs \(\d+ s\)", last
    ), output


HOG_OWNER = """
import time
from ddpfaults.soak import Hogs
with Hogs(1) as hogs:
    print(hogs.pids[0], flush=True)
    # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_hogs_die_with_a_soak_that_is_terminated_or_killed(signum):
    """The soak's hogs inside a process stopped by SIGTERM (it exits 143 through the hogs' clean-up) or SIGKILL (no
    clean-up runs: the hogs die with their parent, PR_SET_PDEATHSIG). Not a whole soak: what else a soak starts is a
    launcher's (tests/engine/test_teardown.py stops one by both signals mid-world)."""
    owner = subprocess.Popen([sys.executable, "-c", HOG_OWNER], stdout=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        hog = int(owner.stdout.readline())
        assert alive([hog]) == [hog]
        os.setpriority(os.PRIO_PROCESS, hog, 19)  # it must exist and die, not load the other tests' workers
        owner.send_signal(signum)
        try:
            owner.wait(timeout=EVENT_GUARD)  # only a guard against a hang: its exit is the event waited for
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the hogs' owner outlived its {signum.name}: {_signal_state(owner.pid)}") from None
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait()
    assert owner.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 128 + signal.SIGTERM)
    # a hog at nice 19 on a loaded machine may not have run its first line yet: it exits once it gets the CPU
    assert _gone([hog]) == [], f"the hog outlived its owner's {signum.name}"


def _signal_state(pid: int) -> str:
    """A process's signal masks and state, from ``/proc`` (a signal blocked or ignored there is inherited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "; ".join(line.strip() for line in f if line.startswith(("State", "Sig", "Shd")))
    except OSError as exc:
        return f"no /proc status ({exc})"


def _bad_world_module(tmp_path) -> str:
    """A scenario whose fault names rank 5 of the default 4-rank world: found only when the case is resolved."""
    path = tmp_path / "scenario_bad_rank.py"
    path.write_text(
        "import ddpfaults\nfrom ddpfaults.faults import RankCrash\n\n"
        "@ddpfaults.scenario(faults=[RankCrash(rank=5, step=1)])\ndef bad_rank(ctx):\n    pass\n"
    )
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "0", TINY], "rounds must be an int >= 1, got 0 (from --rounds)"),
        (["--rounds", "two", TINY], "rounds must be an int >= 1, got 'two' (from --rounds)"),
        (["--hogs", "-1", TINY], "hogs must be an int >= 0, got -1 (from --hogs)"),
        (["--seed", "1.5", TINY], "seed must be an int from -2**63 to 2**64-1, got '1.5' (from --seed)"),
        (["missing_dir/scenario_x.py"], "does not exist"),
        (["--json", "no/such/dir/out.json", TINY], "not a file in an existing directory"),
        ([_bad_world_module], "scenario bad_rank: "),
    ],
)
def test_soak_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    args = [a(tmp_path) if callable(a) else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "ddpfaults", "soak", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EVENT_GUARD,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpfaults: error:") and message in lines[0], proc.stderr
