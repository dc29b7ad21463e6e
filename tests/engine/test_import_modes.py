"""Rank functions defined in test files work under each of pytest's import modes."""

import subprocess
import sys
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
def test_function_in_a_test_file_runs_in_the_ranks(tmp_path, mode):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_userfile.py").write_text(TEST_FILE)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--import-mode={mode}", "sub"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
