"""Restarts (``max_restarts``), preemption (``Preempt``) and the resume check (``check_resume``) in real worlds."""

import os
import re
import subprocess
import sys

import pytest

import ddpfaults
import restartfns
from ddpfaults.engine import restarts
from ddpfaults.faults import Preempt, RankKilled
from ddpfaults.judge.checks import resume
from ddpfaults.judge.results import WorldResult
from ddpfaults.replay import world_command
from ddpfaults.scenario import builtin_dir, load_function
from processes import EVENT_GUARD

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.usefixtures("own_cwd")  # the resume check copies the working directory: a small one

# fixed: a long stall: no hang is expected; a restart's waits (a rank re-importing torch) are never one
STALL = 10

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scripts")


def test_a_killed_world_restarts_whole_with_its_files_and_its_attempt_counted():
    result = ddpfaults.run_world(
        restartfns.counting, world_size=2, faults=[RankKilled(rank=1, step=2)], max_restarts=2, stall=STALL
    )
    assert result.outcome == "completed", result.report()
    assert result.values == [(2, 1), (2, 1)]  # attempt 1 resumed at step 2 from attempt 0's file
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"]
    assert result.attempts[0]["root_rank"] == 1 and result.attempts[0]["steps"] == [2, 2]
    assert result.attempts[0]["fired"] == ["RankKilled(rank=1, step=2) fired on rank 1 at step 2 (on_step)"]
    assert result.attempts[1]["fired"] == []  # the kill targets attempt 0 only
    assert result.attempts[1]["warm"] and result.warm  # the standby world, warmed up while attempt 0 ran
    report = result.report()
    assert "attempts: 2" in report and "attempt 0: crashed" in report and "attempt 1: completed" in report
    assert "--max-restarts 2" in world_command(result)
    again = WorldResult.from_dict(result.to_dict())
    assert again.attempts == result.attempts


def test_restarts_stop_at_the_limit_and_a_later_attempt_s_fault_acts_there_only():
    faults = [RankKilled(rank=1, step=1), RankKilled(rank=0, step=1, attempt=1)]
    result = ddpfaults.run_world(restartfns.counting, world_size=2, faults=faults, max_restarts=1, stall=STALL)
    assert result.outcome == "crashed" and result.root_rank == 0, result.report()
    assert [a["outcome"] for a in result.attempts] == ["crashed", "crashed"]
    assert [a["root_rank"] for a in result.attempts] == [1, 0]


def test_a_fault_of_an_attempt_never_reached_is_unfired_without_a_chance():
    faults = [RankKilled(rank=1, step=1), RankKilled(rank=0, step=1, attempt=2)]
    result = ddpfaults.run_world(restartfns.counting, world_size=2, faults=faults, max_restarts=2, stall=STALL)
    assert result.outcome == "completed" and len(result.attempts) == 2, result.report()
    assert [(u.index, u.had_chance) for u in result.unfired] == [(1, False)]


def test_a_rank_that_outlives_its_grace_period_is_sigkilled():
    result = ddpfaults.run_world(
        restartfns.ignores_notice, world_size=2, faults=[Preempt(step=1, ranks=[1], grace=0.5)], stall=STALL
    )
    assert result.outcome == "crashed" and result.root_rank == 1, result.report()
    assert "SIGKILL" in result.root_cause
    assert result.preemption["notified"] == [1] and result.preemption["handled"] == [1]
    assert result.preemption["killed_after_grace"] == [1] and result.preemption["saved"] == []
    assert "SIGKILLed after the grace period: 1" in result.report()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["dcp.save", "dcp.async_save"])
def test_a_preempted_job_that_saved_with_dcp_is_reported_as_saved(asynchronous):
    result = ddpfaults.run_world(
        restartfns.dcp_saves_on_notice,
        world_size=2,
        kwargs={"asynchronous": asynchronous},
        faults=[Preempt(step=2, grace=20)],
        stall=STALL,
    )
    assert result.outcome == "completed" and result.values == [2, 2], result.report()
    assert result.preemption["handled"] == [0, 1] and result.preemption["saved"] == [0, 1], result.report()
    assert (result.preemption["last_checkpoint_step"], result.preemption["steps_lost"]) == (2, 0)
    saves = [e for r in result.ranks for e in r.events if e["k"] == "saved"]
    assert [(e["step"], e["file"]) for e in saves] == [(2, "step-2"), (2, "step-2")]


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_handler_that_exits_on_the_notice_is_the_preemption_not_a_rank_s_error(world_size):
    """Every rank's SIGTERM handler raises ``SystemExit(1)`` (a rank function's, a script's): each rank raised on
    its own, ended by the notice through its handler; the scheduler stopped the job, no rank is at fault."""
    function = ddpfaults.run_world(
        restartfns.exits_on_notice, world_size=world_size, faults=[Preempt(step=2)], stall=STALL
    )
    script = ddpfaults.run_script(
        os.path.join(SCRIPTS, "plain_train.py"),
        ["--exit-on-notice", "1"],
        world_size=world_size,
        faults=[Preempt(step=2)],
        stall=STALL,
    )
    every = "ranks 0, 1" if world_size == 2 else "ranks 0-3"
    for result in (function, script):
        assert result.outcome == "crashed" and result.root_rank is None, result.report()
        assert all(r.error == "SystemExit: 1" for r in result.ranks), result.report()
        assert result.cause.kind == "preemption" and result.cause.ranks == tuple(range(world_size)), result.report()
        assert f"sent the notice to every rank and {every} were ended by it; no rank at fault" in result.root_cause
        assert result.preemption["handled"] == list(range(world_size)) and result.preemption["saved"] == []


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_periodic_checkpoint_begun_before_the_notice_and_ended_after_it_is_no_save_after_it(world_size):
    """A thread writes step 1's checkpoint (1 s) while step 2 begins with the notice; the handler stops the ranks,
    which wait for that write and save nothing more: no rank saved after the notice, and the last checkpoint is
    step 1's (the step the write began at, not the one it ended in), one step lost."""
    result = ddpfaults.run_world(
        restartfns.periodic_save_over_the_notice, world_size=world_size, faults=[Preempt(step=2)], stall=STALL
    )
    assert result.outcome == "completed" and result.values == [2] * world_size, result.report()
    notice = {r.rank: next(e["t"] for e in r.events if e.get("effect") == "preempted") for r in result.ranks}
    saves = [(r.rank, e) for r in result.ranks for e in r.events if e["k"] == "saved"]
    assert len(saves) == world_size and all(e["step"] == 1 for _, e in saves), result.report()
    assert all(e["t"] - e["took"] < notice[rank] < e["t"] for rank, e in saves), saves  # it straddled the notice
    preemption = result.preemption
    assert preemption["handled"] == list(range(world_size)) and preemption["saved"] == [], result.report()
    assert (preemption["last_checkpoint_step"], preemption["steps_lost"]) == (1, 1), result.report()
    assert "saved after the notice by none" in result.report()


def test_dcp_is_tracked_when_imported_after_the_tracking_began():
    code = (
        "import sys; from ddpfaults.rank import dcp; dcp.track_saves(print)\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules\n"
        "import torch.distributed.checkpoint as c; from torch.distributed.checkpoint import save\n"
        "from torch.distributed.checkpoint import state_dict_saver as s\n"
        "print({f.__code__.co_filename for f in (c.save, c.async_save, save, s.save, s.async_save)} == {dcp.__file__})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=EVENT_GUARD)
    assert done.stdout.strip() == "True", done.stderr


def test_a_restarted_script_keeps_its_directory_gets_a_fresh_store_and_resumes_bit_equal(tmp_path):
    result = ddpfaults.run_script(
        os.path.join(SCRIPTS, "resume_loop.py"),
        world_size=2,
        faults=[RankKilled(rank=1, step=3)],
        max_restarts=1,
        check_resume=True,
        cwd=tmp_path,
        stall=STALL,
    )
    assert result.outcome == "completed", result.report()
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"]
    assert result.resume["equivalent"] is True, result.report()
    assert result.resume["steps"] == 6 and result.resume["final_identical"]
    assert "resumed bit-equal: 6 steps, final state identical" in result.report()
    restart = re.search(r"restart (\d) port (\d+)", result.ranks[0].output)
    assert restart.group(1) == "1"
    assert list(tmp_path.iterdir()) == []  # the check ran both runs in scratch directories of their own


def test_a_script_restart_shares_the_working_directory(tmp_path):
    result = ddpfaults.run_script(
        os.path.join(SCRIPTS, "resume_loop.py"),
        world_size=2,
        faults=[RankKilled(rank=1, step=3)],
        max_restarts=1,
        cwd=tmp_path,
        stall=STALL,
    )
    assert result.outcome == "completed" and len(result.attempts) == 2, result.report()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    assert result.attempts[1]["steps"] == [3, 3] or result.attempts[1]["steps"] == [2, 2]


RESUME = load_function(os.path.join(builtin_dir(), "scenario_resume.py") + ":resume_train")


@settings(max_examples=3, deadline=None, derandomize=True, database=None)
@given(rank=st.integers(0, 1), step=st.integers(1, 7))
def test_saving_and_restoring_everything_resumes_bit_equal_wherever_the_kill(rank, step):
    result = ddpfaults.run_world(
        RESUME, world_size=2, faults=[RankKilled(rank=rank, step=step)], max_restarts=1, check_resume=True, stall=STALL
    )
    assert result.outcome == "completed", result.report()
    assert result.resume["equivalent"], result.report()


RESUME_SCRIPT = os.path.join(builtin_dir(), "scripts", "train_resume.py")  # 8 optimizer steps, steps 0-8


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(rank=st.integers(0, 1), step=st.integers(0, 8))
@example(rank=0, step=0)  # killed before the first step: no checkpoint, the restart starts over
@example(rank=1, step=8)  # killed after the last step: the restart loads the last checkpoint and makes no step
def test_a_script_that_saves_and_restores_everything_resumes_bit_equal_wherever_the_kill(rank, step):
    result = ddpfaults.run_script(
        RESUME_SCRIPT,
        world_size=2,
        faults=[RankKilled(rank=rank, step=step)],
        max_restarts=1,
        check_resume=True,
        stall=STALL,
    )
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"], result.report()
    assert result.resume["equivalent"] and result.resume["steps"] == 8, result.report()


def test_a_script_that_restores_torch_s_rng_but_not_random_s_is_caught_naming_it():
    result = ddpfaults.run_script(
        RESUME_SCRIPT,
        ["--lose", "random"],
        world_size=2,
        faults=[RankKilled(rank=1, step=3)],
        max_restarts=1,
        check_resume=True,
        stall=STALL,
    )
    assert result.outcome == "completed", result.report()
    first = result.resume["first_difference"]
    assert (first["step"], first["cause"], first["ranks"]) == (3, "rng", [0, 1]), result.report()
    assert "the RNG state differs (python random): Python's random state was not restored" in first["detail"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_resume_check_whose_fault_never_ends_an_attempt_is_not_called_equivalent(world_size, monkeypatch):
    """At 4 ranks the script makes 4 steps per rank: a kill at step 5 never fires, nothing is restarted, nothing
    resumed; the check says so instead of "resumed bit-equal", and runs no uninterrupted run to compare with."""
    runs = []
    real = restarts.run_attempts
    monkeypatch.setattr(restarts, "run_attempts", lambda *args: runs.append(args[1]) or real(*args))
    result = ddpfaults.run_script(
        RESUME_SCRIPT,
        world_size=world_size,
        faults=[RankKilled(rank=1, step=16 // world_size + 1)],  # steps 0-8 at 2 ranks, 0-4 at 4
        max_restarts=1,
        check_resume=True,
        stall=STALL,
        require_faults_fire=False,
    )
    assert result.outcome == "completed" and len(result.attempts) == 1, result.report()
    assert not result.resume["equivalent"], result.report()
    assert result.resume["first_difference"]["cause"] == "not_resumed"
    assert "resume not checked: the faulted run was never restarted" in result.report()
    assert [len(plan) for plan in runs] == [1]  # the faulted run alone


def test_two_optimizers_stepping_in_turn_resume_equivalent_and_a_state_left_out_is_caught_at_its_own_step():
    """A GAN's two optimizers: killed at step 3 (each optimizer made 3 steps: records 0-5), resumed with both
    restored, the check calls it bit-equal; with the second optimizer's state left out, the difference is that
    optimizer's state at its own first resumed step (record 7), not a missing or extra step."""
    run = dict(world_size=2, faults=[RankKilled(rank=1, step=3)], max_restarts=1, check_resume=True, stall=STALL)
    kept = ddpfaults.run_world(restartfns.two_optimizers, **run)
    assert [a["outcome"] for a in kept.attempts] == ["crashed", "completed"], kept.report()
    assert kept.resume["bit_equal"], kept.report()
    lost = ddpfaults.run_world(restartfns.two_optimizers, kwargs={"restore_second": False}, **run)
    first = lost.resume["first_difference"]
    assert (first["step"], first["cause"], first["attempt"]) == (7, "optimizer_state", 1), lost.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_script_killed_between_its_two_optimizers_steps_resumes_bit_equal(world_size):
    """Counted by optimizer steps, a kill at step 3 lands between the second batch's two optimizer steps: rank 1 never
    runs step 3, its replica runs it and checkpoints, and the restart resumes after it: nothing lost, bit-equal. With
    the second optimizer's state left out, the difference is that state at its first resumed step (5)."""
    script = os.path.join(os.path.dirname(__file__), "..", "support", "scripts", "two_optimizers.py")
    run = dict(
        world_size=world_size, faults=[RankKilled(rank=1, step=3)], max_restarts=1, check_resume=True, stall=STALL
    )
    kept = ddpfaults.run_script(script, **run)
    assert kept.attempts[0]["steps"][1] == 3 and kept.resume["bit_equal"], kept.report()  # rank 1 stopped at 3
    lost = ddpfaults.run_script(script, ["--lose-second"], **run)
    first = lost.resume["first_difference"]
    assert (first["step"], first["cause"]) == (5, "optimizer_state"), lost.report()


@pytest.mark.parametrize("kind", ["function", "script"])
def test_at_four_ranks_a_full_resume_is_equivalent_to_rounding_and_says_why(kind):
    """DDP made anew reduces its first steps' gradients otherwise than a DDP that kept training: at 3+ ranks the sums
    differ in the last bits (at 2 they do not: the property tests above). The check calls the resume equivalent to
    rounding, not a lost state, and a state left out is still caught at the resumed step."""
    run = dict(world_size=4, faults=[RankKilled(rank=3, step=2)], max_restarts=1, check_resume=True, stall=STALL)
    result = ddpfaults.run_world(RESUME, **run) if kind == "function" else ddpfaults.run_script(RESUME_SCRIPT, **run)
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"], result.report()
    assert result.resume["equivalent"] and not result.resume["bit_equal"], result.report()
    assert result.resume["rounding"]["step"] >= 2 and result.resume["rounding"]["relative_difference"] < 1e-6
    assert "resumed equivalent to rounding" in result.report() and resume.REBUILT_DDP in result.report()
    if kind == "function":
        lost = ddpfaults.run_world(RESUME, kwargs={"optimizer": False}, **run)
        first = lost.resume["first_difference"]
        assert (first["step"], first["cause"]) == (2, "optimizer_state"), lost.report()
    else:  # killed mid-epoch (2 steps per epoch at 4 ranks), the epoch's data restarted from its beginning
        mid = dict(run, faults=[RankKilled(rank=3, step=1)])
        lost = ddpfaults.run_script(RESUME_SCRIPT, ["--lose", "position"], **mid)
        first = lost.resume["first_difference"]
        assert (first["step"], first["cause"]) == (1, "samples_replayed"), lost.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_hyperparameter_the_resume_forgot_is_caught_beyond_rounding_where_the_run_resumed(world_size):
    """Everything the check digests is restored, but the resumed optimizer has weight decay 0: at 4 ranks, where a
    full resume differs in the last bits, the final state's values still tell the loss from rounding."""
    run = dict(
        world_size=world_size, faults=[RankKilled(rank=1, step=3)], max_restarts=1, check_resume=True, stall=STALL
    )
    lost = ddpfaults.run_world(restartfns.forgets_weight_decay, **run)
    assert [a["outcome"] for a in lost.attempts] == ["crashed", "completed"], lost.report()
    first = lost.resume["first_difference"]
    assert (first["step"], first["cause"], first["attempt"]) == (3, "parameters", 1), lost.report()
    assert "more than rounding (1e-05)" in first["detail"]
    kept = ddpfaults.run_world(restartfns.forgets_weight_decay, kwargs={"forget": False}, **run)
    assert kept.resume["equivalent"], kept.report()


def test_a_restarted_world_s_preemption_is_the_world_s_each_attempt_keeps_its_own():
    from ddpfaults.faults import Plan
    from ddpfaults.judge.results import Outcome, WorldResult

    notice = {"step": 6, "notified": [0, 1], "handled": [], "saved": [], "steps_lost": 3}
    first = WorldResult(Outcome.CRASHED, [], "preempted", None, "ended", 1.0, preemption=notice)
    last = WorldResult(Outcome.COMPLETED, [], "", None, "ended", 1.0)
    merged = restarts.merge([first, last], Plan((), 2))
    assert merged.preemption == notice
    assert [a["preemption"] for a in merged.attempts] == [notice, None]
