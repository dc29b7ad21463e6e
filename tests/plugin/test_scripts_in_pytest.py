"""Scripts in a pytest session, as functions are: ``ddp_world.run_script``, script scenarios in fresh working
directories, a bare ``run_script`` in a test, every world in the JSON report and JUnit, replica checks that fail.

One session (a subprocess, real gloo worlds, run once for both tests) runs the user files below;
``resume_train.py`` saves ``model.pt`` in its working directory and, finding one there, resumes from it on rank 0
only (after DDP was built): its replicas then differ though the world completes.
"""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pluginruns import assert_no_orphans, run_once

RESUME = (Path(__file__).resolve().parents[1] / "support" / "scripts" / "resume_train.py").read_text()

SCENARIOS = """
import ddpfaults

EQUAL = ddpfaults.Expect("completed", values_equal=True)
first = ddpfaults.script_scenario("resume_train.py", name="first", expect=EQUAL)
second = ddpfaults.script_scenario("resume_train.py", name="second", expect=EQUAL)
"""

WHERE = """
import os


def where(ctx):
    return os.getcwd(), sorted(os.listdir("."))
"""

TESTS = """
import os

import ddpfaults
import rankfns_cwd

EQUAL = ddpfaults.Expect("completed", values_equal=True)


def test_through_the_fixture(ddp_world):
    result = ddp_world.run_script("resume_train.py", world_size=2, expect=EQUAL)
    assert [r.wrapped[0]["type"] for r in result.ranks] == ["Linear", "Linear"]


def test_replicas_that_differ_fail(ddp_world, tmp_path):
    ddp_world.run_script("resume_train.py", world_size=2, cwd=tmp_path, expect=EQUAL)
    ddp_world.run_script("resume_train.py", world_size=2, cwd=tmp_path, expect=EQUAL)  # resumes on rank 0 only


def test_functions_run_where_asked(ddp_world, tmp_path):
    assert ddp_world.run(rankfns_cwd.where, world_size=2).values[0][0] == os.getcwd()
    assert ddp_world.run(rankfns_cwd.where, world_size=2, cwd=tmp_path).values == [(str(tmp_path), [])] * 2
    assert ddpfaults.run_world(rankfns_cwd.where, world_size=2).values[0][0] == os.getcwd()  # back home after a job


def test_bare_run_script(tmp_path):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_train.py")
    assert ddpfaults.run_script(script, world_size=2, cwd=tmp_path).outcome == "completed"
"""


@pytest.fixture
def session(tmp_path_factory):
    """The one session over every file below, with ``-v`` and a JUnit XML file: (result, report document, its
    directory)."""
    files = {
        "resume_train": RESUME,
        "rankfns_cwd": WHERE,
        "scenario_scripts": SCENARIOS,
        "test_scripts": TESTS,
        "resume_by_flag": BY_FLAG,
        "test_resume": RESUME_TESTS,
    }
    result, document, directory = run_once(tmp_path_factory, "scripts_in_pytest", files, "-v", "--junitxml=junit.xml")
    assert_no_orphans(document)
    return result, document, directory


def _outcomes(result, module: str) -> dict:
    """How many of ``module``'s items passed and failed, from the session's ``-v`` lines."""
    lines = [line for line in result.outlines if line.startswith(f"{module}::")]
    return {word: sum(f" {word.upper()}" in line for line in lines) for word in ("passed", "failed")}


def test_scripts_run_in_pytest_like_functions(session):
    result, document, directory = session
    assert _outcomes(result, "scenario_scripts.py") == {"passed": 2, "failed": 0}, result.stdout.str()
    assert _outcomes(result, "test_scripts.py") == {"passed": 3, "failed": 1}, result.stdout.str()
    # the second script scenario passes: the first one's model.pt stayed in the first world's own directory
    result.stdout.fnmatch_lines(["*scenario_scripts.py::first PASSED*", "*scenario_scripts.py::second PASSED*"])
    result.stdout.fnmatch_lines(
        [
            "*replicas differ: module #0 (Linear, wrapped in DDP at resume_train.py:* in main) ends with a different "
            "state per rank: rank 0 *, rank 1 *",
        ]
    )
    assert not (directory / "model.pt").exists(), "a fresh directory per world: nothing left in the caller's"
    worlds = [
        (w["nodeid"].split("::")[-1], w["function"], (w["expectation"] or {}).get("held"))
        for w in document["worlds"]
        if not w["nodeid"].startswith("test_resume.py")
    ]
    assert worlds == [
        ("first", "resume_train.py", True),
        ("second", "resume_train.py", True),
        ("test_through_the_fixture", "resume_train.py", True),
        ("test_replicas_that_differ_fail", "resume_train.py", True),
        ("test_replicas_that_differ_fail", "resume_train.py", False),
        *[("test_functions_run_where_asked", "rankfns_cwd.py:where", None)] * 3,
        ("test_bare_run_script", "resume_train.py", None),  # no fixture, no expectation: recorded all the same
    ]
    junit = ET.parse(directory / "junit.xml").getroot()
    bare = junit.find(".//testcase[@name='test_bare_run_script']")
    assert {p.get("name"): p.get("value") for p in bare.iter("property")}["ddpfaults.verdict"] == "completed"


BY_FLAG = (Path(__file__).resolve().parents[1] / "support" / "scripts" / "resume_by_flag.py").read_text()

RESUME_TESTS = """
import os

from ddpfaults.faults import RankKilled

# fixed: a long stall: no hang is expected; a restart's rendezvous waits are never taken for one
RUN = dict(world_size=2, faults=[RankKilled(rank=1, step=3)], max_restarts=1, stall=20)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_by_flag.py")


def _cwd(tmp_path):
    (tmp_path / "config.py").write_text("lr = 0.05\\nsteps = 6\\n")
    return tmp_path


def test_resumed_equivalent(ddp_world, tmp_path):
    restart = "--ckpt {run_dir} --init-from resume"
    ddp_world.run_script(SCRIPT, ["--ckpt", "{run_dir}"], cwd=_cwd(tmp_path), restart_argv=restart,
                         expect="resumed equivalent", **RUN)


def test_resume_that_differs(ddp_world, tmp_path):
    restart = "--ckpt {run_dir} --init-from resume --lose optimizer"
    ddp_world.run_script(SCRIPT, ["--ckpt", "{run_dir}"], cwd=_cwd(tmp_path), restart_argv=restart,
                         expect="resumed equivalent", **RUN)
"""


def test_an_expectation_naming_the_resume_runs_the_check_and_fails_on_a_resume_that_differs(session):
    result, document, _ = session  # four runs of a world, two of them restarted
    assert _outcomes(result, "test_resume.py") == {"passed": 1, "failed": 1}, result.stdout.str()
    result.stdout.fnmatch_lines(["*expected the resume check to find {'equivalent': True}, observed resume differs*"])
    assert [w["nodeid"] for w in document["worlds"] if w["nodeid"].startswith("test_resume.py")] == [
        "test_resume.py::test_resumed_equivalent",
        "test_resume.py::test_resume_that_differs",
    ]
