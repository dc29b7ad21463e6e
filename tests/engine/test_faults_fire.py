"""No silent passes from faults: in real worlds, a fault that never takes effect is an error of run_world,
run_script, the CLI and the ddp_world fixture (unless allowed), is listed in the result's ``unfired``, and a fault
counts as fired only where it had its effect (a checkpoint fault at a step without a save, a loader limit a
loader never reaches: not fired)."""

import json
import os

import pytest

import rankfns
from cli import ddpfaults_cli
from ddpfaults import Outcome, RankState, run_script, run_world
from ddpfaults.errors import FaultNeverFired
from ddpfaults.faults import (
    EmptyBatch,
    RankCrash,
    Straggler,
    TornCheckpointWrite,
    UnevenInputs,
    WriterKilledMidSave,
)
from ddpfaults.judge.results import UnfiredFault, WorldResult
from plugin_user import ddp_world_session

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
PLAIN = os.path.join(SCRIPTS, "plain_train.py")


# -- run_world ----------------------------------------------------------------------------------


def test_a_step_that_never_comes_raises_fault_never_fired_carrying_the_result():
    crash = RankCrash(rank=1, step=9)
    with pytest.raises(FaultNeverFired) as info:
        run_world(rankfns.all_reduce_steps, world_size=2, faults=[crash], kwargs={"steps": 3})
    result = info.value.result
    assert isinstance(result, WorldResult) and result.outcome == Outcome.COMPLETED, result.report()
    assert result.fired == [] and result.unfired == [UnfiredFault(0, repr(crash), (1,))]
    text = str(info.value)
    assert f"FaultNeverFired: {crash!r} never fired, though rank 1 finished" in text, text
    assert "require_faults_fire=False" in text and "world completed" in text
    assert f"{crash!r} never fired, though rank 1 finished" in result.report()  # the report says so too


def test_an_empty_batch_for_a_rank_that_never_asks_for_a_batch_raises():
    with pytest.raises(FaultNeverFired) as info:
        run_world(rankfns.all_reduce_steps, world_size=2, faults=[EmptyBatch(rank=1, step=1)])
    assert [u.finished for u in info.value.result.unfired] == [(1,)]


def test_require_faults_fire_false_returns_the_result_with_its_unfired_faults():
    plan = [EmptyBatch(rank=0, step=1), RankCrash(rank=1, step=9)]
    result = run_world(rankfns.all_reduce_steps, world_size=2, faults=plan, require_faults_fire=False)
    assert result.outcome == Outcome.COMPLETED
    no_loader = (  # the function draws no DataLoader batch: the hint names the seams it used
        "it acts through batches drawn from a DataLoader, which the ranks it targets never used (the seams they "
        "used: collectives of its own, ctx.step)"
    )
    assert result.unfired == [UnfiredFault(0, repr(plan[0]), (0,), no_loader), UnfiredFault(1, repr(plan[1]), (1,))]
    data = json.loads(result.to_json())
    assert data["unfired"] == [
        {"index": 0, "fault": repr(plan[0]), "finished": [0], "hint": no_loader},
        {"index": 1, "fault": repr(plan[1]), "finished": [1], "hint": ""},
    ]
    assert WorldResult.from_dict(data).unfired == result.unfired


def test_a_fault_whose_rank_crashed_before_its_step_had_no_chance():
    """Rank 1 crashes at step 1: its Straggler at step 3 never fires, and that is no error (rank 1 never finished);
    the unfired list still names it, with no finished rank."""
    plan = [RankCrash(rank=1, step=1), Straggler(rank=1, step=3, seconds=0.1)]
    result = run_world(rankfns.all_reduce_steps, world_size=3, faults=plan)
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    assert [f.index for f in result.fired] == [0]
    assert result.unfired == [UnfiredFault(1, repr(plan[1]), ())]
    assert "never fired (no rank it targets finished" in result.report()


def test_a_fault_on_a_rank_that_finished_in_a_crashed_world_still_raises():
    """The rule is per fault, not per world: rank 2 finishes its function although the world crashed (the crash
    is on rank 1 after its last collective), so rank 2's Straggler at a step that never comes had every chance."""
    plan = [RankCrash(rank=1, step=3), Straggler(rank=2, step=7, seconds=0.1)]
    with pytest.raises(FaultNeverFired) as info:
        run_world(rankfns.iterate_loader, world_size=3, faults=plan, kwargs={"batches": 4, "barrier": True})
    result = info.value.result
    assert result.outcome == Outcome.CRASHED and result.ranks[2].state == RankState.FINISHED, result.report()
    assert result.unfired == [UnfiredFault(1, repr(plan[1]), (2,))]


# -- a fault fires only where it had its effect ------------------------------------------------


def test_a_checkpoint_fault_at_a_step_without_a_save_never_fires():
    """Rank 0 saves at step 2 only. A torn write planned at step 1 tears nothing: before, it was counted as fired
    on every rank (armed at the step's start); now it is unfired, and an error since every rank finished."""
    for fault in (TornCheckpointWrite(writer=0, step=1), WriterKilledMidSave(writer=0, step=1)):
        with pytest.raises(FaultNeverFired) as info:
            run_world(rankfns.save_checkpoints, world_size=3, faults=[fault])
        result = info.value.result
        assert result.outcome == Outcome.COMPLETED and result.fired == [], result.report()
        assert result.unfired == [UnfiredFault(0, repr(fault), (0,))]


def test_a_checkpoint_fault_at_a_step_with_a_save_fires_on_the_writer_only():
    torn = run_world(rankfns.save_checkpoints, world_size=3, faults=[TornCheckpointWrite(writer=0, step=2)])
    assert torn.outcome == Outcome.COMPLETED and torn.unfired == [], torn.report()
    assert [(f.rank, f.step) for f in torn.fired] == [(0, 2)], torn.report()
    assert torn.fired[0].how.startswith("held the writer of checkpoint.pt with"), torn.fired
    killed = run_world(rankfns.save_checkpoints, world_size=3, faults=[WriterKilledMidSave(writer=0, step=2)])
    assert killed.outcome == Outcome.CRASHED and killed.root_rank == 0, killed.report()
    assert [(f.rank, f.step) for f in killed.fired] == [(0, 2)] and "SIGKILLed the writer" in killed.fired[0].how


@pytest.mark.parametrize("batches", [3, 5])
def test_uneven_inputs_fire_only_when_they_cut_a_loader_short(batches):
    """A limit of 3 (or 5) batches on a loader of 3 cuts nothing: before, the loader's natural end after exactly
    3 batches was recorded as the fault stopping it; now it never fires. A limit of 2 cuts the third batch off."""
    with pytest.raises(FaultNeverFired) as info:
        run_world(rankfns.iterate_loader, world_size=2, faults=[UnevenInputs(rank=0, batches=batches)])
    result = info.value.result
    assert result.fired == [] and result.values == [[[0, 1], [2, 3], [4, 5]]] * 2
    cut = run_world(rankfns.iterate_loader, world_size=2, faults=[UnevenInputs(rank=0, batches=2)])
    assert cut.values == [[[0, 1], [2, 3]], [[0, 1], [2, 3], [4, 5]]] and cut.unfired == []
    assert [f.how for f in cut.fired] == ["stopped a DataLoader iterator after 2 batch(es)"]


# -- run_script, the CLI, the ddp_world fixture -----------------------------------------------------


def test_run_script_raises_for_a_fault_whose_step_never_comes():
    with pytest.raises(FaultNeverFired) as info:
        run_script(PLAIN, world_size=2, faults=[EmptyBatch(rank=1, step=40)])
    result = info.value.result
    assert result.outcome == Outcome.COMPLETED and result.unfired[0].finished == (1,), result.report()
    allowed = run_script(PLAIN, world_size=2, faults=[EmptyBatch(rank=1, step=40)], require_faults_fire=False)
    assert allowed.outcome == Outcome.COMPLETED and allowed.unfired == result.unfired


def test_cli_run_fails_on_an_unfired_fault_unless_allowed(tmp_path, capsys, monkeypatch):
    command = ["run", "tests/support/rankfns.py:all_reduce_steps", "--world-size", "2"]
    command += ["--faults", "[RankCrash(rank=1, step=9)]"]
    out = tmp_path / "world.json"
    done = ddpfaults_cli(capsys, monkeypatch, *command, "--json", out)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "world COMPLETED" in done.stdout  # the report is printed all the same
    assert "FaultNeverFired: RankCrash(rank=1, step=9" in done.stderr and "--allow-unfired" in done.stderr
    assert json.loads(out.read_text())["worlds"][0]["unfired"][0]["finished"] == [1]
    allowed = ddpfaults_cli(capsys, monkeypatch, *command, "--allow-unfired")
    assert allowed.returncode == 0 and "FaultNeverFired" not in allowed.stderr, allowed.stdout + allowed.stderr


def test_the_ddp_world_fixture_fails_a_test_whose_fault_never_fired_once(tmp_path_factory):
    """Without expect the fixture applies run_world's rule; with one, the Expect's faults_fire reports it: once.
    (plugin_user.ddp_world_session: test_fixture.py's three tests.)"""
    result, document, _ = ddp_world_session(tmp_path_factory)
    result.stdout.fnmatch_lines(
        [
            "test_fixture.py::test_unfired FAILED*",
            "test_fixture.py::test_allowed PASSED*",
            "test_fixture.py::test_expected FAILED*",
        ]
    )
    text = result.stdout.str()
    for name in ("test_unfired", "test_expected"):
        section = text.split(f"_ {name} _", 1)[1].split("\nreplay: ", 1)[0]  # its failure, up to the replay line
        assert section.count("FaultNeverFired") == 1, section
    worlds = [w for w in document["worlds"] if w["nodeid"].startswith("test_fixture.py")]
    assert [w["unfired"][0]["finished"] for w in worlds] == [[1], [1], [1]]


def test_a_world_that_hung_before_a_preempts_step_names_the_hang_not_the_preempt():
    """Rank 0 waits in a barrier of its own at step 1 while rank 1 waits in that step's all_reduce: the world hangs
    there, and the Preempt of step 3 never has its moment. An expectation of completion lists the outcome, not
    "Preempt ... never fired" beside it."""
    from ddpfaults import Expect
    from ddpfaults.expect import Expectation
    from ddpfaults.faults import Preempt, RankOnlyBarrier

    plan = [RankOnlyBarrier(rank=0, step=1), Preempt(step=3)]
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=2, faults=plan, stall=1.0, require_faults_fire=False)
    assert result.outcome == Outcome.HUNG and [u.index for u in result.unfired] == [1], result.report()
    mismatches = Expectation.of(Expect("completed"), result).mismatches
    assert [m.kind for m in mismatches] == ["outcome"], mismatches
