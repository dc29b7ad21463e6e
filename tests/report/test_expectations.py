"""The reports say pass/fail: each world's expectation and whether it held, in the JSON document, on the HTML page,
and through the command line (``run --json`` -> ``html``)."""

from __future__ import annotations

import dataclasses
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

import rankfns
from ddpfaults import Check, Expect, FiredFault, Outcome, RankResult, RankState, WorldResult
from ddpfaults.__main__ import main as cli
from ddpfaults.errors import ReportFileError
from ddpfaults.expect import Expectation
from ddpfaults.judge.results import UnfiredFault
from ddpfaults.report.chrome_trace import trace_document
from ddpfaults.report.document import build_document, read_document, world_status, write_document
from ddpfaults.report.html import render_html
from processes import WORLD_GUARD

RANKFNS = str(Path(rankfns.__file__))


def crashed_world(faults=(), fired=()) -> WorldResult:
    """Rank 1 raised KeyError; rank 0 failed as collateral."""
    ranks = [
        RankResult(rank=0, state=RankState.RAISED, error="RuntimeError: Connection closed by peer", collateral=True),
        RankResult(rank=1, state=RankState.RAISED, error="KeyError: 'mask'", site="train.py:9 in loss"),
    ]
    return WorldResult(
        outcome=Outcome.CRASHED,
        ranks=ranks,
        root_cause="rank 1 raised KeyError: 'mask'",
        root_rank=1,
        reason="ended",
        elapsed=1.5,
        world_size=2,
        seed=3,
        function="train.py:train",
        faults=list(faults),
        fired=list(fired),
    )


def completed_world() -> WorldResult:
    ranks = [RankResult(rank=r, state=RankState.FINISHED, value=1.0) for r in range(2)]
    return WorldResult(Outcome.COMPLETED, ranks, "no failure", None, "ended", 0.5, 2, 3, function="train.py:train")


# -- the document ---------------------------------------------------------------------------------------------------


def test_each_world_carries_its_expectation_whether_it_held_and_the_mismatches_as_data():
    crashed = crashed_world(
        faults=["RankCrash(rank=1, step=1)", "Straggler(rank=0, step=9)"],
        fired=[FiredFault(0, "RankCrash(rank=1, step=1)", 1, 1, "on_step")],
    )
    held = Expectation.of(Expect.parse("crashed with KeyError on rank 1"), crashed_world())
    check = Check("rank 0 kept its value", lambda result: "rank 0 returned None")
    failed = Expectation.of(Expect(Outcome.HUNG, rank=0, collective="all_reduce", checks=(check,)), crashed)
    document = build_document(
        [crashed_world(), crashed, completed_world()],
        nodeids=["t.py::a", None, None],
        expectations=[held, failed, None],
    )
    assert json.loads(json.dumps(document)) == document, "plain JSON"
    first, second, third = document["worlds"]
    assert first["expectation"] == {
        "expect": {
            "outcome": "crashed",
            "rank": 1,
            "error": "KeyError",
            "collective": None,
            "root_cause": None,
            "values_equal": False,
            "faults_fire": True,
            "checks": [],
        },
        "text": "crashed with KeyError on rank 1",
        "held": True,
        "mismatches": [],
    }
    assert second["expectation"]["held"] is False
    assert second["expectation"]["expect"]["checks"] == ["rank 0 kept its value"]
    assert [(m["kind"], m["expected"], m["observed"]) for m in second["expectation"]["mismatches"]] == [
        ("outcome", "hung", "crashed"),
        ("rank", 0, 1),
        ("collective", "all_reduce", []),
        ("fault_never_fired", "Straggler(rank=0, step=9)", "never fired"),
        ("check", "rank 0 kept its value", "rank 0 returned None"),
    ]
    assert second["expectation"]["mismatches"][0]["text"] == "expected hung, observed crashed"
    assert third["expectation"] is None, "a world run without an expectation: null, not a pass"
    assert [world_status(w) for w in document["worlds"]] == ["passed", "failed", "unchecked"]
    assert build_document([second])["worlds"][0]["expectation"] == second["expectation"], "a world dict keeps its own"
    with pytest.raises(ReportFileError, match="expectations has 1 entries for 2 worlds"):
        build_document([crashed, crashed], expectations=[held])


def test_a_fault_whose_moment_never_came_is_not_listed_beside_an_outcome_that_differs():
    """A world that hung (here: crashed) before a Preempt's step: the outcome mismatch says what happened; "Preempt
    never fired" beside it would send the reader after the fault. A fault a finished rank never met stays listed,
    and so does every unfired fault when the outcome held."""
    plan = ["RankCrash(rank=1, step=1)", "Preempt(step=5)", "Straggler(rank=0, step=9)"]
    fired = [FiredFault(0, plan[0], 1, 1, "on_step")]
    unfired = [UnfiredFault(1, plan[1]), UnfiredFault(2, plan[2], finished=(0,))]
    world = dataclasses.replace(crashed_world(faults=plan, fired=fired), unfired=unfired)
    differs = Expectation.of(Expect.parse("completed"), world)
    assert [(m.kind, m.expected) for m in differs.mismatches] == [
        ("outcome", "completed"),
        ("fault_never_fired", "Straggler(rank=0, step=9)"),
    ]
    held = Expectation.of(Expect.parse("crashed"), world)
    assert [(m.kind, m.expected) for m in held.mismatches] == [
        ("fault_never_fired", "Preempt(step=5)"),
        ("fault_never_fired", "Straggler(rank=0, step=9)"),
    ]


def test_the_document_round_trips_through_the_file_and_the_trace_summary(tmp_path):
    failed = Expectation.of(Expect.parse("completed"), crashed_world())
    path = write_document(tmp_path / "r.json", [crashed_world(), completed_world()], expectations=[failed, None])
    document = read_document(path)
    assert document == build_document([crashed_world(), completed_world()], expectations=[failed.to_dict(), None])
    summaries = trace_document(document)["otherData"]["worlds"]
    assert [(s["status"], "expectation" in s) for s in summaries] == [("failed", True), ("unchecked", False)]
    assert summaries[0]["expectation"]["mismatches"][0]["kind"] == "outcome"


# -- the page -------------------------------------------------------------------------------------------------------


class _Page(HTMLParser):
    """Text per summary row (by ``data-world``), the tally's attributes, sections' statuses, the facts."""

    def __init__(self, page: str):
        super().__init__()
        self.rows, self.tally, self.sections, self.facts = {}, {}, [], {}
        self._row = self._in_tally = None
        self._dt = self._dd = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-status" in attrs:
            self._row = attrs["data-world"]
            self.rows[self._row] = {"status": attrs["data-status"], "cells": []}
        elif tag == "td" and self._row is not None:
            self.rows[self._row]["cells"].append("")
        elif attrs.get("id") == "tally":
            self.tally, self._in_tally = dict(attrs, text=""), True
        elif tag == "section" and "data-status" in attrs:
            self.sections.append((attrs["data-world"], attrs["data-status"]))
        elif tag == "dt" and self.sections:
            self._dt = ""
        elif tag == "dd" and self._dt is not None:
            self._dd = ""

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        elif tag == "p":
            self._in_tally = False
        elif tag == "dd" and self._dd is not None:
            self.facts.setdefault(self.sections[-1][0], []).append((self._dt, self._dd))
            self._dt = self._dd = None

    def handle_data(self, data):
        if self._row is not None and self.rows[self._row]["cells"]:
            self.rows[self._row]["cells"][-1] += data
        if self._in_tally:
            self.tally["text"] += data
        if self._dd is not None:
            self._dd += data
        elif self._dt is not None:
            self._dt += data


def test_page_shows_expected_and_observed_and_counts_failed_expectations_not_verdicts():
    """Four worlds: crashed as expected (a pass), completed as expected (a pass), crashed where a completion was
    expected (a failure), crashed with no expectation (neither). "1 of 4 failed", the failure listed first."""
    worlds = [crashed_world(), completed_world(), crashed_world(), crashed_world()]
    expectations = [
        Expectation.of(Expect.parse("crashed on rank 1"), worlds[0]),
        Expectation.of(Expect.parse("completed"), worlds[1]),
        Expectation.of(Expect.parse("completed"), worlds[2]),
        None,
    ]
    page = _Page(render_html(build_document(worlds, expectations=expectations)))
    assert page.tally["text"].startswith("1 of 4 failed · 2 passed · 1 without an expectation"), page.tally
    assert (page.tally["data-failed"], page.tally["data-checked"], page.tally["data-worlds"]) == ("1", "3", "4")
    assert list(page.rows) == ["2", "0", "1", "3"], "the failed world first, then the rest as they ran"
    assert page.sections == [("2", "failed"), ("0", "passed"), ("1", "passed"), ("3", "unchecked")]
    cells = {world: row["cells"] for world, row in page.rows.items()}
    # columns: #, test, result, expected, observed, what differed, ranks, seconds
    assert [cells[w][2] for w in ("2", "0", "1", "3")] == ["FAILED", "passed", "passed", "no expectation"]
    assert cells["0"][3:6] == ["crashed on rank 1", "crashed rank 1 raised KeyError: 'mask'", ""], "crashed: a pass"
    assert cells["2"][3:6] == [
        "completed",
        "crashed rank 1 raised KeyError: 'mask'",
        "expected completed, observed crashed",
    ]
    assert cells["3"][3] == "—" and cells["3"][5] == ""
    facts = dict(page.facts["2"])
    assert facts["expected"] == "completed — did not hold"
    assert facts["observed"] == "crashed: rank 1 raised KeyError: 'mask'"
    assert facts["differed: outcome"] == "expected completed, observed crashed"
    assert "expected" not in dict(page.facts["3"]), "no expectation, no expected row"


def test_page_without_any_expectation_says_so():
    page = _Page(render_html(build_document([crashed_world()])))
    assert page.tally["text"].startswith("1 world · no expectations to check"), page.tally
    assert page.tally["data-failed"] == "0" and page.rows["0"]["status"] == "unchecked"


# -- the command line: run --json, then html -----------------------------------------------------------------------


def test_cli_run_json_is_a_report_document_the_html_command_draws(tmp_path, capsys):
    """A real 2-rank world where rank 1 raises at step 1: once expected ("crashed on rank 1": held, exit 0), once
    mis-expected ("crashed on rank 0": failed, exit 1). Each --json file is a document with the expectation, and
    ``html`` draws it with the pass or the failure."""
    faults = "[RankCrash(rank=1, step=1)]"
    run = ["run", f"{RANKFNS}:all_reduce_steps", "--world-size", "2", "--faults", faults, "--timeout", str(WORLD_GUARD)]
    assert cli([*run, "--expect", "crashed on rank 1", "--json", str(tmp_path / "held.json")]) == 0
    assert "expected crashed on rank 1, observed crashed: OK" in capsys.readouterr().out
    assert cli([*run, "--expect", "crashed on rank 0", "--json", str(tmp_path / "failed.json")]) == 1
    out = capsys.readouterr().out
    assert "expected crashed on rank 0, observed crashed: MISMATCH" in out
    assert "- expected the root cause on rank 0, observed rank 1" in out
    for name, held in (("held", True), ("failed", False)):
        document = read_document(tmp_path / f"{name}.json")
        (world,) = document["worlds"]
        assert world["outcome"] == "crashed" and world["root_rank"] == 1 and world["world_size"] == 2
        assert world["expectation"]["held"] is held
        assert world["expectation"]["expect"]["outcome"] == "crashed"
        assert cli(["html", str(tmp_path / f"{name}.json")]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / f"{name}.html")
        page = _Page((tmp_path / f"{name}.html").read_text())
        assert page.tally["text"].startswith("0 of 1 failed" if held else "1 of 1 failed"), page.tally
        assert page.rows["0"]["status"] == ("passed" if held else "failed")
    assert [(m["kind"], m["expected"], m["observed"]) for m in world["expectation"]["mismatches"]] == [("rank", 0, 1)]


def test_cli_run_json_without_expect_has_a_null_expectation_and_a_bad_expect_runs_nothing(tmp_path, capsys):
    run = ["run", f"{RANKFNS}:all_reduce_steps", "--world-size", "2", "--timeout", str(WORLD_GUARD)]
    assert cli([*run, "--expect", "crashed on rank one", "--json", str(tmp_path / "bad.json")]) == 2
    assert "--expect: expect 'crashed on rank one': write one of 'completed'" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()
    assert cli([*run, "--json", str(tmp_path / "plain.json")]) == 0
    (world,) = read_document(tmp_path / "plain.json")["worlds"]
    assert world["outcome"] == "completed" and world["expectation"] is None


def timed_out_world() -> WorldResult:
    """Both ranks still training when the 5 s timeout came."""
    ranks = [RankResult(rank=r, state=RankState.RUNNING, last_step=165, timed_out=True) for r in range(2)]
    cause = "still training at the deadline: step 165 on every rank, last progress 0.02 s ago — raise the timeout (5 s)"
    # fixed: a value handed to a pure function or refused before any world starts: no real time passes
    return WorldResult(Outcome.TIMED_OUT, ranks, cause, None, "hard timeout of 5 s reached", 5.0, 2, 3, timeout=5.0)


def test_a_timed_out_world_is_expected_as_timed_out_and_a_mismatch_says_what_to_raise():
    world = timed_out_world()
    expect = Expect.parse("timed out")
    assert expect.outcome is Outcome.TIMED_OUT and expect.describe() == "timed out"
    assert Expectation.of(expect, world).held
    (mismatch,) = Expect.parse("completed").mismatches(world)
    assert (mismatch.kind, mismatch.expected, mismatch.observed) == ("outcome", "completed", "timed out")
    assert mismatch.text == f"expected completed, observed timed out: {world.root_cause}"
    assert [line.split()[:5] for line in world.report().splitlines() if line.startswith("   0 ")] == [
        ["0", "timed", "out", "running", "165"]
    ]


def test_the_page_draws_a_timed_out_world_with_its_own_badge_and_no_hang_point():
    page = render_html(build_document([timed_out_world(), crashed_world()]))
    assert "class='badge o-timed-out'>timed out</span>" in page and "o-timed out" not in page
    assert ".badge.o-timed-out{" in page and "verdicts: 1 crashed, 1 timed out" in page
    assert "hang-point" not in page.split("<section class='world o-timed-out", 1)[1].split("<section", 1)[0]
