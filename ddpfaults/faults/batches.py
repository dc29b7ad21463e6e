"""What a data fault does to a batch a ``DataLoader`` yields, for any batch layout (no torch import at load).

:func:`empty_batch` makes the batch a rank gets at an :class:`~ddpfaults.faults.EmptyBatch` step:

- a batch holding a list of per-sample target dicts (DETR/COCO style ``(images, [target, ...])``) keeps its
  samples and each target's per-sample metadata (:data:`PER_SAMPLE_KEYS`, 0-dim tensors, non-tensors), while
  every per-instance tensor gets 0 rows: the samples are there, none has an instance (the field's
  "All samples have no valid instances");
- any other batch has every tensor sliced to 0 along the batch dimension (``t[:0]``): a batch of no samples;
- dicts, lists, tuples and named tuples are rebuilt recursively; other values are kept as they are;
- a type registered with :func:`register_empty_batch` is emptied by its own function, wherever it appears.

:func:`drop_key` is :class:`~ddpfaults.faults.SchemaDrift`'s effect: the key removed from every dict in the batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

#: Target keys that describe the whole sample (image or scene), not its instances: kept whole when emptied.
PER_SAMPLE_KEYS = ("image_id", "orig_size", "size", "point2segment")

_EMPTY_BY_TYPE: dict[type, Callable[[Any], Any]] = {}


def register_empty_batch(batch_type: type, transform: Callable[[Any], Any]) -> None:
    """Teach :class:`~ddpfaults.faults.EmptyBatch` to empty a value of ``batch_type`` (your own batch or sample
    class, e.g. a ``NestedTensor``): ``transform(value)`` returns its empty counterpart.

    Register at import time of a module the ranks import (your script, or the module defining the type), or
    before calling ``run_world``/``run_script``: the launcher hands its registrations to every rank. The
    transform must be a module-level function (it travels to the ranks by reference).
    """
    if not isinstance(batch_type, type):
        raise TypeError(f"register_empty_batch: batch_type must be a class, got {batch_type!r}")
    if not callable(transform):
        raise TypeError(f"register_empty_batch: transform must be callable, got {transform!r}")
    _EMPTY_BY_TYPE[batch_type] = transform


def registered() -> dict:
    """The registered transforms (type -> function), to hand to the ranks."""
    return dict(_EMPTY_BY_TYPE)


def adopt(transforms: dict) -> None:
    """Add transforms registered in the launcher (inside a rank; the rank's own registrations win)."""
    for batch_type, transform in transforms.items():
        _EMPTY_BY_TYPE.setdefault(batch_type, transform)


def zero_instance_target(target: dict, *, keep: tuple[str, ...] = PER_SAMPLE_KEYS) -> dict:
    """A zero-instance copy of ``target``: the same keys, dtypes, devices and trailing shapes, no rows.

    Every tensor gets zero rows along dim 0 (``value[:0]``), except the per-sample keys in ``keep`` and
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


def _is_target_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _holds_targets(value) -> bool:
    if _registered_transform(value) is not None:
        return False
    if _is_target_list(value):
        return True
    if isinstance(value, dict):
        return any(_holds_targets(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_targets(v) for v in value)
    return False


def _registered_transform(value):
    for klass in type(value).__mro__:
        if klass in _EMPTY_BY_TYPE:
            return _EMPTY_BY_TYPE[klass]
    return None


def _rebuild(value, items: list):
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*items)
    return type(value)(items) if isinstance(value, tuple) else items


def _empty(value, instances: bool):
    from torch import Tensor

    transform = _registered_transform(value)
    if transform is not None:
        return transform(value)
    if isinstance(value, Tensor):
        return value if instances or value.dim() == 0 else value.detach()[:0].clone()
    if instances and _is_target_list(value):
        return [zero_instance_target(t) for t in value]
    if isinstance(value, dict):
        return {k: _empty(v, instances) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _rebuild(value, [_empty(v, instances) for v in value])
    return value


def empty_batch(batch):
    """``batch`` with no instances (per-sample targets) or no samples (anything else); see the module doc."""
    return _empty(batch, instances=_holds_targets(batch))


def can_empty(batch) -> bool:
    """True if :func:`empty_batch` changes ``batch`` (it holds a tensor with rows, a target list, a registered type)."""
    from torch import Tensor

    if _registered_transform(batch) is not None or _is_target_list(batch):
        return True
    if isinstance(batch, Tensor):
        return batch.dim() > 0 and len(batch) > 0
    if isinstance(batch, dict):
        return any(can_empty(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(can_empty(v) for v in batch)
    return False


def drop_key(batch, key: str):
    """``batch`` with ``key`` removed from every dict in it (recursively); other values are kept."""
    if isinstance(batch, dict):
        return {k: drop_key(v, key) for k, v in batch.items() if k != key}
    if isinstance(batch, (list, tuple)):
        return _rebuild(batch, [drop_key(v, key) for v in batch])
    return batch


def holds_key(batch, key: str) -> bool:
    """True if some dict in ``batch`` has ``key`` (so dropping it changes the batch)."""
    if isinstance(batch, dict):
        return key in batch or any(holds_key(v, key) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(holds_key(v, key) for v in batch)
    return False
