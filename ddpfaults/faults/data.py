"""Data faults: wrong data handed to a rank (empty batch, schema drift, device mismatch, uneven inputs).

Two ways to take effect. Code that never asks for them gets them at torch's own seams: the batches a
``torch.utils.data.DataLoader`` yields (:meth:`on_batch`, :attr:`batch_limit`) and the construction of
``DistributedDataParallel`` (:meth:`DeviceMismatch.ddp_kwargs`). Scenario code that asks ``ctx.fault(Kind)``
applies the returned fault to its own data instead (asking claims that kind on that rank: the seams then
leave it alone). Nothing here imports torch at module level.
"""

from __future__ import annotations

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault, _require_rank, _require_step
from ddpfaults.faults.batches import can_empty, drop_key, empty_batch, holds_key, zero_instance_target


class EmptyBatch(Fault):
    """``rank``'s batch at ``step`` has no valid instances: targets with zero rows, same schema.

    At the DataLoader seam every batch the rank gets at ``step`` is emptied (see
    :mod:`ddpfaults.faults.batches`). Scenario code may instead ask ``f = ctx.fault(EmptyBatch)`` and, when it
    is set, pass its batch targets through ``f.apply(targets)``.
    """

    data_only = True  # new tensors for the batch, nothing patched or kept
    seam = "dataloader"

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def apply(self, targets: list) -> list:
        """The same targets with every per-instance field cut to zero rows (keys, dtypes, shapes kept)."""
        return [zero_instance_target(t) for t in targets]

    def on_batch(self, batch):
        """A DataLoader batch at the fault's step, emptied (:func:`~ddpfaults.faults.batches.empty_batch`); None if
        there was nothing to empty (no tensor with rows, no target list, no registered type in it)."""
        return empty_batch(batch) if can_empty(batch) else None

    def same_effect(self, other: Fault) -> str | None:
        """Two EmptyBatch on one rank and step: the first empties the batch, the second finds nothing to empty."""
        return "empty the batch" if isinstance(other, EmptyBatch) else None


class SchemaDrift(Fault):
    """Real targets carry an extra required ``key`` that a hand-written fake target does not know.

    ``apply(target)`` gives a real target the key (a no-op when the data already has it, as the
    toy data has ``segment_mask``); ``require(targets)`` is the consumer that reads it and raises
    ``KeyError: key`` for a target without it, as the matcher does. Every rank by default.
    """

    data_only = True  # a rebuilt batch without the key, nothing patched or kept
    seam = "dataloader"

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

    def on_batch(self, batch):
        """A DataLoader batch at the fault's step with ``key`` dropped from its target dicts (None: no dict had it)."""
        return drop_key(batch, self.key) if holds_key(batch, self.key) else None

    def same_effect(self, other: Fault) -> str | None:
        """Two drifts of the same key: the first drops it, the second finds it gone (different keys compose)."""
        return f"drop key {self.key!r}" if isinstance(other, SchemaDrift) and other.key == self.key else None

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

    data_only = False  # it changes how DDP is built (devices, its checks), not data
    seam = "ddp"

    def __init__(self, *, device_type: str = "xla", rank=None, step=None):
        super().__init__(rank=rank, step=step)
        if not isinstance(device_type, str) or not device_type.isidentifier() or device_type == "cpu":
            raise FaultError(f"DeviceMismatch: device_type must name an accelerator like 'xla', got {device_type!r}")
        self.device_type = device_type

    def launcher_device(self, rank: int):
        """The device the launcher hands to ``rank``."""
        import torch

        return torch.device(self.device_type, rank)

    def ddp_kwargs(self, rank: int, args: tuple, kwargs: dict) -> dict | None:
        """At ``DistributedDataParallel(module, *args, **kwargs)`` on ``rank``: the keyword arguments of the naive
        wrap (``device_ids=[rank]`` from the launcher's device), or None if the caller already chose devices."""
        if args or kwargs.get("device_ids") is not None:
            return None
        return {**kwargs, "device_ids": [self.launcher_device(rank).index]}

    def same_effect(self, other: Fault) -> str | None:
        """One DDP construction per model: the first mismatch chooses its devices, the second finds them chosen."""
        return "choose the devices of the DDP construction" if isinstance(other, DeviceMismatch) else None

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.device_type != "xla":
            fields["device_type"] = repr(self.device_type)
        return fields


class UnevenInputs(Fault):
    """``rank``'s loader yields only ``batches`` batches (the other ranks' loaders are longer).

    Scenario code asks ``f = ctx.fault(UnevenInputs)`` before its loop (or at any step) and
    iterates ``f.limit(loader)``. ``batches=0``: the rank never enters the training loop. At the DataLoader
    seam it fires only when it cuts an iterator short (one with at most ``batches`` batches is left alone).
    """

    data_only = True  # a DataLoader iterator cut short (workers it leaves running are leftover state)
    seam = "dataloader"

    def __init__(self, *, rank, batches: int):
        super().__init__(rank=rank)
        _require_rank(self)
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise FaultError(f"UnevenInputs: batches must be a non-negative int, got {batches!r}")
        self.batches = batches

    @property
    def batch_limit(self) -> int:
        """How many batches each DataLoader iterator on the fault's rank yields before it stops."""
        return self.batches

    def same_effect(self, other: Fault) -> str | None:
        """Two limits on one rank's loaders: the shorter stops them, the other never does."""
        return "cut the rank's DataLoader short" if isinstance(other, UnevenInputs) else None

    def limit(self, loader):
        """An iterator over at most ``batches`` items of ``loader``."""
        import itertools

        return itertools.islice(loader, self.batches)

    def _fields(self) -> dict:
        return {**super()._fields(), "batches": repr(self.batches)}
