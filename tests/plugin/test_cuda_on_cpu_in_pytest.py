"""``cuda_on_cpu`` in a pytest session: the marker, the option and the environment variable turn the CUDA mapping on
for a GPU-written script run by ``ddp_world.run_script``; what the marker declares wins over the environment."""

from pathlib import Path

from pluginruns import assert_no_orphans, isolate, run

GPU_TRAIN = (Path(__file__).resolve().parents[1] / "support" / "scripts" / "gpu_train.py").read_text()

TESTS = """
import pytest

import ddpfaults


@pytest.mark.ddpfaults(cuda_on_cpu=True)
def test_marked(ddp_world):
    result = ddp_world.run_script("gpu_train.py", world_size=2, expect=ddpfaults.Expect("completed"))
    assert result.spec.cuda_on_cpu


def test_by_the_session(ddp_world):
    result = ddp_world.run_script("gpu_train.py", world_size=2)
    assert result.outcome == "completed", result.report()
"""


def test_the_option_and_the_marker_map_cuda_to_the_cpu(pytester, monkeypatch):
    isolate(pytester, monkeypatch, gpu_train=GPU_TRAIN, test_gpu=TESTS)
    result, document = run(pytester, "-v", "--ddpfaults-cuda-on-cpu")
    result.assert_outcomes(passed=2)
    assert [w["cuda_on_cpu"] for w in document["worlds"]] == [True, True]
    assert_no_orphans(document)


def test_the_marker_wins_over_the_environment_turning_it_off(pytester, monkeypatch):
    isolate(pytester, monkeypatch, gpu_train=GPU_TRAIN, test_gpu=TESTS)
    monkeypatch.setenv("DDPFAULTS_CUDA_ON_CPU", "false")
    result, document = run(pytester, "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_gpu.py::test_marked PASSED*", "*test_gpu.py::test_by_the_session FAILED*"])
    assert [w["cuda_on_cpu"] for w in document["worlds"]] == [True, False]
    assert_no_orphans(document)
