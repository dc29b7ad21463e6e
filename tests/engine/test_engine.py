"""Real gloo worlds: verdicts, root causes, stacks, latency, and cleanup."""

import json
import os
import subprocess
import sys

import pytest

import rankfns
from cli import ddpfaults_cli
from ddpfaults import Outcome, RankState, errors, run_world
from ddpfaults.faults import RankCrash, SkippedCollective, Straggler
from processes import WORLD_GUARD, alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


def _last_progress(result) -> float:
    """Time of the last event a rank itself wrote (the launcher's "exited"/"killed" are not progress)."""
    return max(e["t"] for r in result.ranks for e in r.events if e["k"] not in ("exited", "killed"))


def test_world_completes_and_shares_a_dir():
    result = run_world(rankfns.share_a_file, world_size=4, seed=7, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED == "completed"
    assert [r.rank for r in result.ranks] == [0, 1, 2, 3]
    assert all(r.outcome == "completed" and r.error is None for r in result.ranks)
    texts, dirs, sizes, seeds = zip(*result.values, strict=True)
    assert set(texts) == {"from rank 0"} and set(sizes) == {4} and set(seeds) == {7}
    assert len(set(dirs)) == 1 and not os.path.exists(dirs[0]), "shared_dir must be removed after the world"


def test_values_come_back_in_rank_order():
    result = run_world(rankfns.all_reduce_steps, world_size=3, args=(3,))
    assert result.values == [27.0, 27.0, 27.0]
    assert all(r.last_step == 2 for r in result.ranks)


def test_crash_on_one_rank_is_root_cause_and_peers_are_collateral():
    crash = RankCrash(rank=1, step=2, exc=KeyError("segment_mask"))
    result = run_world(rankfns.all_reduce_steps, world_size=4, faults=[crash], peer_failure="exit")
    assert result.outcome == Outcome.CRASHED
    assert result.root_rank == 1
    assert "rank 1 raised KeyError: 'segment_mask'" in result.root_cause
    assert result.ranks[1].error == "KeyError: 'segment_mask'" and not result.ranks[1].collateral
    for r in (result.ranks[0], result.ranks[2], result.ranks[3]):
        assert r.outcome == Outcome.CRASHED and r.collateral, r
        assert "Connection closed by peer" in r.error or "Connection reset by peer" in r.error
    assert [f.describe() for f in result.fired] == [
        "RankCrash(rank=1, step=2, exc=KeyError('segment_mask')) fired on rank 1 at step 2 (on_step)"
    ]


def test_linger_turns_the_same_crash_into_a_hang():
    crash = RankCrash(rank=1, step=2, exc=KeyError("segment_mask"))
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=4, faults=[crash], peer_failure="linger", stall=1.0)
    assert result.outcome == Outcome.HUNG
    assert result.root_rank == 1 and "rank 1 raised KeyError: 'segment_mask'" in result.root_cause
    assert result.ranks[1].state == RankState.RAISED
    for r in (result.ranks[0], result.ranks[2], result.ranks[3]):
        assert r.state == RankState.BLOCKED and r.error is None
        assert "in all_reduce" in r.stack and "rankfns.py" in r.stack
        assert r.where.startswith("in all_reduce([1]) at rankfns.py")


def test_skipped_collective_is_a_hang_proved_within_the_stall_window():
    # fixed: the stall window the proof must beat (asserted); load calls no hang sooner (a starved rank computes)
    stall = 1.0
    result = run_world(rankfns.all_reduce_steps, world_size=4, stall=stall, faults=[SkippedCollective(rank=2, step=3)])
    assert result.outcome == Outcome.HUNG
    assert result.reason.startswith("deadlock proved"), result.reason  # tests/engine/test_proof.py says more
    latency = result.elapsed - _last_progress(result)
    assert latency < stall, f"hang verdict {latency:.2f} s after the last progress"
    assert result.root_rank == 2
    assert "rank 2 never called it (finished)" in result.divergence.describe()
    assert result.ranks[2].state == RankState.FINISHED
    for r in (result.ranks[0], result.ranks[1], result.ranks[3]):
        assert r.outcome == Outcome.HUNG
        assert "distributed_c10d.py" in r.stack and "in all_reduce" in r.stack


def test_busy_straggler_for_ten_stall_windows_is_not_hung():
    # fixed: what the test is about: a straggler busy for 10 such windows is no hang, whatever the machine's speed
    stall = 0.3
    result = run_world(
        rankfns.all_reduce_steps,
        world_size=4,
        stall=stall,
        timeout=WORLD_GUARD,
        faults=[Straggler(rank=0, step=1, seconds=10 * stall)],
    )
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.elapsed >= 10 * stall


def test_rank_idle_outside_collectives_is_slow_not_hung():
    # fixed: 0.3 s of stall against 1.5 s asleep: the rule (a sleeping rank is not waiting), not the clock, decides
    result = run_world(rankfns.sleep_outside_collective, world_size=3, args=(1.5,), stall=0.3, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()


def test_only_the_timeout_ends_an_idle_rank(fork_server):
    # the timeout checked fires once the world has certainly started: ten times a whole run of this world from the
    # fork server (its start and one all_reduce; the timed world reuses it warm), and 4 s at least
    started = run_world(rankfns.sleep_outside_collective, world_size=3, args=(0,))
    assert started.outcome == Outcome.COMPLETED, started.report()
    timeout = round(max(4.0, 10 * started.elapsed), 1)
    # fixed: a stall far below the sleep: the rule (a sleeping rank is not waiting), not the clock, keeps it unhung
    stall = 0.3
    result = run_world(
        rankfns.sleep_outside_collective, world_size=3, args=(WORLD_GUARD,), stall=stall, timeout=timeout
    )
    assert result.outcome == Outcome.HUNG
    assert result.reason == f"hard timeout of {timeout:g} s reached", result.report()
    assert result.ranks[0].state == RankState.RUNNING
    assert "sleep_outside_collective" in result.ranks[0].stack
    assert result.root_rank == 0 and "outside any collective" in result.root_cause
    assert timeout <= result.elapsed < timeout + 2.5


def test_collective_size_mismatch_reports_the_aborted_rank():
    # fixed: a short stall the crashing world must not trip: load never makes every rank wait (a starved rank computes)
    result = run_world(rankfns.mismatched_sizes, world_size=4, stall=1.0)
    assert result.outcome == Outcome.CRASHED, result.report()
    died = [r for r in result.ranks if r.state == RankState.DIED]
    assert len(died) == 1 and died[0].rank != 0, result.report()
    assert "SIGABRT" in died[0].error and "collective mismatch" in died[0].error
    assert died[0].where.startswith("died in") and "all_reduce" in died[0].stack
    assert result.root_rank == 0, "the rank at fault is the one that diverged, not the receiver gloo aborted"
    assert f"rank {died[0].rank} was killed by SIGABRT" in result.root_cause


def test_unpicklable_return_value_is_a_crash_naming_it():
    """Every rank returned a generator: each raised the same error, a common cause with no rank at fault."""
    result = run_world(rankfns.returns_unpicklable, world_size=2)
    assert result.outcome == Outcome.CRASHED and result.root_rank is None, result.report()
    for root in result.ranks:
        assert root.error.startswith(f"UnpicklableReturnValue: rank {root.rank}: the function returned generator")
    assert result.root_cause.startswith("every rank raised UnpicklableReturnValue")
    assert result.cause.kind == "common_error"


def test_error_at_import_in_the_rank_is_a_crash_with_its_traceback(tmp_path, monkeypatch):
    module = tmp_path / "import_bomb.py"
    module.write_text("def fn(ctx):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import import_bomb

    module.write_text("raise RuntimeError('boom at import')\ndef fn(ctx):\n    return 1\n")
    try:
        result = run_world(import_bomb.fn, world_size=2)
    finally:
        sys.modules.pop("import_bomb", None)
    assert result.outcome == Outcome.CRASHED
    assert all(r.error == "RuntimeError: boom at import" for r in result.ranks)
    assert "import_bomb.py" in result.ranks[0].traceback


def test_report_shows_verdict_table_root_cause_and_replay():
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=2, stall=0.5, faults=[SkippedCollective(rank=0, step=1)])
    text = result.report()
    assert "HUNG" in text and "root cause: rank 0" in text
    assert "replay: python -m ddpfaults run tests/support/rankfns.py:all_reduce_steps --world-size 2 --seed 0" in text
    assert "--faults '[SkippedCollective(rank=0, step=1)]'" in text
    assert "--- rank 1 stack (blocked) ---" in text


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_other_start_methods(method):
    # each spawned rank imports torch: over 60 s at load 20 on 2 cores; the timeout only guards against a hang
    result = run_world(rankfns.all_reduce_steps, world_size=2, start_method=method, args=(2,), timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED and result.values == [4.0, 4.0], result.report()


def test_dataloader_workers_die_with_the_hung_world(tmp_path):
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.record_pids, world_size=2, args=(str(tmp_path),), stall=0.5)
    assert result.outcome == Outcome.HUNG
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    pids = [i["pid"] for i in infos] + [w for i in infos for w in i["workers"]]
    assert len(pids) == 6
    assert alive(pids) == []


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(world_size=0), errors.InvalidWorldSize, "world_size must be an int >= 1, got 0"),
        (dict(world_size="4"), errors.InvalidWorldSize, "got '4'"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        (dict(world_size=2, timeout=-1), errors.InvalidTimeout, "timeout must be a positive number of seconds, got -1"),
        (
            # fixed: a value handed to a pure function or refused before any world starts: no real time passes
            dict(world_size=2, timeout=5, stall=5),
            errors.InvalidTimeout,
            "stall (5 s) must be shorter than timeout (5 s)",
        ),
        (dict(world_size=2, backend="nccl"), errors.UnknownBackend, "backend 'nccl'"),
        (dict(world_size=2, peer_failure="hang"), errors.UnknownPeerFailure, "got 'hang'"),
        (dict(world_size=2, start_method="thread"), errors.UnknownStartMethod, "got 'thread'"),
        (
            dict(world_size=4, faults=[RankCrash(rank=5, step=0)]),
            errors.FaultError,
            "rank 5 does not exist in a world of 4",
        ),
    ],
)
def test_bad_arguments_raise_one_clear_error(kwargs, error, text):
    with pytest.raises(error) as info:
        run_world(rankfns.all_reduce_steps, **kwargs)
    assert text in str(info.value)
    assert isinstance(info.value, errors.DDPFaultsError)


def test_lambda_closure_and_non_callable_are_refused():
    def local(ctx):
        return 1

    for fn, text in ((lambda ctx: 1, "lambda"), (local, "defined inside another function"), (42, "must be a callable")):
        with pytest.raises(errors.FunctionNotRunnable) as info:
            run_world(fn, world_size=2)
        assert text in str(info.value)


def test_unpicklable_args_are_refused():
    with pytest.raises(errors.FunctionNotRunnable, match="cannot be pickled"):
        run_world(rankfns.all_reduce_steps, world_size=2, args=(lambda: 1,))


def test_result_round_trips_through_json():
    import json

    from ddpfaults import WorldResult

    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=2, stall=0.5, faults=[SkippedCollective(rank=1, step=0)])
    again = WorldResult.from_dict(json.loads(result.to_json()))
    assert again.outcome == result.outcome and again.root_cause == result.root_cause
    assert [r.state for r in again.ranks] == [r.state for r in result.ranks]
    assert again.ranks[0].collectives == result.ranks[0].collectives


def test_plain_ddp_names_the_diverging_rank_and_bucket_as_ctx_ddp_does():
    """torch's flight recorder sees DDP's own gradient all_reduces: a plain DDP model needs no ctx.ddp."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    plain = run_world(rankfns.skip_backward, world_size=4, kwargs={"wrap": "plain"}, stall=1.0, timeout=WORLD_GUARD)
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    traced = run_world(rankfns.skip_backward, world_size=4, kwargs={"wrap": "ctx"}, stall=1.0, timeout=WORLD_GUARD)
    for result in (plain, traced):
        assert result.outcome == Outcome.HUNG and result.reason.startswith("deadlock proved"), result.report()
        assert result.ranks[1].state == RankState.FINISHED and result.root_rank == 1, result.report()
        for r in (result.ranks[0], result.ranks[2], result.ranks[3]):
            assert r.state == RankState.BLOCKED and r.recorder == "flight recorder"
            assert r.where.startswith("in all_reduce(") and "[DDP gradient bucket]" in r.where, r.where
        assert result.divergence.odd_ranks == (1,) and result.divergence.ops() == {"all_reduce"}
        assert "[DDP gradient bucket] at rankfns.py:" in result.divergence.describe()
        assert "in skip_backward (step 2)" in result.divergence.describe()
    assert plain.divergence.describe() == traced.divergence.describe()
    assert plain.root_cause == traced.root_cause


def test_store_wait_counts_as_waiting_on_peers():
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.store_wait, world_size=2, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG and result.reason.startswith("no progress")
    assert result.ranks[0].where.startswith("in store.wait() [keys ['never-set']]")


def test_same_seed_same_draws_and_verdict():
    first = run_world(rankfns.draw_random, world_size=2, seed=3)
    again = run_world(rankfns.draw_random, world_size=2, seed=3)
    other = run_world(rankfns.draw_random, world_size=2, seed=4)
    assert first.values == again.values and first.values[0] == first.values[1]
    assert other.values != first.values
    crash = [RankCrash(rank=1, step=1)]
    verdicts = {
        (r.outcome, r.root_rank, r.root_cause)
        for r in (run_world(rankfns.all_reduce_steps, world_size=3, faults=crash, seed=5) for _ in range(2))
    }
    assert len(verdicts) == 1


def test_a_stall_window_shorter_than_rank_start_up_is_not_a_hang():
    """spawn needs seconds to import torch; a rank that has not started yet is busy, not blocked."""
    result = run_world(
        rankfns.all_reduce_steps,
        world_size=2,
        start_method="spawn",
        # fixed: what the test is about: a stall far below spawn's start-up is no hang (a starting rank is busy)
        stall=0.2,
        timeout=WORLD_GUARD,
        args=(2,),
    )
    assert result.outcome == Outcome.COMPLETED, result.report()


def test_the_printed_replay_command_reproduces_the_verdict(capsys, monkeypatch):
    import shlex

    result = run_world(
        rankfns.all_reduce_steps,
        world_size=2,
        kwargs={"steps": 3},
        # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
        stall=0.5,
        faults=[SkippedCollective(rank=1, step=2)],
    )
    assert result.outcome == Outcome.HUNG
    line = next(line for line in result.report().splitlines() if line.startswith("replay: "))
    command = shlex.split(line[len("replay: ") :])
    assert command[command.index("--kwargs") + 1] == "{'steps': 3}"
    assert command[:3] == ["python", "-m", "ddpfaults"]
    replay = ddpfaults_cli(capsys, monkeypatch, *command[3:], "--expect", "hung")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "expected hung, observed hung: OK" in replay.stdout
    assert f"root cause: {result.root_cause}" in replay.stdout


def test_ranks_own_multiprocessing_uses_the_platform_default_start_method(tmp_path):
    # as under torchrun: a DataLoader's workers do not go through the launcher's fork server
    platform_default = subprocess.run(
        [sys.executable, "-c", "import multiprocessing; print(multiprocessing.get_start_method())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = run_world(rankfns.dataloader_workers, world_size=2, args=(str(tmp_path),), timeout=WORLD_GUARD)
    assert result.outcome == "completed", result.report()
    for method, left in result.values:
        assert method == platform_default
        assert left == [], f"multiprocessing left {left} in the rank's temp dir"
