"""Unit tests of the seeded toy data and models (single process; one test uses a 1-rank gloo group)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from ddpfaults.toy.data import (
    TARGET_FIELDS,
    fake_target_like,
    handmade_fake_target,
    make_batch,
    make_regression,
    make_scene,
    stack_point2segment,
    target_schema,
)
from ddpfaults.toy.models import MLP, SetCriterion, SetPredictionModel, parameters_equal, state_digest


def _assert_targets_equal(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for ta, tb in zip(a, b, strict=True):
        assert list(ta) == list(tb)
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and torch.equal(ta[key], tb[key]), key


def _loss_and_grads(targets, points=None, seed=0):
    model = SetPredictionModel(seed=seed)
    if points is None:
        points = torch.randn(len(targets), targets[0]["point2segment"].shape[0], 6)
    loss = SetCriterion()(model(points, stack_point2segment(targets)), targets)
    loss.backward()
    return model, loss.detach()


# -- data -----------------------------------------------------------------------------------


def test_scene_is_deterministic_and_seed_dependent():
    p1, t1 = make_scene(seed=3, index=5)
    p2, t2 = make_scene(seed=3, index=5)
    assert torch.equal(p1, p2)
    _assert_targets_equal([t1], [t2])
    p3, _ = make_scene(seed=4, index=5)
    p4, _ = make_scene(seed=3, index=6)
    assert not torch.equal(p1, p3) and not torch.equal(p1, p4)


def test_scene_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_scene(seed=0, index=0)
    make_batch(seed=0, rank=0, step=0)
    SetPredictionModel(seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_real_scene_schema():
    points, target = make_scene(seed=0, index=0, num_points=40, num_segments=10, num_classes=3)
    assert points.shape == (40, 6) and points.dtype == torch.float32
    assert tuple(target) == TARGET_FIELDS
    k = target["labels"].shape[0]
    assert 1 <= k <= 4
    assert target["labels"].dtype == torch.int64 and int(target["labels"].max()) < 3
    assert target["masks"].shape == (k, 10) and target["masks"].dtype == torch.float32
    assert target["segment_mask"].shape == (k, 10) and target["segment_mask"].dtype == torch.bool
    assert torch.equal(target["masks"].bool(), target["segment_mask"])
    assert bool(target["segment_mask"].any(dim=1).all()), "every instance owns a segment"
    assert int(target["segment_mask"].sum(dim=0).max()) <= 1, "instances do not overlap"
    assert target["inst_ids"].dtype == torch.int64 and len(set(target["inst_ids"].tolist())) == k
    p2s = target["point2segment"]
    assert p2s.shape == (40,) and p2s.dtype == torch.int64
    assert sorted(set(p2s.tolist())) == list(range(10)), "every segment has a point"


def test_empty_target_has_the_real_schema():
    _, real = make_scene(seed=0, index=0)
    _, empty = make_scene(seed=0, index=0, num_instances=0)
    assert tuple(empty) == TARGET_FIELDS
    assert target_schema(empty) == target_schema(real)
    assert empty["labels"].shape == (0,) and empty["segment_mask"].shape == (0, 16)
    assert torch.equal(empty["point2segment"], real["point2segment"])


def test_batch_is_deterministic_per_seed_rank_step():
    x1, t1 = make_batch(seed=0, rank=1, step=2)
    x2, t2 = make_batch(seed=0, rank=1, step=2)
    assert x1.shape == (2, 64, 6)
    assert torch.equal(x1, x2)
    _assert_targets_equal(t1, t2)
    for other in (dict(seed=1, rank=1, step=2), dict(seed=0, rank=0, step=2), dict(seed=0, rank=1, step=3)):
        assert not torch.equal(x1, make_batch(**other)[0]), other
    assert not torch.equal(x1[0], x1[1]), "batch items differ"


def test_empty_batch_has_no_instances_but_same_points():
    x, targets = make_batch(seed=0, rank=0, step=0, batch_size=3, empty=True)
    x_real, real = make_batch(seed=0, rank=0, step=0, batch_size=3)
    assert torch.equal(x, x_real)
    assert [len(t["labels"]) for t in targets] == [0, 0, 0]
    assert all(target_schema(t) == target_schema(r) for t, r in zip(targets, real, strict=True))


def test_fake_target_like_matches_real_schema():
    _, real = make_scene(seed=0, index=7)
    fake = fake_target_like(real)
    assert list(fake) == list(real)
    assert target_schema(fake) == target_schema(real)
    assert fake["labels"].shape == (0,) and fake["masks"].shape == (0, 16)
    assert torch.equal(fake["point2segment"], real["point2segment"])
    assert fake["point2segment"].data_ptr() != real["point2segment"].data_ptr(), "a copy, not an alias"


def test_fake_target_like_works_for_any_dict():
    real = {
        "boxes": torch.rand(3, 2, 4, dtype=torch.float64),
        "ids": torch.arange(3),
        "scale": torch.tensor(2.0),
        "name": "scene-7",
    }
    fake = fake_target_like(real)
    assert list(fake) == list(real)
    assert fake["boxes"].shape == (0, 2, 4) and fake["boxes"].dtype == torch.float64
    assert fake["ids"].shape == (0,) and fake["ids"].dtype == torch.int64
    assert torch.equal(fake["scale"], real["scale"]) and fake["name"] == "scene-7"


def test_handmade_fake_target_misses_keys():
    fake = handmade_fake_target(64, 16)
    assert set(TARGET_FIELDS) - set(fake) == {"segment_mask", "inst_ids"}


def test_regression_is_deterministic_and_shares_the_task():
    x1, y1 = make_regression(seed=0, rank=0, step=0)
    x2, y2 = make_regression(seed=0, rank=0, step=0)
    assert x1.shape == (8, 8) and y1.shape == (8, 2)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    xr, yr = make_regression(seed=0, rank=1, step=0)
    assert not torch.equal(x1, xr)
    # same true map on every rank: least squares on both ranks' data recovers one weight
    w = torch.linalg.lstsq(torch.cat([x1, xr]), torch.cat([y1, yr])).solution
    assert float((torch.cat([x1, xr]) @ w - torch.cat([y1, yr])).abs().max()) < 0.1
    _, y_other_seed = make_regression(seed=1, rank=0, step=0)
    assert not torch.equal(y1, y_other_seed)


# -- models ---------------------------------------------------------------------------------


def test_model_weights_are_seeded():
    a, b, c = SetPredictionModel(seed=0), SetPredictionModel(seed=0), SetPredictionModel(seed=1)
    assert parameters_equal(a, b) and state_digest(a) == state_digest(b)
    assert not parameters_equal(a, c) and state_digest(a) != state_digest(c)
    assert parameters_equal(MLP(seed=2), MLP(seed=2))
    assert not parameters_equal(MLP(seed=2), MLP(seed=3))
    assert state_digest(MLP(seed=2)) == state_digest(MLP(seed=2).state_dict())


def test_digest_and_equality_see_a_single_bit():
    a, b = MLP(seed=0), MLP(seed=0)
    with torch.no_grad():
        w = b.net[0].weight
        w.view(-1).view(torch.int32)[0] ^= 1  # flip the lowest mantissa bit of one weight
    assert not parameters_equal(a, b)
    assert state_digest(a) != state_digest(b)
    assert not parameters_equal(a, MLP(seed=0, hidden=8)), "different shapes"


def test_model_output_shapes():
    model = SetPredictionModel(num_queries=5, num_classes=3, num_segments=16)
    x, targets = make_batch(seed=0, rank=0, step=0, batch_size=3)
    out = model(x, stack_point2segment(targets))
    assert out["pred_logits"].shape == (3, 5, 4)
    assert out["pred_masks"].shape == (3, 5, 16)
    assert MLP()(torch.randn(4, 8)).shape == (4, 2)


@pytest.mark.parametrize("empty", [False, True])
def test_loss_is_finite_and_reaches_every_parameter(empty):
    x, targets = make_batch(seed=0, rank=0, step=0, empty=empty)
    model, loss = _loss_and_grads(targets, x)
    assert loss.dim() == 0 and math.isfinite(float(loss))
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []
    if not empty:
        assert float(model.mask_embed.weight.grad.abs().sum()) > 0


def test_fake_target_like_gives_finite_loss_with_all_gradients():
    x, real = make_batch(seed=0, rank=0, step=0)
    fake = [fake_target_like(t) for t in real]
    model, loss = _loss_and_grads(fake, x)
    assert math.isfinite(float(loss)) and float(loss) > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_handmade_fake_target_raises_keyerror_in_the_matcher():
    x, _ = make_batch(seed=0, rank=0, step=0, batch_size=1)
    targets = [handmade_fake_target(64, 16)]
    model = SetPredictionModel()
    with pytest.raises(KeyError, match="segment_mask") as info:
        SetCriterion()(model(x, stack_point2segment(targets)), targets)
    assert info.value.args == ("segment_mask",)
    assert info.traceback[-1].name == "match"


def test_matcher_matches_each_instance_once():
    x, targets = make_batch(seed=0, rank=0, step=1, batch_size=2)
    model = SetPredictionModel()
    indices = SetCriterion().match(model(x, stack_point2segment(targets)), targets)
    for (rows, cols), t in zip(indices, targets, strict=True):
        k = len(t["labels"])
        assert sorted(cols.tolist()) == list(range(k))
        assert len(set(rows.tolist())) == k


def test_model_and_batch_stay_tiny():
    """A step costs what the model and batch hold (the built-in suite runs hundreds of them): a size bound, not a
    timed assert, which a loaded machine would break."""
    x, targets = make_batch(seed=0, rank=0, step=0)
    model, criterion = SetPredictionModel(), SetCriterion()
    assert sum(p.numel() for p in model.parameters()) <= 5_000
    assert x.numel() <= 1_000
    criterion(model(x, stack_point2segment(targets)), targets).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_criterion_all_reduces_num_masks_in_a_process_group(tmp_path, monkeypatch):
    calls = []
    original = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        calls.append(tensor.clone())
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", spy)
    x, targets = make_batch(seed=0, rank=0, step=0)
    model, criterion = SetPredictionModel(), SetCriterion()
    criterion(model(x, stack_point2segment(targets)), targets)
    assert calls == [], "no collective without a process group"

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        loss = criterion(model(x, stack_point2segment(targets)), targets)
        assert len(calls) == 1
        assert float(calls[0]) == sum(len(t["labels"]) for t in targets)
        assert math.isfinite(loss.item())
        assert float(criterion._reduce_num_masks(torch.tensor([0.0]))) == 1.0, "clamped to at least 1"
        assert len(calls) == 2
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
