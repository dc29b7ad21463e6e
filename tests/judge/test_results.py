"""Unit tests of ddpfaults.judge.results and the text report (hand-built results, no processes)."""

from __future__ import annotations

import json
import re

import pytest

from ddpfaults.judge.results import (
    Collective,
    Divergence,
    DivergenceGroup,
    FiredFault,
    Outcome,
    RankResult,
    RankState,
    WorldResult,
)

GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:8620"
)

HUNG_STACK = """\
Thread 0x00007f3a5c1fd740 (most recent call first):
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3203 in all_reduce
  File "/work/scenarios/train.py", line 31 in train_step
  File "/work/main/ddpfaults/rank/main.py", line 280 in _run"""

EXPECTED_OUTCOME = {
    RankState.FINISHED: "completed",
    RankState.RAISED: "crashed",
    RankState.DIED: "crashed",
    RankState.BLOCKED: "hung",
    RankState.RUNNING: "hung",
}


def collectives(n: int, step0: int = 0) -> list[Collective]:
    return [
        Collective(
            seq=i + 1,
            op="all_reduce",
            shapes=[[4], [2, 3]],
            site="train.py:31 in train_step",
            step=step0 + i,
            done=i < n - 1,
        )
        for i in range(n)
    ]


class NotJSON:
    def __repr__(self) -> str:
        return "NotJSON()"


def make_world(outcome: Outcome = Outcome.HUNG, *, value=None, replay: str | None = None) -> WorldResult:
    ranks = [
        RankResult(
            rank=0,
            state=RankState.FINISHED,
            value={"loss": 0.25, "steps": [1, 2]},
            collectives=collectives(2),
            last_step=1,
            where="finished; waiting for the verdict",
            output="step 0\nstep 1\n",
            events=[{"k": "step", "i": 0, "t": 0.01}, {"k": "end", "t": 0.5}],
        ),
        RankResult(
            rank=1,
            state=RankState.BLOCKED,
            collectives=collectives(3),
            last_step=2,
            stack=HUNG_STACK,
            where="in all_reduce([4], [2, 3]) at train.py:31 in train_step (step 2)",
        ),
        RankResult(
            rank=2,
            state=RankState.RAISED,
            value=value,
            error=GLOO_CLOSED,
            collateral=True,
            traceback="Traceback (most recent call last):\n  ...\n" + GLOO_CLOSED + "\n",
            site="train.py:31 in train_step",
            failed_at=2.75,
            last_step=2,
            fired=[FiredFault(0, "RankCrash(rank=3, step=1)", 2, 1, "on_step")],
            collectives=collectives(3),
        ),
        RankResult(rank=3, state=RankState.DIED, error="was killed by SIGKILL", exitcode=-9, failed_at=1.5),
    ]
    return WorldResult(
        outcome=outcome,
        ranks=ranks,
        root_cause="rank 3 was killed by SIGKILL",
        root_rank=3,
        reason="no progress for 3 s and every live rank waiting on its peers",
        elapsed=4.321,
        world_size=4,
        seed=1234,
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        stall=3.0,
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        timeout=60.0,
        divergence=Divergence(
            3,
            (
                DivergenceGroup((0, 1), Collective(3, "all_reduce", [[4]], "t.py:3 in f", 2)),
                DivergenceGroup((2, 3), absent="finished"),
            ),
            (2, 3),
        ),
        faults=["RankCrash(rank=3, step=1, exc=RuntimeError('injected crash'))"],
        fired=[FiredFault(0, "RankCrash(rank=3, step=1, exc=RuntimeError('injected crash'))", 3, 1, "on_step")],
        function="scenarios/train.py:train",
        replay=replay,
    )


# -- Outcome / RankState ------------------------------------------------------------------


def test_outcome_values_are_exactly_the_expect_strings():
    assert [o.value for o in Outcome] == ["completed", "hung", "crashed", "timed out"]
    for o in Outcome:
        assert o == o.value
        assert str(o) == o.value
        assert f"{o}" == o.value
        assert Outcome(o.value) is o
        assert json.dumps(o) == json.dumps(o.value)
    assert Outcome.COMPLETED != "hung"


@pytest.mark.parametrize("state", list(RankState))
def test_rank_outcome_is_derived_from_state(state):
    r = RankResult(rank=0, state=state)
    assert isinstance(r.outcome, Outcome)
    assert r.outcome == EXPECTED_OUTCOME[state]
    # a plain string state (as a hand-built or loaded result may have) gives the same outcome
    assert RankResult(rank=0, state=state.value).outcome is r.outcome


def test_every_rank_state_has_an_expected_outcome():
    assert set(RankState) == set(EXPECTED_OUTCOME)


def test_unknown_state_has_no_outcome():
    with pytest.raises(ValueError):
        _ = RankResult(rank=0, state="exploded").outcome


# -- Collective ---------------------------------------------------------------------------


def test_collective_describe_and_signature():
    c = Collective(seq=3, op="all_reduce", shapes=[[4], [2, 3]], site="criterion.py:42 in loss", step=3)
    assert c.describe() == "all_reduce([4], [2, 3]) at criterion.py:42 in loss (step 3)"
    no_step = Collective(seq=1, op="barrier", shapes=[], site="train.py:9 in main", step=None)
    assert no_step.describe() == "barrier() at train.py:9 in main"
    # seq and done do not take part in matching; op, shapes, site and step do
    same = Collective(seq=9, op="all_reduce", shapes=[[4], [2, 3]], site="criterion.py:42 in loss", step=3, done=True)
    assert same.signature() == c.signature()
    for changed in (
        Collective(seq=3, op="broadcast", shapes=[[4], [2, 3]], site="criterion.py:42 in loss", step=3),
        Collective(seq=3, op="all_reduce", shapes=[[4]], site="criterion.py:42 in loss", step=3),
        Collective(seq=3, op="all_reduce", shapes=[[4], [2, 3]], site="criterion.py:43 in loss", step=3),
        Collective(seq=3, op="all_reduce", shapes=[[4], [2, 3]], site="criterion.py:42 in loss", step=4),
    ):
        assert changed.signature() != c.signature()


# -- serialisation --------------------------------------------------------------------------


def roundtrip(world: WorldResult) -> WorldResult:
    return WorldResult.from_dict(json.loads(json.dumps(world.to_dict())))


def test_world_round_trip_through_json_equals_original():
    world = make_world(value=[1, "two", 3.5, None, {"nested": [True, False]}])
    back = roundtrip(world)
    assert back == world
    assert back.outcome is Outcome.HUNG
    assert [r.state for r in back.ranks] == [r.state for r in world.ranks]
    assert all(isinstance(r.state, RankState) for r in back.ranks)
    assert all(isinstance(c, Collective) for r in back.ranks for c in r.collectives)
    assert back.ranks[1].collectives == world.ranks[1].collectives
    assert back.values == world.values
    # and the JSON document from to_json is the same document
    assert json.loads(world.to_json()) == json.loads(json.dumps(world.to_dict()))


@pytest.mark.parametrize("value", [NotJSON(), {1, 2, 3}, b"bytes", {("tuple", "key"): 1}])
def test_non_json_value_becomes_its_repr(value):
    world = make_world(value=value)
    data = world.to_dict()
    assert data["ranks"][2]["value"] == repr(value)
    json.dumps(data)  # the whole dict is JSON-ready
    back = roundtrip(world)
    assert back.ranks[2].value == repr(value)
    # everything else survives unchanged
    back.ranks[2].value = value
    assert back == world


def test_rank_to_dict_carries_state_and_outcome_as_strings():
    world = make_world()
    data = world.to_dict()
    assert data["outcome"] == "hung" and type(data["outcome"]) is str
    assert [r["state"] for r in data["ranks"]] == ["finished", "blocked", "raised", "died"]
    assert [r["outcome"] for r in data["ranks"]] == ["completed", "hung", "crashed", "crashed"]
    expected = {
        "seq": 1,
        "op": "all_reduce",
        "shapes": [[4], [2, 3]],
        "site": "train.py:31 in train_step",
        "step": 0,
        "done": True,
    }
    first = data["ranks"][1]["collectives"][0]
    assert {k: first[k] for k in expected} == expected


@pytest.mark.parametrize("outcome", list(Outcome))
def test_round_trip_keeps_each_outcome(outcome):
    assert roundtrip(make_world(outcome)).outcome is outcome


def test_rank_from_dict_ignores_unknown_keys():
    r = RankResult(rank=2, state=RankState.RUNNING, where="train.py:12 in slow_step")
    data = r.to_dict()
    data["something_newer"] = 1
    assert RankResult.from_dict(data) == r


# -- report ---------------------------------------------------------------------------------

_TABLE_LINE = re.compile(r"^\s*(\d+)\s+(completed|hung|crashed)\s+(finished|raised|died|blocked|running)\s")


def table_lines(text: str) -> list[tuple[int, str, str]]:
    return [(int(m[1]), m[2], m[3]) for m in map(_TABLE_LINE.match, text.splitlines()) if m]


@pytest.mark.parametrize("outcome", [Outcome.HUNG, Outcome.CRASHED])
def test_report_of_a_failed_world(outcome):
    world = make_world(outcome)
    text = world.report()
    first = text.splitlines()[0]
    assert outcome.value.upper() in first
    assert "4-rank" in first
    assert f"root cause: {world.root_cause}" in text
    assert table_lines(text) == [(r.rank, str(r.outcome), str(r.state)) for r in world.ranks]
    replay = [line for line in text.splitlines() if line.startswith("replay: ")]
    assert len(replay) == 1
    assert "--seed 1234" in replay[0] and "--world-size 4" in replay[0]
    assert "RankCrash(rank=3, step=1" in replay[0]
    # the hung rank's stack is shown under its own heading
    assert "--- rank 1 stack (blocked) ---" in text
    shown = "\n".join(line for line in HUNG_STACK.splitlines() if not line.startswith("Thread 0x"))
    assert "--- rank 1 stack (blocked) ---\n" + shown in text
    assert str(world) == text


def test_report_of_a_completed_world_has_no_replay_line():
    world = make_world(Outcome.COMPLETED)
    for r in world.ranks:
        r.state, r.error, r.stack, r.collateral = RankState.FINISHED, None, None, False
    text = world.report()
    assert "COMPLETED" in text.splitlines()[0]
    assert "replay:" not in text
    assert table_lines(text) == [(r, "completed", "finished") for r in range(4)]


def test_report_uses_the_given_replay_command():
    text = make_world(replay="pytest tests/test_x.py::test_y").report()
    assert "replay: pytest tests/test_x.py::test_y" in text.splitlines()


def test_report_marks_collateral_errors_and_strips_the_gloo_prefix():
    text = make_world().report()
    line = next(line for line in text.splitlines() if (m := _TABLE_LINE.match(line)) and m[1] == "2")
    assert "(collateral) RuntimeError: Connection closed by peer" in line
    assert "pair.cc" not in line
    # a collateral rank's traceback is not repeated; the root cause's absence of one is fine
    assert "--- rank 2 traceback ---" not in text


def test_report_does_not_show_stacks_of_finished_ranks():
    world = make_world()
    world.ranks[0].stack = 'Thread 0x1 (most recent call first):\n  File "x.py", line 1 in f'
    text = world.report()
    assert "--- rank 0 stack" not in text
    assert "--- rank 1 stack (blocked) ---" in text


def test_report_output_tail_is_limited():
    world = make_world()
    world.ranks[1].output = "\n".join(f"line {i}" for i in range(40))
    text = world.report(output_lines=5)
    assert "--- rank 1 output (last 5 lines) ---" in text
    assert "line 39" in text and "line 34" not in text
