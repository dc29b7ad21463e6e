"""The HTML page's header counts a world failed when pytest does: a plain ``assert`` on a world without an
expectation fails its test, and the page counts it, as pytest does (it read "no expectation" before)."""

import re

from pluginruns import assert_no_orphans, isolate, run

TESTS = """
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


def test_the_page_counts_a_plain_assert_failure_as_pytest_does(pytester, monkeypatch):
    isolate(pytester, monkeypatch, test_counts=TESTS)
    result, document = run(pytester, "--ddpfaults-html=worlds.html")
    result.assert_outcomes(passed=2, failed=1)
    tests = {w["nodeid"].split("::")[1]: w.get("test") for w in document["worlds"]}
    assert tests == {
        "test_plain_assert_fails": "failed",
        "test_plain_assert_holds": "passed",
        "test_expectation_holds": "passed",
    }
    page = (pytester.path / "worlds.html").read_text()
    assert re.search(r"<p id=tally data-failed=1 data-checked=2 data-worlds=3>", page), page[:2000]
    assert "<b class=tally-head>1 of 3 failed</b> · 1 passed · 1 without an expectation" in page
    assert_no_orphans(document)
