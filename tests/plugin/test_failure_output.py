"""A failing test shows each world's report once: when its own assertion message is the world's report
(``assert ..., result.report()``), the plugin adds no second copy of the sections (every rank's output tail was
printed twice: in the assertion and in the sections); with a bare assert it adds them."""

from pluginruns import assert_no_orphans, isolate, run

TESTS = """
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


def test_each_report_section_is_shown_once_per_failure(pytester, monkeypatch):
    isolate(pytester, monkeypatch, test_output=TESTS)
    result, document = run(pytester, "-p", "no:randomly")
    result.assert_outcomes(failed=2)
    # pytest's short summary repeats each assertion's whole message where it runs on CI (pytest.compat.running_on_ci):
    # that is pytest's one-line index of the failures, not a section of ours, so only the failures are counted
    text = result.stdout.str().split("short test summary info")[0]
    failures = text.split("_ test_with_a_bare_assert _")
    assert len(failures) == 2, text
    for failure in failures:
        assert failure.count("rank 1 says hello") == 1, failure
        assert failure.count("rank 1 traceback") == 1, failure
        assert failure.count("2-rank gloo world CRASHED") == 1, failure
    assert "ddpfaults: rank 1 traceback" in failures[1], "the bare assert's failure gets the plugin's sections"
    assert_no_orphans(document)
