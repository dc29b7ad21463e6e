"""The resume check's files and arguments in real script worlds: each run starts from a copy of the working
directory (a script reading ``./config.py`` is checked), ``{run_dir}`` keeps a path outside it apart, a path the
two runs share is refused, restarted attempts take ``restart_argv``; and ``python -m ddpfaults run --check-resume``
exits 1 on a resume that differs."""

import os

import pytest

import ddpfaults
from cli import ddpfaults_cli
from ddpfaults.faults import RankKilled
from processes import WORLD_GUARD

# fixed: a long stall: no hang is expected; a restart's waits (a rank re-importing torch) are never one
STALL = 20


pytestmark = pytest.mark.usefixtures("own_cwd")  # the resume check copies the working directory: a small one

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scripts", "resume_by_flag.py")
KILL = [RankKilled(rank=1, step=3)]


@pytest.fixture
def workdir(tmp_path):
    """A working directory holding the script's ./config.py (and nothing else)."""
    (tmp_path / "config.py").write_text("lr = 0.05\nsteps = 6\n")
    return tmp_path


def _check(workdir, argv, restart_argv, **more):
    return ddpfaults.run_script(
        SCRIPT,
        argv,
        world_size=2,
        faults=KILL,
        max_restarts=1,
        check_resume=True,
        restart_argv=restart_argv,
        cwd=workdir,
        stall=STALL,
        **more,
    )


def test_a_script_reading_its_config_resuming_by_a_flag_into_run_dir_is_checked_bit_equal(workdir):
    result = _check(workdir, ["--ckpt", "{run_dir}/ckpt"], "--ckpt {run_dir}/ckpt --init-from resume")
    assert result.outcome == "completed", result.report()
    assert result.resume["equivalent"] is True and result.resume["bit_equal"], result.report()
    assert result.attempts[1]["steps"] == [3, 3], result.report()  # resumed from step 3, not started over
    assert sorted(os.listdir(workdir)) == ["config.py"]  # each run worked in a copy


def test_a_lost_optimizer_state_resumed_by_flag_is_caught_at_the_resumed_step(workdir):
    restart = ["--ckpt", "{run_dir}/ckpt", "--init-from", "resume", "--lose", "optimizer"]
    result = _check(workdir, ["--ckpt", "{run_dir}/ckpt"], restart)
    first = result.resume["first_difference"]
    assert (first["step"], first["cause"]) == (3, "optimizer_state"), result.report()


def test_a_checkpoint_path_both_runs_share_is_refused_naming_it_and_the_fix(workdir, tmp_path_factory):
    shared = str(tmp_path_factory.mktemp("scratch") / "run1")
    result = _check(workdir, ["--ckpt", shared, "--init-from", "auto"], None)
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"], result.report()
    finding = result.resume
    assert finding["equivalent"] is None and finding["first_difference"]["cause"] == "shared_file", result.report()
    detail = finding["first_difference"]["detail"]
    assert f"the uninterrupted run began at step 6 from {shared}/ckpt.pt, which the faulted run wrote" in detail
    assert "resume not checked:" in result.report() and "{run_dir}" in result.report()


def test_run_check_resume_exits_1_on_a_resume_that_differs_and_expect_resumed_equivalent_fails(
    workdir, capsys, monkeypatch
):
    """``run``'s exit codes, in this process (``python -m ddpfaults run`` as a process exits with what ``main``
    returns: tests/engine/test_resume_doors.py runs one)."""
    command = [
        "run", SCRIPT, "--world-size", "2", "--max-restarts", "1", "--stall", str(STALL), "--cwd", str(workdir),
        "--faults", "[RankKilled(rank=1, step=3)]",
        "--restart-args", "--ckpt {run_dir}/c --init-from resume --lose optimizer",
    ]  # fmt: skip
    args = ["--", "--ckpt", "{run_dir}/c"]
    differs = ddpfaults_cli(capsys, monkeypatch, *command, "--check-resume", *args, cwd=workdir)
    assert differs.returncode == 1, differs.stdout + differs.stderr
    assert "resume differs from step 3" in differs.stdout
    expected = ddpfaults_cli(capsys, monkeypatch, *command, "--expect", "resumed equivalent", *args, cwd=workdir)
    assert expected.returncode == 1 and "MISMATCH" in expected.stdout, expected.stdout + expected.stderr
    held = ddpfaults_cli(
        capsys, monkeypatch, *command, "--expect", "resume differs from step 3: optimizer_state", *args, cwd=workdir
    )
    assert held.returncode == 0, held.stdout + held.stderr


def test_a_dcp_checkpoint_directory_both_runs_share_is_refused(tmp_path):
    import restartfns

    shared = str(tmp_path / "dcp")
    result = ddpfaults.run_world(
        restartfns.dcp_in, world_size=2, kwargs={"directory": shared}, faults=KILL, max_restarts=1,
        check_resume=True, stall=STALL, startup=WORLD_GUARD,
    )  # fmt: skip
    first = result.resume["first_difference"]
    assert result.resume["equivalent"] is None and first["cause"] == "shared_file", result.report()
    assert f"the uninterrupted run began at step 6 from {shared}/step-6/" in first["detail"], first["detail"]
    assert "which the faulted run wrote" in first["detail"]
