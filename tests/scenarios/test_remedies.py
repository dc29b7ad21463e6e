"""ddpfaults.remedies: pure helpers in-process, collective helpers in real gloo worlds."""

import os

import pytest
import torch

from ddpfaults import remedies, run_world
from ddpfaults.toy.data import (
    TARGET_FIELDS,
    handmade_fake_target,
    make_batch,
    make_scene,
    stack_point2segment,
    target_schema,
)
from ddpfaults.toy.models import MLP, SetCriterion, SetPredictionModel, state_digest

# -- rank functions (module level: pickled by reference into the ranks) -------------------------


def emptiness(ctx, empty_ranks):
    """Each rank reports (count of empty ranks, all empty) for its own flag."""
    is_empty = ctx.rank in empty_ranks
    return remedies.empty_rank_count(is_empty), remedies.all_ranks_empty(is_empty)


def even(ctx, counts):
    """Rank r has counts[r] batches; return what even_batches leaves it."""
    return remedies.even_batches([f"r{ctx.rank}b{i}" for i in range(counts[ctx.rank])])


def save_then_load(ctx):
    """Rank 0 saves its own seeded model atomically; every rank loads it after the barrier."""
    path = os.path.join(ctx.shared_dir, "ckpt.pth")
    if ctx.rank == 0:
        remedies.atomic_save(MLP(seed=42).state_dict(), path)
    state = remedies.load_after_barrier(path)
    return state_digest(state), sorted(os.listdir(ctx.shared_dir))


def census(ctx, overlap):
    """Rank r trains on samples [4r, 4r+4), plus sample 0 if ``overlap``; steps = r + 1."""
    samples = list(range(4 * ctx.rank, 4 * ctx.rank + 4)) + ([0] if overlap and ctx.rank else [])
    return remedies.training_census(ctx.rank + 1, samples)


# -- emptiness ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "empty_ranks, expected",
    [
        ((), (0, False)),
        ((1,), (1, False)),
        ((0, 2), (2, False)),
        ((0, 1, 2), (3, True)),
    ],
)
def test_ranks_agree_on_emptiness(empty_ranks, expected):
    result = run_world(emptiness, world_size=3, kwargs={"empty_ranks": empty_ranks})
    assert result.outcome == "completed", result.report()
    assert result.values == [expected] * 3


# -- fake targets --------------------------------------------------------------------------------


def test_fake_targets_have_the_real_schema_zero_rows_and_each_scenes_point2segment():
    reference = make_scene(seed=0, index=0)[1]
    _, scenes = make_batch(seed=0, rank=1, step=3, batch_size=3)
    fakes = remedies.fake_targets(reference, scenes)
    assert len(fakes) == 3
    for fake, scene in zip(fakes, scenes, strict=True):
        assert tuple(fake) == TARGET_FIELDS
        assert target_schema(fake) == target_schema(reference)
        assert all(len(fake[k]) == 0 for k in ("labels", "masks", "segment_mask", "inst_ids"))
        assert torch.equal(fake["point2segment"], scene["point2segment"])
    assert len(reference["labels"]) > 0, "the reference must be left untouched"


def test_fake_targets_run_through_the_criterion_where_a_handmade_one_raises():
    reference = make_scene(seed=0, index=0)[1]
    points, scenes = make_batch(seed=0, rank=0, step=0)
    model, criterion = SetPredictionModel(seed=0), SetCriterion()
    outputs = model(points, stack_point2segment(scenes))
    loss = criterion(outputs, remedies.fake_targets(reference, scenes))
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(KeyError, match="segment_mask"):
        criterion(outputs, [handmade_fake_target(64, 16) for _ in scenes])


# -- checkpoints ---------------------------------------------------------------------------------


def test_atomic_save_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = str(tmp_path / "ckpt.pth")
    remedies.atomic_save({"v": torch.ones(2)}, path)
    remedies.atomic_save({"v": torch.zeros(2)}, path)
    assert torch.equal(torch.load(path)["v"], torch.zeros(2))
    assert os.listdir(tmp_path) == ["ckpt.pth"]


def test_atomic_save_interrupted_mid_write_keeps_the_last_good_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pth")
    remedies.atomic_save({"v": torch.ones(2)}, path)

    def half_then_die(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_then_die)
    with pytest.raises(OSError, match="disk full"):
        remedies.atomic_save({"v": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path)["v"], torch.ones(2))
    assert os.listdir(tmp_path) == ["ckpt.pth"]


def test_every_rank_loads_the_identical_state_after_the_barrier():
    result = run_world(save_then_load, world_size=3)
    assert result.outcome == "completed", result.report()
    digests = {v[0] for v in result.values}
    assert digests == {state_digest(MLP(seed=42))}
    assert all(v[1] == ["ckpt.pth"] for v in result.values), "no temp file may be left behind"


# -- device-aware wrap --------------------------------------------------------------------------


@pytest.mark.parametrize("local_device", [None, "cpu", torch.device("xla", 2), "cuda:1"])
def test_ddp_kwargs_pass_no_device_ids_for_a_cpu_module(local_device):
    assert remedies.ddp_kwargs(MLP(), local_device) == {}


def test_ddp_kwargs_pass_no_device_ids_for_a_module_spread_over_devices():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    assert remedies.ddp_kwargs(model, "cuda:0") == {}


def test_ddp_wrap_passes_the_kwargs_to_the_wrapper():
    seen = {}

    def wrapper(model, **kwargs):
        seen.update(kwargs, model=model)
        return "wrapped"

    model = MLP()
    assert remedies.ddp_wrap(model, torch.device("xla", 3), wrapper=wrapper, find_unused_parameters=True) == "wrapped"
    assert seen == {"model": model, "find_unused_parameters": True}


# -- uneven inputs and the census ---------------------------------------------------------------


def test_even_batches_cut_every_rank_to_the_shortest():
    result = run_world(even, world_size=3, kwargs={"counts": [4, 2, 3]})
    assert result.outcome == "completed", result.report()
    assert result.values == [["r0b0", "r0b1"], ["r1b0", "r1b1"], ["r2b0", "r2b1"]]


@pytest.mark.parametrize("overlap, expected_overlap", [(False, 0), (True, 1)])
def test_training_census_is_the_same_on_every_rank(overlap, expected_overlap):
    result = run_world(census, world_size=3, kwargs={"overlap": overlap})
    assert result.outcome == "completed", result.report()
    expected = {
        "steps": [1, 2, 3],
        "samples": [4, 4 + overlap, 4 + overlap],
        "overlap": expected_overlap,
        "covered": 12,
    }
    assert result.values == [expected] * 3


def _bn_data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(8, 4, generator=g) * 3 + 1, torch.randn(8, 4, generator=g)


def gloo_sync_bn(ctx, rows):
    """Rank r normalises rows[r] of a shared 8-row batch with GlooSyncBatchNorm; returns its part of the result."""
    x, coef = _bn_data()
    start, stop = rows[ctx.rank]
    bn = remedies.convert_gloo_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))[0]
    local = x[start:stop].clone().requires_grad_(True)
    out = bn(local)
    (out * coef[start:stop]).sum().backward()
    return out.detach(), local.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var


def test_gloo_sync_batchnorm_matches_one_batchnorm_over_every_ranks_rows_with_an_empty_rank():
    rows = [(0, 5), (5, 5), (5, 8)]  # rank 1's batch is empty
    result = run_world(gloo_sync_bn, world_size=3, kwargs={"rows": rows})
    assert result.outcome == "completed", result.report()
    x, coef = _bn_data()
    reference = torch.nn.BatchNorm1d(4)
    whole = x.clone().requires_grad_(True)
    out = reference(whole)
    (out * coef).sum().backward()
    got = result.values
    torch.testing.assert_close(torch.cat([v[0] for v in got]), out.detach())
    torch.testing.assert_close(torch.cat([v[1] for v in got]), whole.grad)
    torch.testing.assert_close(sum(v[2] for v in got), reference.weight.grad)  # DDP would all_reduce these
    torch.testing.assert_close(sum(v[3] for v in got), reference.bias.grad)
    for v in got:
        torch.testing.assert_close(v[4], reference.running_mean)
        torch.testing.assert_close(v[5], reference.running_var)


def test_convert_gloo_sync_batchnorm_keeps_the_state_and_refuses_nothing_on_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=None))
    model[1].running_mean.fill_(2.0)
    converted = remedies.convert_gloo_sync_batchnorm(model)
    assert isinstance(converted[1], remedies.GlooSyncBatchNorm)
    assert converted[1].momentum is None and torch.equal(converted[1].running_mean, torch.full((4,), 2.0))
    converted.eval()
    assert converted(torch.randn(2, 3)).shape == (2, 4)  # no process group, eval: a plain BatchNorm
