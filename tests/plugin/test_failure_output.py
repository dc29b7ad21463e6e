"""How a failing test shows its worlds, in one pytest session (a subprocess, run once for the tests here):

- each world's report once: when a test's own assertion message is the world's report (``assert ...,
  result.report()``), the plugin adds no second copy of the sections (every rank's output tail was printed twice: in
  the assertion and in the sections); with a bare assert it adds them;
- the HTML page's header counts a world failed when pytest does: a plain ``assert`` on a world without an expectation
  fails its test, and the page counts it, as pytest does (it read "no expectation" before).
"""

import re

import pytest

from pluginruns import assert_no_orphans, run_once

OUTPUT_TESTS = """
import torch
import torch.distributed as dist

from ddpfaults import run_world


def shout_then_fail(ctx):
    print(f"rank {ctx.rank} says hello", flush=True)
    if ctx.rank == 1:
        raise KeyError("mask")
    dist.all_reduce(torch.ones(1))


def test_with_the_report_as_message():
    result = run_world(shout_then_fail, world_size=2)
    assert result.outcome == "completed", result.report()


def test_with_a_bare_assert():
    result = run_world(shout_then_fail, world_size=2)
    assert result.outcome == "completed"
"""


COUNTS_TESTS = """
import torch
import torch.distributed as dist

import ddpfaults


def reduce_once(ctx):
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def test_plain_assert_fails(ddp_world):
    result = ddp_world.run(reduce_once, world_size=2)
    assert result.values == [3.0, 3.0]


def test_plain_assert_holds(ddp_world):
    result = ddp_world.run(reduce_once, world_size=2)
    assert result.values == [2.0, 2.0]


def test_expectation_holds(ddp_world):
    ddp_world.run(reduce_once, world_size=2, expect=ddpfaults.Expect("completed"))
"""


@pytest.fixture
def session(tmp_path_factory):
    """Both files in one session with the HTML page: (result, report document, its directory)."""
    files = {"test_output": OUTPUT_TESTS, "test_counts": COUNTS_TESTS}
    result, document, directory = run_once(
        tmp_path_factory, "failure_output", files, "-p", "no:randomly", "--ddpfaults-html=worlds.html"
    )
    assert_no_orphans(document)
    return result, document, directory


def test_each_report_section_is_shown_once_per_failure(session):
    result, _, _ = session
    result.assert_outcomes(passed=2, failed=3)
    # pytest's short summary repeats each assertion's whole message where it runs on CI (pytest.compat.running_on_ci):
    # that is pytest's one-line index of the failures, not a section of ours, so only the failures are counted
    text = result.stdout.str().split("short test summary info")[0]
    text = text[text.index("_ test_with_the_report_as_message _") :]  # test_counts.py's failure comes first
    failures = text.split("_ test_with_a_bare_assert _")
    assert len(failures) == 2, text
    for failure in failures:
        assert failure.count("rank 1 says hello") == 1, failure
        assert failure.count("rank 1 traceback") == 1, failure
        assert failure.count("2-rank gloo world CRASHED") == 1, failure
    assert "ddpfaults: rank 1 traceback" in failures[1], "the bare assert's failure gets the plugin's sections"


def test_the_page_counts_a_plain_assert_failure_as_pytest_does(session):
    _, document, directory = session
    tests = {w["nodeid"].split("::")[1]: w.get("test") for w in document["worlds"]}
    assert tests == {
        "test_with_the_report_as_message": "failed",
        "test_with_a_bare_assert": "failed",
        "test_plain_assert_fails": "failed",
        "test_plain_assert_holds": "passed",
        "test_expectation_holds": "passed",
    }
    page = (directory / "worlds.html").read_text()
    assert re.search(r"<p id=tally data-failed=3 data-checked=4 data-worlds=5>", page), page[:2000]
    assert "<b class=tally-head>3 of 5 failed</b> · 1 passed · 1 without an expectation" in page
