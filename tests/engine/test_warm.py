"""Warm worlds: healthy worlds are reused, also after data-only faults (a reused world then behaves exactly like a
fresh one); any other fault, a failure, unmatched collectives or leftover state gets a world torn down."""

import os
import pickle
import random

import pytest
import torch
import torch.distributed as dist

import rankfns
from ddpfaults import run_world
from ddpfaults.engine import census, pool
from ddpfaults.faults import (
    DeviceMismatch,
    EmptyBatch,
    Fault,
    RankCrash,
    SchemaDrift,
    SkippedCollective,
    Straggler,
    UnevenInputs,
)
from ddpfaults.faults.base import check_plan
from ddpfaults.scenario import builtin_dir, load_module
from processes import alive


@pytest.fixture(autouse=True)
def _empty_pool():
    pool.close_all()
    yield
    pool.close_all()


def _pids(result):
    return [r.pid for r in result.ranks]


def test_a_healthy_world_is_reused_by_the_next_run_of_the_same_shape():
    first = run_world(rankfns.all_reduce_steps, world_size=3)
    second = run_world(rankfns.all_reduce_steps, world_size=3, seed=9)
    assert (first.warm, first.reused, second.warm, second.reused) == (False, True, True, True)
    assert _pids(second) == _pids(first)
    assert second.values == first.values == [81.0] * 3
    other_shape = run_world(rankfns.all_reduce_steps, world_size=2)
    assert not other_shape.warm and set(_pids(other_shape)).isdisjoint(_pids(first))


@pytest.mark.parametrize(
    "fault, outcome",
    [
        (Straggler(rank=0, step=0, seconds=0.1), "completed"),
        (RankCrash(rank=1, step=1), "crashed"),
        (SkippedCollective(rank=1, step=3), "hung"),
    ],
)
def test_a_non_data_fault_never_takes_a_warm_world_nor_gives_its_own_back(fault, outcome):
    warm = run_world(rankfns.all_reduce_steps, world_size=3)
    # fixed: the hung case is called after this window; load never trips it in the others (a starved rank computes)
    faulty = run_world(rankfns.all_reduce_steps, world_size=3, faults=[fault], stall=0.5)
    assert not faulty.warm and faulty.outcome == outcome and not faulty.reused
    assert alive(_pids(faulty)) == [] and set(_pids(faulty)).isdisjoint(_pids(warm))
    assert sorted(pool.warm_pids()) == sorted(_pids(warm))  # the pooled world stayed pooled, untouched
    after = run_world(rankfns.all_reduce_steps, world_size=3)
    assert after.warm and after.reused and _pids(after) == _pids(warm) and after.values == [81.0] * 3


def test_a_plan_mixing_data_and_other_faults_is_not_data_only():
    warm = run_world(rankfns.iterate_loader, world_size=2)
    plan = [EmptyBatch(rank=0, step=0), Straggler(rank=1, step=1, seconds=0.05)]
    mixed = run_world(rankfns.iterate_loader, world_size=2, faults=plan)
    assert mixed.outcome == "completed" and len(mixed.fired) == 2
    assert (mixed.warm, mixed.reused) == (False, False) and alive(_pids(mixed)) == []
    assert pool.warm_pids() == sorted(_pids(warm))


def test_data_only_is_declared_by_each_fault_class_itself():
    assert [k.__name__ for k in (EmptyBatch, SchemaDrift, UnevenInputs) if _data_only([_any(k)])] == [
        "EmptyBatch",
        "SchemaDrift",
        "UnevenInputs",
    ]
    others = (DeviceMismatch, RankCrash, SkippedCollective, Straggler, *_checkpoint_kinds())
    assert [k.__name__ for k in others if _data_only([_any(k)])] == []
    assert _data_only([]) and not _data_only([EmptyBatch(rank=0, step=0), RankCrash(rank=1, step=0)])
    assert not _data_only([_SneakyEmptyBatch(rank=0, step=0)])  # inherits the flag, does not declare it


def _data_only(faults) -> bool:
    """Whether the pool would run a plan of ``faults`` on a warm world (the plan's own word)."""
    return check_plan(faults).data_only


class _SneakyEmptyBatch(EmptyBatch):
    """A subclass adding an effect of its own: it does not declare itself data-only, so it is not."""

    def on_step(self, ctx):
        torch.set_num_threads(2)


def _checkpoint_kinds():
    from ddpfaults.faults import TornCheckpointWrite, WriterKilledMidSave

    return TornCheckpointWrite, WriterKilledMidSave


def _any(kind) -> Fault:
    """Some fault of ``kind`` (valid on a 2-rank world)."""
    if kind is SchemaDrift:
        return SchemaDrift(key="mask", rank=0, step=0)
    if kind is UnevenInputs:
        return UnevenInputs(rank=0, batches=1)
    if kind in (DeviceMismatch,) or kind.rank_arg == "writer":
        return kind()
    if kind is Straggler:
        return Straggler(rank=0, step=0, seconds=0.1)
    return kind(rank=0, step=0)


# -- a data-only world is pooled again, and a reused world behaves exactly like a fresh one -----------------------


def loader_sums(ctx, batches=4, require_key=False, stray=False, keep_workers=False):
    """Iterate a DataLoader of dict batches (one ``ctx.step`` per batch; ``x`` weighted by ``w``, which counts as
    1 where a batch lost it), all_reduce the local sum once at the end, and return what a reused world could get
    wrong: the batches seen, the local and global sums, and draws from every global RNG.

    ``require_key``: read ``w`` as a strict consumer does (KeyError without it); ``stray``: rank 0 also starts an
    all_reduce its peers never join and never waits for it; ``keep_workers``: a persistent worker process kept
    alive past the job (leftover state)."""
    data = [{"x": torch.arange(3.0) + i, "w": torch.full((3,), 0.5)} for i in range(batches * 2)]
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True, collate_fn=_collate)
    seen, local = [], torch.zeros(1)
    for step, batch in enumerate(loader):
        ctx.step(step)
        weight = batch["w"] if require_key else batch.get("w", 1.0)
        local += (batch["x"] * weight).sum()
        seen.append((len(batch["x"]), sorted(batch)))
    total = local.clone()
    dist.all_reduce(total)
    if stray and ctx.rank == 0:
        dist.all_reduce(torch.ones(1), async_op=True)
    if keep_workers:
        workers = torch.utils.data.DataLoader(list(range(4)), num_workers=1, persistent_workers=True)
        next(iter(workers))
        _KEEP.append(workers)
    return seen, float(local), float(total), random.random(), torch.rand(1).item(), torch.randint(100, (3,)).tolist()


_KEEP: list = []


def _collate(samples: list) -> dict:
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


_empty_batch = load_module(os.path.join(builtin_dir(), "scenario_empty_batch.py")).empty_batch

#: (id, rank function, kwargs, data-only plan): the DataLoader seams, and ctx.fault in the empty-batch scenario
DATA_ONLY = [
    ("seam-empty", loader_sums, {}, [EmptyBatch(rank=1, step=1)]),
    ("seam-drift", loader_sums, {}, [SchemaDrift(key="w", rank=0, step=2)]),
    ("seam-uneven", loader_sums, {}, [UnevenInputs(rank=1, batches=2)]),
    (
        "seam-all",
        loader_sums,
        {},
        [EmptyBatch(rank=0, step=0), SchemaDrift(key="w", step=1), UnevenInputs(rank=2, batches=3)],
    ),
    ("scenario-empty", _empty_batch, {"strategy": "fixed"}, [EmptyBatch(rank=1, step=1)]),
    ("scenario-whole-step", _empty_batch, {"strategy": "fixed"}, [EmptyBatch(rank=r, step=0) for r in range(3)]),
]


def _seen(result) -> tuple:
    """What must be the same on a reused world as on a fresh one: verdict, fired list, values."""
    return str(result.outcome), result.root_cause, [f.describe() for f in result.fired], result.values


@pytest.mark.parametrize("fn, kwargs, plan", [case[1:] for case in DATA_ONLY], ids=[case[0] for case in DATA_ONLY])
def test_a_data_only_world_is_pooled_again_and_a_reused_world_behaves_like_a_fresh_one(fn, kwargs, plan):
    world = {"world_size": 3, "seed": 7, "kwargs": kwargs}
    cold = run_world(fn, faults=plan, reuse=False, **world)
    cold_clean = run_world(fn, reuse=False, **world)
    assert cold.outcome == "completed" and len(cold.fired) >= len(plan)
    assert cold.values != cold_clean.values  # the faults changed the data: the comparison below means something

    first = run_world(fn, **{**world, "seed": 3})  # another seed: the warm ranks ran something else before
    faulted = run_world(fn, faults=plan, **world)
    assert (faulted.warm, faulted.reused) == (True, True) and _pids(faulted) == _pids(first)
    assert _seen(faulted) == _seen(cold)
    again = run_world(fn, faults=plan, **world)  # a data-only world taken right after a data-only one
    assert again.warm and _seen(again) == _seen(cold)
    clean = run_world(fn, **world)  # a fault-free run on the world that just ran the faults
    assert (clean.warm, clean.reused) == (True, True) and _pids(clean) == _pids(first)
    assert _seen(clean) == _seen(cold_clean)


@pytest.mark.parametrize(
    "kwargs, plan, why",
    [
        ({"require_key": True}, [SchemaDrift(key="w", rank=1, step=1)], "crashed"),
        ({"stray": True}, [EmptyBatch(rank=1, step=0)], "unmatched"),
        ({"keep_workers": True}, [UnevenInputs(rank=0, batches=1)], "leftovers"),
    ],
)
def test_a_data_only_world_that_did_not_end_cleanly_is_torn_down(kwargs, plan, why):
    warm = run_world(loader_sums, world_size=2)
    result = run_world(loader_sums, world_size=2, faults=plan, kwargs=kwargs)
    assert result.warm and not result.reused and alive(_pids(warm)) == [] and pool.warm_pids() == []
    if why == "crashed":
        assert result.outcome == "crashed" and "KeyError" in result.root_cause
    else:
        assert result.outcome == "completed" and len(result.fired) == len(plan)
    leftovers = [e.get("leftovers") for r in result.ranks for e in r.events if e["k"] == "finished"]
    assert any(leftovers) == (why == "leftovers")
    assert pool.settled(result) == (why == "leftovers")  # each world is torn down for its one reason


def test_a_fault_free_world_with_an_unmatched_collective_is_torn_down():
    """Without it the next job's first all_reduce on rank 1 pairs with rank 0's stray one (measured: it hung)."""
    result = run_world(loader_sums, world_size=2, kwargs={"stray": True})
    assert result.outcome == "completed" and not result.reused and alive(_pids(result)) == []
    after = run_world(loader_sums, world_size=2)
    assert not after.warm and after.outcome == "completed"


@pytest.mark.parametrize("what", ["group", "no_grad", "dtype", "thread", "workers", "collective"])
def test_a_rank_that_left_state_behind_is_never_reused(what):
    result = run_world(rankfns.leave_state_behind, world_size=2, args=(what,))
    assert result.outcome == "completed" and not result.reused
    assert alive(result.values) == []
    assert any(e.get("leftovers") for r in result.ranks for e in r.events if e["k"] == "finished")


def test_opt_out_by_argument_and_by_environment(monkeypatch):
    assert not run_world(rankfns.all_reduce_steps, world_size=2, reuse=False).reused
    monkeypatch.setenv("DDPFAULTS_REUSE", "0")
    assert not run_world(rankfns.all_reduce_steps, world_size=2).reused
    assert pool.warm_pids() == []


def test_closing_the_pool_leaves_nothing_and_takes_no_time():
    import time

    result = run_world(rankfns.all_reduce_steps, world_size=4)
    assert sorted(pool.warm_pids()) == sorted(_pids(result))
    t0 = time.monotonic()
    pool.close_all()
    assert time.monotonic() - t0 < 2.0
    assert census.survivors(_pids(result)) == [] and pool.warm_pids() == []


def test_memory_of_a_warm_world_stays_flat_over_many_runs():
    first = run_world(rankfns.rss_kib, world_size=2)
    for _ in range(30):
        last = run_world(rankfns.rss_kib, world_size=2)
    assert last.warm and _pids(last) == _pids(first)
    growth = [b - a for a, b in zip(first.values, last.values, strict=True)]
    assert max(growth) < 20_000, f"rank RSS grew by {growth} KiB over 30 runs"


# warm ranks die with their launcher at exit: tests/engine/test_escapees.py::test_nothing_outlives_a_launcher_that_exits


def test_a_reused_worlds_flight_record_holds_only_its_own_jobs_collectives(tmp_path):
    """A rank's dump (what the judge reads and the user's --ddpfaults-flight-recorder directory gets) holds its
    job's collectives only, numbered on from the earlier jobs' (torch numbers a group's collectives)."""
    runs = [run_world(rankfns.all_reduce_steps, world_size=2, flight_recorder_dir=tmp_path / str(i)) for i in (0, 1)]
    assert [(r.warm, r.reused) for r in runs] == [(False, True), (True, True)]
    for i, run in enumerate(runs):
        for rank in (0, 1):
            with open(tmp_path / str(i) / f"rank_{rank}", "rb") as f:
                entries = pickle.load(f)["entries"]
            assert [e["collective_seq_id"] for e in entries] == [4 * i + n for n in (1, 2, 3, 4)]
            assert len(run.ranks[rank].collectives) == 4


def test_a_warm_ranks_flight_record_is_emptied_as_each_job_starts_so_the_world_is_never_retired_for_it(monkeypatch):
    """torch's own record (its dump copies out every entry it holds) holds nothing of the earlier jobs when a job
    starts on a warm world, so the world stays pooled however many collectives its jobs made."""
    monkeypatch.setattr(pool, "RECORD_LIMIT", 10)  # recorded_around_all_reduces makes 4 collectives a job
    runs = [run_world(rankfns.recorded_around_all_reduces, world_size=2) for _ in range(5)]
    assert [(r.warm, r.reused) for r in runs] == [(False, True)] + [(True, True)] * 4
    assert {tuple(_pids(r)) for r in runs} == {tuple(_pids(runs[0]))}
    assert [r.values for r in runs] == [[(0, 4), (0, 4)]] * 5
    assert all(r.ranks[i].events[0]["fresh_record"] for r in runs for i in (0, 1))


def test_a_warm_world_whose_ranks_cannot_empty_their_record_is_retired_once_it_passes_the_limit(monkeypatch):
    """Where a rank cannot empty its record (torch's symbols not found), every job's collectives stay in it: a
    world that holds more than RECORD_LIMIT of them is killed, and the next run starts a fresh one."""
    monkeypatch.setattr(pool, "RECORD_LIMIT", 10)  # 4 collectives a job
    runs = [run_world(rankfns.all_reduce_steps_keeping_the_record, world_size=2) for _ in range(5)]
    # the first job's group is new (its record fresh); from the second on, 4, 8, then 12 > 10 collectives are held
    kept = [(False, True), (True, True), (True, True), (True, False), (False, True)]  # (warm, pooled again)
    assert [(r.warm, r.reused) for r in runs] == kept
    assert [r.ranks[0].events[0]["fresh_record"] for r in runs] == [True, False, False, False, True]
    assert _pids(runs[3]) == _pids(runs[0]) and alive(_pids(runs[0])) == []
    assert set(_pids(runs[4])).isdisjoint(_pids(runs[0])) and runs[4].values == runs[0].values == [16.0, 16.0]
