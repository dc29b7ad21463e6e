"""Data faults: wrong data handed to a rank (empty batch, schema drift, device mismatch, uneven inputs).

Scenario code asks for them with ``ctx.fault(Kind)`` and applies the returned fault to its own
data, so the effect sits in the scenario's code path. Nothing here imports torch at module level.
"""

from __future__ import annotations

import copy

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault, _require_rank, _require_step

#: Target keys that describe the scene rather than its instances: kept whole by :func:`zero_instance_target`.
PER_SCENE_KEYS = ("point2segment",)


def zero_instance_target(target: dict, *, keep: tuple[str, ...] = PER_SCENE_KEYS) -> dict:
    """A zero-instance copy of ``target``: the same keys, dtypes, devices and trailing shapes, no rows.

    Every tensor gets zero rows along dim 0 (``value[:0]``), except the per-scene keys in ``keep`` and
    0-dim tensors, which are cloned whole; non-tensor values are deep-copied. Works for any dict.
    """
    from torch import Tensor

    empty = {}
    for key, value in target.items():
        if not isinstance(value, Tensor):
            empty[key] = copy.deepcopy(value)
        elif key in keep or value.dim() == 0:
            empty[key] = value.detach().clone()
        else:
            empty[key] = value.detach()[:0].clone()
    return empty


class EmptyBatch(Fault):
    """``rank``'s batch at ``step`` has no valid instances: targets with zero rows, same schema.

    Scenario code asks ``f = ctx.fault(EmptyBatch)`` and, when it is set, passes its batch
    targets through ``f.apply(targets)``.
    """

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def apply(self, targets: list) -> list:
        """The same targets with every per-instance field cut to zero rows (keys, dtypes, shapes kept)."""
        return [zero_instance_target(t) for t in targets]


class SchemaDrift(Fault):
    """Real targets carry an extra required ``key`` that a hand-written fake target does not know.

    ``apply(target)`` gives a real target the key (a no-op when the data already has it, as the
    toy data has ``segment_mask``); ``require(targets)`` is the consumer that reads it and raises
    ``KeyError: key`` for a target without it, as the matcher does. Every rank by default.
    """

    def __init__(self, *, key: str, rank=None, step=None):
        super().__init__(rank=rank, step=step)
        if not isinstance(key, str) or not key.strip():
            raise FaultError(f"SchemaDrift: key must be a non-empty string like 'segment_mask', got {key!r}")
        self.key = key

    def apply(self, target: dict) -> dict:
        """``target`` with ``key`` present: added as a bool ``[K]`` per-instance flag if the data lacks it."""
        if self.key in target:
            return target
        import torch

        rows = len(target["labels"]) if "labels" in target else 0
        return {**target, self.key: torch.ones(rows, dtype=torch.bool)}

    def require(self, targets: list) -> None:
        """Read ``key`` from every target, raising ``KeyError(key)`` like the criterion's matcher."""
        for target in targets:
            target[self.key]

    def _fields(self) -> dict:
        return {"key": repr(self.key), **super()._fields()}


class DeviceMismatch(Fault):
    """The model stays on the CPU while the launcher hands each rank an accelerator-style device.

    ``launcher_device(rank)`` is ``torch.device(device_type, rank)`` (``xla:{rank}`` by default, as
    in report 004): a naive wrap turns it into ``device_ids=[rank]``. Every rank by default.
    """

    def __init__(self, *, device_type: str = "xla", rank=None, step=None):
        super().__init__(rank=rank, step=step)
        if not isinstance(device_type, str) or not device_type.isidentifier() or device_type == "cpu":
            raise FaultError(f"DeviceMismatch: device_type must name an accelerator like 'xla', got {device_type!r}")
        self.device_type = device_type

    def launcher_device(self, rank: int):
        """The device the launcher hands to ``rank``."""
        import torch

        return torch.device(self.device_type, rank)

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.device_type != "xla":
            fields["device_type"] = repr(self.device_type)
        return fields


class UnevenInputs(Fault):
    """``rank``'s loader yields only ``batches`` batches (the other ranks' loaders are longer).

    Scenario code asks ``f = ctx.fault(UnevenInputs)`` before its loop (or at any step) and
    iterates ``f.limit(loader)``. ``batches=0``: the rank never enters the training loop.
    """

    def __init__(self, *, rank, batches: int):
        super().__init__(rank=rank)
        _require_rank(self)
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise FaultError(f"UnevenInputs: batches must be a non-negative int, got {batches!r}")
        self.batches = batches

    def limit(self, loader):
        """An iterator over at most ``batches`` items of ``loader``."""
        import itertools

        return itertools.islice(loader, self.batches)

    def _fields(self) -> dict:
        return {**super()._fields(), "batches": repr(self.batches)}
