"""Seeded synthetic data for the scenarios: point-cloud scenes with set-prediction targets, and regression.

Everything here is pure torch and deterministic: each call draws from its own local
``torch.Generator`` seeded from its arguments, never from the global RNG, so the same
arguments give bit-identical tensors in every process.

A scene target (Mask3D style) is a dict with exactly :data:`TARGET_FIELDS`, ``K`` instances,
``S`` segments and ``P`` points:

==================  =========  ==========  =====================================================
key                 dtype      shape       meaning
==================  =========  ==========  =====================================================
``labels``          int64      ``[K]``     class of each instance, in ``[0, num_classes)``
``masks``           float32    ``[K, S]``  instance masks over segments, 0./1. (loss targets)
``segment_mask``    bool       ``[K, S]``  the same masks as bool (what the matcher indexes)
``inst_ids``        int64      ``[K]``     distinct instance ids of the scene (>= 1)
``point2segment``   int64      ``[P]``     segment of each point; a per-scene field, not per-instance
==================  =========  ==========  =====================================================

An *empty* target (``num_instances=0``) has ``K = 0``: same keys, dtypes and trailing shapes.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from ddpfaults.faults.batches import zero_instance_target

#: The exact schema (key set) of a real scene target.
TARGET_FIELDS = ("labels", "masks", "segment_mask", "inst_ids", "point2segment")

#: Target fields that describe the scene rather than its instances (kept whole by :func:`fake_target_like`).
PER_SCENE_FIELDS = ("point2segment",)


def _mix(*values: int | str) -> int:
    """A stable 63-bit seed derived from ``values`` (same in every process, unlike ``hash``)."""
    key = tuple(v if isinstance(v, str) else int(v) for v in values)
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _generator(*values: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(_mix(*values))


def make_scene(
    *,
    seed: int,
    index: int,
    num_points: int = 64,
    num_segments: int = 16,
    num_instances: int | None = None,
    feat_dim: int = 6,
    num_classes: int = 4,
) -> tuple[Tensor, dict]:
    """One synthetic scene: ``(points [num_points, feat_dim] float32, target)``.

    Points are clustered around one random centre per segment; every segment has at least one
    point and every instance at least one segment. ``num_instances=None`` draws 1 to 4 instances;
    ``num_instances=0`` gives an empty target (see the module docstring for the schema) with the
    same points and ``point2segment`` as the real scene.
    Same ``(seed, index)`` and sizes give identical tensors.
    """
    if not 1 <= num_segments <= num_points:
        raise ValueError(f"need 1 <= num_segments <= num_points, got {num_segments=} {num_points=}")
    if num_instances is not None and not 0 <= num_instances <= num_segments:
        raise ValueError(f"need 0 <= num_instances <= num_segments, got {num_instances=} {num_segments=}")
    g = _generator("scene", seed, index)
    # points first and k always drawn, so an empty scene has the same points as the real one
    point2segment = (torch.arange(num_points) % num_segments)[torch.randperm(num_points, generator=g)]
    centres = torch.randn(num_segments, feat_dim, generator=g) * 2.0
    points = centres[point2segment] + 0.1 * torch.randn(num_points, feat_dim, generator=g)
    drawn = int(torch.randint(1, min(4, num_segments) + 1, (), generator=g))
    k = drawn if num_instances is None else num_instances

    # instance of each segment (-1: background); the first k segments of a permutation seed the k instances
    seg_inst = torch.randint(-1, max(k, 1), (num_segments,), generator=g) if k else torch.full((num_segments,), -1)
    seg_inst[torch.randperm(num_segments, generator=g)[:k]] = torch.arange(k)
    segment_mask = seg_inst.unsqueeze(0) == torch.arange(k).unsqueeze(1)  # [k, S] bool

    target = {
        "labels": torch.randint(0, num_classes, (k,), generator=g),
        "masks": segment_mask.float(),
        "segment_mask": segment_mask,
        "inst_ids": torch.randperm(1000, generator=g)[:k] + 1,
        "point2segment": point2segment,
    }
    return points.float(), target


def make_batch(
    *,
    seed: int,
    rank: int,
    step: int,
    batch_size: int = 2,
    empty: bool = False,
    num_points: int = 64,
    num_segments: int = 16,
    feat_dim: int = 6,
    num_classes: int = 4,
) -> tuple[Tensor, list[dict]]:
    """A batch of scenes for ``rank`` at ``step``: ``(points [B, P, F], [target] * B)``.

    Deterministic per ``(seed, rank, step)``; different ranks and steps get different scenes.
    ``empty=True`` gives the same points but zero-instance targets (the "no valid instances" batch).
    Feed the model with ``model(points, stack_point2segment(targets))``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    scenes = [
        make_scene(
            seed=seed,
            index=_mix(rank, step, b),
            num_points=num_points,
            num_segments=num_segments,
            num_instances=0 if empty else None,
            feat_dim=feat_dim,
            num_classes=num_classes,
        )
        for b in range(batch_size)
    ]
    return torch.stack([points for points, _ in scenes]), [target for _, target in scenes]


def stack_point2segment(targets: list[dict]) -> Tensor:
    """The ``[B, P]`` int64 tensor of each target's ``point2segment``, the model's second input."""
    return torch.stack([t["point2segment"] for t in targets])


def target_schema(target: dict) -> dict:
    """``{key: (dtype, trailing shape)}`` of a target: what must match between a real and a fake one.

    The trailing shape is the shape without its first (instance) dimension; for non-tensors it is
    the value's type.
    """
    return {
        key: (value.dtype, tuple(value.shape[1:])) if isinstance(value, Tensor) else type(value)
        for key, value in target.items()
    }


def fake_target_like(real_target: dict, *, keep: tuple[str, ...] = PER_SCENE_FIELDS) -> dict:
    """A zero-instance target derived from ``real_target``: the FIXED remedy for an empty rank.

    Works for any dict: every tensor keeps its dtype, device and trailing shape but gets zero rows
    (``value[:0]``), except the per-scene keys in ``keep`` and 0-dim tensors, which are cloned whole;
    non-tensor values are deep-copied. Because it is derived, it can never miss a key the matcher reads.
    The same transform as the :class:`~ddpfaults.faults.EmptyBatch` fault applies.
    """
    return zero_instance_target(real_target, keep=keep)


def handmade_fake_target(num_points: int, num_segments: int) -> dict:
    """The NAIVE remedy from the field: a hand-copied empty target with only ``labels``, ``masks``
    and ``point2segment``. It lacks ``segment_mask`` and ``inst_ids``, so the matcher raises
    ``KeyError: 'segment_mask'`` on the rank that uses it.
    """
    return {
        "labels": torch.zeros(0, dtype=torch.int64),
        "masks": torch.zeros(0, num_segments),
        "point2segment": torch.zeros(num_points, dtype=torch.int64),
    }


def make_regression(
    *, seed: int, rank: int, step: int, batch_size: int = 8, in_dim: int = 8, out_dim: int = 2
) -> tuple[Tensor, Tensor]:
    """A regression batch ``(x [batch_size, in_dim], y [batch_size, out_dim])`` for :class:`~ddpfaults.toy.models.MLP`.

    The true linear map depends on ``seed`` only (every rank learns the same task); the samples and
    noise depend on ``(seed, rank, step)``.
    """
    weight = torch.randn(in_dim, out_dim, generator=_generator("regression-weight", seed))
    g = _generator("regression", seed, rank, step)
    x = torch.randn(batch_size, in_dim, generator=g)
    y = x @ weight + 0.01 * torch.randn(batch_size, out_dim, generator=g)
    return x, y
