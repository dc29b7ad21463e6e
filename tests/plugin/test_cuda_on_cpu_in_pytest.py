"""``cuda_on_cpu`` in a pytest session: the option turns the CUDA mapping on for a GPU-written script run by
``ddp_world.run_script`` and wins over the environment turning it off; what a marker declares wins over both. One
session (a subprocess, real gloo worlds) with ``DDPFAULTS_CUDA_ON_CPU=false`` and ``--ddpfaults-cuda-on-cpu``."""

from pathlib import Path

from pluginruns import assert_no_orphans, isolate, run

GPU_TRAIN = (Path(__file__).resolve().parents[1] / "support" / "scripts" / "gpu_train.py").read_text()

TESTS = """
import pytest

import ddpfaults


@pytest.mark.ddpfaults(cuda_on_cpu=True)
def test_marked_on(ddp_world):
    result = ddp_world.run_script("gpu_train.py", world_size=2, expect=ddpfaults.Expect("completed"))
    assert result.spec.cuda_on_cpu


def test_by_the_session(ddp_world):
    result = ddp_world.run_script("gpu_train.py", world_size=2)
    assert result.outcome == "completed", result.report()


@pytest.mark.ddpfaults(cuda_on_cpu=False)
def test_marked_off(ddp_world):
    result = ddp_world.run_script("gpu_train.py", world_size=2)
    assert result.outcome == "completed", result.report()
"""


def test_the_option_beats_the_environment_and_a_marker_beats_both(pytester, monkeypatch):
    isolate(pytester, monkeypatch, gpu_train=GPU_TRAIN, test_gpu=TESTS)
    monkeypatch.setenv("DDPFAULTS_CUDA_ON_CPU", "false")
    result, document = run(pytester, "-v", "--ddpfaults-cuda-on-cpu")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_gpu.py::test_marked_on PASSED*",
            "*test_gpu.py::test_by_the_session PASSED*",
            "*test_gpu.py::test_marked_off FAILED*",
        ]
    )
    assert [w["cuda_on_cpu"] for w in document["worlds"]] == [True, True, False]
    assert_no_orphans(document)
