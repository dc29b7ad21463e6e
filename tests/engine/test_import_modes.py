"""Rank functions defined in test files work under each of pytest's import modes."""

import textwrap

import pytest

TEST_FILE = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import ddpfaults

    def fn(ctx):
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t)

    def test_world():
        result = ddpfaults.run_world(fn, world_size=2)
        assert result.outcome == "completed", result.report()
        assert result.values == [2.0, 2.0]
    """
)


@pytest.mark.parametrize("mode", ["prepend", "append", "importlib"])
def test_function_in_a_test_file_runs_in_the_ranks(pytester, mode):
    """In this process (pytester's in-process run: the ranks come from this process's fork server, warm or cold),
    the user's test file imported the way ``mode`` imports it."""
    pytester.mkpydir("sub")
    (pytester.path / "sub" / "__init__.py").unlink()  # a plain directory of test files, no package
    (pytester.path / "sub" / "test_userfile.py").write_text(TEST_FILE)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", f"--import-mode={mode}", "sub")
    assert result.ret == 0, "\n".join(result.outlines + result.errlines)
    result.assert_outcomes(passed=1)
