"""Which optimizer ``step()`` calls train: an optimizer's state built by a step that learns nothing is not one.

``torch.distributed.checkpoint.state_dict``'s ``get_state_dict``/``set_state_dict`` build a fresh optimizer's state
(``_init_optim_state``) by setting every gradient to zeros, every group's learning rate to 0, and calling ``step()``;
other code builds a lazy state the same way. Such a call is no training step: the step clock and the resume check's
capture leave it out, so both agree with the script on the steps it trained.
"""

from __future__ import annotations

import torch


def initialising(optimizer) -> bool:
    """True if ``optimizer``'s ``step()`` (called now: before it or after it, with its gradients as they are) is one
    that builds its state: every group's learning rate is 0 and every parameter that requires a gradient has one of
    all zeros (as DCP sets them). Reads the gradients only when every learning rate is 0 (a warmup's first step at
    rate 0 with real gradients is a step: Adam's moments move; a step at rate 0 with no gradient at all, a script's
    step counter, is one too)."""
    groups = optimizer.param_groups
    if not groups or any(_rate(group.get("lr")) != 0 for group in groups):
        return False
    grads = [p.grad for group in groups for p in group["params"] if p.requires_grad]
    return bool(grads) and all(g is not None and not torch.count_nonzero(_local(g)).item() for g in grads)


def _rate(lr) -> float | None:
    if isinstance(lr, torch.Tensor):
        return lr.item() if lr.numel() == 1 else None
    return lr if isinstance(lr, (int, float)) else None


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor
