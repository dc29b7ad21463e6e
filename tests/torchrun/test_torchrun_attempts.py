"""How the last attempt under torchrun carries an earlier attempt that left no verdict in the store (no processes:
a dict stands for torchrun's agent store; the real thing is in test_torchrun.py, -m slow); a configuration error
said whole once, not again in every attempt torchrun restarts."""

import signal
from types import SimpleNamespace

import pytest

from ddpfaults.faults import RankKilled, check_faults
from ddpfaults.judge.results import Outcome, RankResult, RankState, WorldResult
from ddpfaults.torchrun import restarts
from ddpfaults.torchrun.worker import main as worker_main


class DictStore:
    """The three store calls :mod:`ddpfaults.torchrun.restarts` makes."""

    def __init__(self):
        self.keys = {}

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value


def _world(outcome, steps, root_rank=None, root_cause="no failure"):
    state = RankState.FINISHED if outcome == Outcome.COMPLETED else RankState.DIED
    ranks = [RankResult(rank=i, state=state, last_step=s) for i, s in enumerate(steps)]
    return WorldResult(outcome, ranks, root_cause, root_rank, "every rank finished or failed", 1.5, world_size=2)


def test_an_attempt_without_a_verdict_claims_no_cause_rank_steps_seconds_or_faults():
    lost = restarts.no_verdict(1)
    assert lost.outcome == Outcome.CRASHED and lost.root_rank is None and lost.ranks == [] and lost.elapsed is None
    assert lost.reason == restarts.NO_VERDICT == "no verdict in torchrun's store"
    assert lost.root_cause == (
        "no verdict: attempt 1 left none in torchrun's store; torchrun restarted it (its log says why)"
    )
    assert (lost.fired, lost.unfired) == ([], [])


def test_the_last_attempt_reports_a_lost_one_between_judged_ones_as_it_was_known():
    """Attempt 0 judged (its world in the store), attempt 1 lost, attempt 2 the last: the merged world keeps
    attempt 0's verdict and faults, says of attempt 1 only that it left no verdict, and is attempt 2's."""
    plan = check_faults([RankKilled(rank=1, step=2), RankKilled(rank=0, step=1, attempt=1)], 2)
    store = DictStore()
    first = _world(Outcome.CRASHED, [2, 2], root_rank=1, root_cause="rank 1 was killed by SIGKILL")
    store.set("attempt/0", first.to_json())
    env = SimpleNamespace(restart=2, max_restarts=2)
    result = restarts.conclude(store, _world(Outcome.COMPLETED, [3, 3]), env, plan)
    assert result.outcome == Outcome.COMPLETED and [r.last_step for r in result.ranks] == [3, 3]
    assert [(a["attempt"], a["outcome"], a["root_rank"], a["steps"], a["seconds"]) for a in result.attempts] == [
        (0, "crashed", 1, [2, 2], 1.5),
        (1, "crashed", None, [], None),
        (2, "completed", None, [3, 3], 1.5),
    ]
    assert result.attempts[1]["reason"] == "no verdict in torchrun's store"
    assert result.fired == [] and result.unfired == []  # attempt 1's kill: not known to have fired or not
    report = result.report()
    assert "  attempt 1: crashed; no verdict: attempt 1 left none in torchrun's store;" in report
    assert "attempt 1: crashed in" not in report and "steps reached []" not in report
    again = WorldResult.from_dict(result.to_dict())
    assert again.attempts == result.attempts


@pytest.mark.parametrize("restart", ["0", "2"])
def test_a_configuration_error_is_said_whole_in_attempt_0_and_only_named_in_a_restart(restart, monkeypatch, capsys):
    """The worker's own entry point on rank 0 with a case file that does not exist: exit 2; attempt 0 prints the
    whole error, a restart (torchrun restarts on any failed worker) one line saying it met it again."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        code = worker_main(["no_such_scenario.py::steps"])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    err = capsys.readouterr().err
    assert code == 2
    whole = "ddpfaults: error: DDPFaultsError: case 'no_such_scenario.py::steps': file 'no_such_scenario.py' not found"
    again = "ddpfaults: error: attempt 2 stopped on the configuration error again (DDPFaultsError: above)"
    assert err.strip().splitlines() == ([whole] if restart == "0" else [again])
