"""The judge loop's stop rules (ddpfaults.judge.loop.watch), on a scripted observer: no processes, a fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from ddpfaults.judge import loop
from ddpfaults.judge.watch import RankWatch
from ddpfaults.spec import RunSpec, StopReason


class Clock:
    """A monotonic clock the test advances (loop.watch reads time.monotonic)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedWorld(loop.Observer):
    """Ranks whose events arrive at scripted times; ``poll`` advances the clock by its wait."""

    def __init__(self, clock: Clock, world_size: int, script: dict[float, list[tuple[int, dict]]]):
        self.clock, self.t0 = clock, clock.now
        self.script = sorted(script.items())
        self.watches = [RankWatch(r, "/nonexistent") for r in range(world_size)]
        for w in self.watches:
            w.last_progress = clock.now
        self.stacks_asked = []
        self.stacks: dict[int, str] = {}  # what each rank's stack dump shows
        self.computing: set[int] = set()  # ranks whose main thread is runnable

    def poll(self, wait: float) -> None:
        self.clock.now += max(wait, 0.005)
        while self.script and self.script[0][0] <= self.clock.now - self.t0:
            _, events = self.script.pop(0)
            for rank, event in events:
                self.watches[rank]._apply(event)
                self.watches[rank].last_progress = self.clock.now

    def dead(self, i: int, now: float) -> bool:
        return False

    def failures_seen(self, now: float) -> list[float]:
        return []

    def cpu(self, i: int) -> float | None:
        return 0.0

    def collect_stacks(self, indices: list[int]) -> None:
        self.stacks_asked.append(sorted(indices))
        for i in indices:
            self.watches[i].stack = self.stacks.get(i)

    def runnable(self, i: int) -> bool:
        return i in self.computing


def start(seq=1):
    return {"k": "start", "t": 0}


def enter_init(seq=1):
    return {"k": "enter", "seq": seq, "op": "init_process_group", "shapes": [], "site": "x", "step": None}


def leave(seq=1):
    return {"k": "exit", "seq": seq}


def enter_all_reduce(seq=2):
    return {"k": "enter", "seq": seq, "op": "all_reduce", "shapes": [[1]], "site": "x", "step": 0}


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(loop.time, "monotonic", clock)
    return clock


def test_ranks_waiting_in_a_slow_rendezvous_are_not_hung(clock):
    # every rank waits in init_process_group for 8 s (a 200-rank FileStore rendezvous): far past the 2 s stall
    script = {0.1: [(r, start()) for r in range(3)] + [(r, enter_init()) for r in range(3)]}
    script[8.0] = [(r, leave()) for r in range(3)]
    script[8.5] = [(r, {"k": "finished", "step": 0, "leftovers": []}) for r in range(3)]
    world = ScriptedWorld(clock, 3, script)
    assert loop.watch(world, RunSpec(world_size=3, stall=2, timeout=60)) is StopReason.ENDED


def test_a_rendezvous_that_never_completes_stops_at_the_start_up_limit(clock):
    script = {0.1: [(r, start()) for r in range(3)] + [(r, enter_init()) for r in (0, 2)]}  # rank 1 never enters
    world = ScriptedWorld(clock, 3, script)
    assert loop.watch(world, RunSpec(world_size=3, stall=2, startup=10, timeout=60)) is StopReason.STARTUP
    assert 10.0 <= clock.now - world.t0 < 10.1


def test_start_up_limit_is_capped_by_the_timeout(clock):
    world = ScriptedWorld(clock, 2, {})  # no rank ever starts
    assert loop.watch(world, RunSpec(world_size=2, stall=1, startup=30, timeout=5)) is StopReason.STARTUP
    assert 5.0 <= clock.now - world.t0 < 5.1


def test_after_the_rendezvous_the_stall_rule_applies(clock):
    script = {0.1: [(r, start()) for r in range(2)] + [(r, enter_init()) for r in range(2)]}
    script[0.2] = [(r, leave()) for r in range(2)] + [(r, enter_all_reduce()) for r in range(2)]
    world = ScriptedWorld(clock, 2, script)
    assert loop.watch(world, RunSpec(world_size=2, stall=2, timeout=60)) is StopReason.STALL
    assert clock.now - world.t0 < 3.5


def test_a_rank_that_ended_before_joining_lets_the_stall_rule_judge_its_waiting_peers(clock):
    script = {0.1: [(r, start()) for r in range(2)] + [(0, enter_init())]}
    script[0.2] = [(1, {"k": "finished", "step": None, "leftovers": []})]  # a script rank that returned early
    world = ScriptedWorld(clock, 2, script)
    assert loop.watch(world, RunSpec(world_size=2, stall=2, timeout=60)) is StopReason.STALL
    assert clock.now - world.t0 < 3.5


DDP_INIT_STACK = (
    'File "/site-packages/torch/nn/parallel/distributed.py", line 850 in __init__\n'
    'File "/work/train.py", line 12 in train'
)


@pytest.mark.parametrize("computing", [False, True], ids=["waiting", "runnable"])
def test_a_rank_starved_of_cpu_inside_ddp_code_is_computing_not_waiting(clock, computing):
    # 200 ranks on 2 cores: a rank building its DDP model gets ~1% of a core (not "busy" by CPU share) and its
    # stack is inside DDP code (a waiting stack); only its runnable state says it computes
    script = {0.1: [(r, start()) for r in range(2)] + [(r, enter_init()) for r in range(2)]}
    script[0.2] = [(r, leave()) for r in range(2)] + [(0, enter_all_reduce())]
    world = ScriptedWorld(clock, 2, script)
    world.stacks = {1: DDP_INIT_STACK}
    world.computing = {1} if computing else set()
    reason = loop.watch(world, RunSpec(world_size=2, stall=2, timeout=20))
    assert reason is (StopReason.TIMEOUT if computing else StopReason.STALL)


def test_a_rank_gloo_aborted_before_its_dump_does_not_decide_the_odd_group():
    """In step 2 ranks 0 and 1 skipped the criterion's all_reduce (their gradient bucket met it); gloo aborted rank 3,
    which left no flight-recorder dump. Among the survivors the recorder's vote finds rank 2 odd; what each rank did
    (its step 2 against its steps 0 and 1) names ranks 0, 1, whichever rank gloo aborted and whichever record saw
    the buckets."""
    from ddpfaults.judge.attribution import attribute
    from ddpfaults.judge.loop import _divergence
    from ddpfaults.judge.results import Collective, RankResult, RankState

    def bucket(step):
        return Collective(1, "all_reduce", [[2757]], "train.py:9 in step", step, note="DDP gradient bucket 0")

    def count(step):
        return Collective(1, "all_reduce", [[1]], "loss.py:3 in criterion", step)

    states = [RankState.RAISED, RankState.RAISED, RankState.RAISED, RankState.DIED]
    usual = [count(0), bucket(0), count(1), bucket(1)]
    traced = [usual + [bucket(2)]] * 2 + [usual + [count(2), bucket(2)]] * 2

    def judged(ranks, recorded):
        done = [dataclasses.replace(r, collectives=recorded[r.rank] or r.collectives) for r in ranks]
        return attribute(_divergence(ranks, recorded), done)

    def world(records):
        return [RankResult(rank=r, state=states[r], collectives=records[r]) for r in range(4)]

    recorded = [usual + [bucket(2)]] * 2 + [usual + [count(2)], []]  # rank 3 left no dump
    assert judged(world(traced), recorded).odd_ranks == (0, 1)
    recorded_all = [usual + [bucket(2)]] * 2 + [usual + [count(2)]] * 2  # every rank dumped: a 2-2 split
    assert _divergence(world(traced), recorded_all).odd_ranks == ()  # no vote can tell
    assert judged(world(traced), recorded_all).odd_ranks == (0, 1)
    untraced = world([[c for c in t if not c.note] for t in traced])  # plain DDP: the survivors' vote says rank 2
    assert _divergence(untraced, recorded).odd_ranks == (2,)
    assert judged(untraced, recorded).odd_ranks == (0, 1)


def test_survivors_whose_records_split_evenly_name_no_odd_rank():
    """rank0_only[naive_ddp_forward]: rank 0's evaluation broadcasts BatchNorm buffers (32 elements) while ranks 1 and 2
    broadcast DDP's bucket indices (7); gloo aborts both receivers. When rank 2's dump was taken and rank 1's was not,
    the records are one against one: no group is odd, and the blame must not depend on which dump exists."""
    from ddpfaults.judge.loop import _divergence
    from ddpfaults.judge.results import Collective, RankResult, RankState

    buffers = Collective(1, "broadcast", [[32]], "eval.py:5 in evaluate", 0, note="DDP forward broadcast")
    indices = Collective(1, "broadcast", [[7]], "train.py:9 in step", 1, note="DDP forward broadcast")
    states = [RankState.RAISED, RankState.DIED, RankState.DIED]
    ranks = [RankResult(rank=r, state=states[r], collectives=[]) for r in range(3)]  # tracing misses DDP's broadcasts
    assert _divergence(ranks, [[buffers], [], [indices]]) is None  # and no stack says where rank 1 died
    assert _divergence(ranks, [[buffers], [indices], [indices]]).odd_ranks == (0,)  # every dump: rank 0 is odd
    died_in_step = (
        'File "/venv/torch/nn/parallel/distributed.py", line 1775 in _pre_forward\n'
        '  File "/venv/torch/nn/modules/module.py", line 1789 in _call_impl\n'
        '  File "/home/u/train.py", line 9 in step\n  File "/home/u/train.py", line 30 in main'
    )
    ranks[1] = RankResult(rank=1, state=RankState.DIED, collectives=[], stack=died_in_step)
    divergence = _divergence(ranks, [[buffers], [], [indices]])  # rank 1's stack places it with rank 2
    assert divergence.odd_ranks == (0,) and [g.ranks for g in divergence.groups] == [(1, 2), (0,)]


def test_a_lone_record_is_set_beside_where_gloo_aborted_the_other_ranks():
    """rank0_only[naive_ddp_forward] as it usually ends: gloo aborted both receivers before either dumped, so rank 0's
    record (its evaluation's broadcast last) is the only one; the receivers' dying stacks put them in their training
    step, so rank 0 is odd, the same blame as when every rank dumped. Nothing is placed by a stack that is missing, by
    a death that was not gloo's mismatch abort, or when the stacks agree with the record."""
    from ddpfaults.judge.loop import _divergence
    from ddpfaults.judge.results import Collective, RankResult, RankState

    setup = Collective(1, "broadcast", [[7]], "train.py:4 in main", None, note="DDP construction")
    buffers = Collective(2, "broadcast", [[32]], "eval.py:5 in evaluate", 0, note="DDP forward broadcast")
    aborted = (
        "was killed by SIGABRT: Received data size doesn't match expected size. "
        "Is there a distributed collective mismatch in your code?"
    )

    def died(rank, frame='/home/u/train.py", line 9 in step', error=aborted):
        stack = f'File "/venv/torch/nn/parallel/distributed.py", line 1775 in _pre_forward\n  File "{frame}'
        return RankResult(rank=rank, state=RankState.DIED, error=error, stack=stack)

    rank0 = RankResult(rank=0, state=RankState.RAISED, error="Connection reset by peer", collateral=True)
    recorded = [[setup, buffers], [], []]
    divergence = _divergence([rank0, died(1), died(2)], recorded)
    assert divergence.odd_ranks == (0,) and divergence.index == 2
    assert [(g.ranks, g.call) for g in divergence.groups] == [((1, 2), None), ((0,), buffers)]
    assert "gloo aborted them in a collective at train.py:9 in step" in divergence.describe()
    assert _divergence([rank0, died(1), died(2, error="was killed by SIGKILL")], recorded) is None
    assert _divergence([rank0, died(1), RankResult(rank=2, state=RankState.DIED, error=aborted)], recorded) is None
    at_evaluate = '/home/u/eval.py", line 5 in evaluate'
    assert _divergence([rank0, died(1, at_evaluate), died(2, at_evaluate)], recorded) is None
    assert _divergence([rank0, died(1)], [[setup, buffers], []]) is None  # one against one


class ExitsBetweenReads(ScriptedWorld):
    """Rank 0 writes its last event and dies between a poll's read and the liveness check that follows it (the
    launcher learns of an exit from the process, not from the event file)."""

    def __init__(self, clock: Clock):
        super().__init__(clock, 2, {0.01: [(1, {"k": "finished"})]})
        self.polls = 0

    def poll(self, wait: float) -> None:
        super().poll(wait)
        self.polls += 1
        if self.polls == 3:  # read the file before the event reached it; the fault fires and the rank dies now
            self.late = {"k": "fault", "index": 0, "fault": "F()", "how": "killed itself", "step": 2}
        elif self.polls > 3:
            self.watches[0]._apply(self.late)

    def dead(self, i: int, now: float) -> bool:
        return i == 0 and self.polls >= 3


def test_a_rank_that_wrote_and_died_between_a_read_and_the_liveness_check_has_its_last_events_read(clock):
    world = ExitsBetweenReads(clock)
    assert loop.watch(world, RunSpec(world_size=2)) == StopReason.ENDED
    assert [f.how for f in world.watches[0].fired] == ["killed itself"]


FRAMES = [{"filename": "/home/u/train.py", "line": 18, "name": "main"}]
WALL0 = 1_795_000_000.0  # the wall clock at the world's start


class TrainingWorld(ScriptedWorld):
    """Two ranks that each take a step every 10 ms with one DDP gradient bucket all_reduce in it, for ``seconds``;
    their flight recorders record every collective. A dump is taken 0.2 s after it is asked for, so it holds the
    collectives made meanwhile, whose step events the judge has not read yet."""

    def __init__(self, clock: Clock, seconds: float):
        steps = [round(0.2 + 0.01 * s, 3) for s in range(int((seconds - 0.2) / 0.01))]
        script = {0.1: [(r, {"k": "start", "t": 0.1, "wall": WALL0 + 0.1, "fresh_record": True}) for r in (0, 1)]}
        script[0.1] += [(r, enter_init()) for r in (0, 1)]
        script[0.15] = [(r, leave()) for r in (0, 1)]
        for s, t in enumerate(steps):
            script[t] = [(r, {"k": "step", "step": s, "t": t, "wall": WALL0 + t, "pg_seq": s}) for r in (0, 1)]
        super().__init__(clock, 2, script)
        self.steps, self.dumped_at = steps, None

    def collect_flight_records(self, indices: list[int]) -> None:
        self.clock.now += 0.2
        self.dumped_at = self.clock.now - self.t0

    def flight_record(self, i: int) -> dict:
        made = [s for s, t in enumerate(self.steps) if t + 0.001 <= self.dumped_at]
        entries = [
            {
                "record_id": s,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "collective_seq_id": s + 1,
                "profiling_name": "gloo:all_reduce",
                "time_created_ns": int((WALL0 + self.steps[s] + 0.001) * 1e9),
                "input_sizes": [[9]],
                "frames": [{"filename": "/torch/autograd/graph.py", "line": 1, "name": "_engine_run_backward"}]
                + FRAMES,
                "retired": s < made[-1],
            }
            for s in made
        ]
        return {"pg_status": {"0": {"last_completed_collective": made[-1]}}, "entries": entries}

    def reported(self, i: int):
        return None

    def death(self, i, reason, now):
        return None

    def describe(self, i: int) -> dict:
        return dict(pid=None, exitcode=None, output="", events=[{**e} for e in self.watches[i].events])


def test_collectives_recorded_after_the_stop_are_placed_in_the_steps_they_were_made_in(clock):
    """At the timeout the ranks are still training; their dumps come 0.2 s later and hold 20 more collectives. The
    judge reads the step events written before the dumps: each collective keeps its own step (step s made
    collective #s+1), none is lumped into the last step read at the stop."""
    world = TrainingWorld(clock, seconds=10)
    spec = RunSpec(world_size=2, stall=1, timeout=3)
    reason = loop.watch(world, spec)
    assert reason is StopReason.TIMEOUT
    result = loop.judge(world, spec, reason)
    for rank in result.ranks:
        assert rank.recorder == "flight recorder" and len(rank.collectives) > 290
        assert [c.step for c in rank.collectives] == [c.seq - 1 for c in rank.collectives]


@pytest.mark.parametrize("seconds, outcome", [(10, "timed out"), (1.5, "hung")])
def test_the_timeout_finds_a_world_still_training_timed_out_and_a_world_that_stopped_moving_hung(
    clock, seconds, outcome
):
    """Both worlds are stopped by the 4 s timeout (no rank waits in a collective, so the stall rule never applies):
    one still stepping every 10 ms, one whose ranks stopped at 1.5 s (in a DDP bucket their flight records show
    never completed)."""
    world = TrainingWorld(clock, seconds=seconds)
    spec = RunSpec(world_size=2, stall=1, timeout=4)
    reason = loop.watch(world, spec)
    assert reason is StopReason.TIMEOUT
    result = loop.judge(world, spec, reason)
    assert result.outcome == outcome and [r.outcome for r in result.ranks] == [outcome] * 2
    if outcome == "timed out":
        assert result.root_rank is None and result.divergence is None
        assert result.root_cause.startswith("still training at the deadline: step ")
    else:
        assert result.root_cause.startswith("ranks 0, 1 blocked (in all_reduce([9]) [DDP gradient bucket]")
