"""Which optimizer ``step()`` calls train: an optimizer's state built by a step that learns nothing is not one, and
neither is an inner optimizer's step inside a container's (:func:`nested`).

``torch.distributed.checkpoint.state_dict``'s ``get_state_dict``/``set_state_dict`` build a fresh optimizer's state
(``_init_optim_state``) by setting every gradient to zeros, every group's learning rate to 0, and calling ``step()``;
other code builds a lazy state the same way. Such a call is no training step: the step clock and the resume check's
capture leave it out, so both agree with the script on the steps it trained.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.optim.optimizer as _optimizer

#: the file of ``Optimizer.profile_hook_step``'s ``wrapper``, around every optimizer's ``step()`` (its hooks run in it)
_STEP_FILE = os.path.normcase(_optimizer.__file__)


def nested() -> bool:
    """True when the optimizer ``step()`` whose hook calls this runs inside another optimizer's ``step()``: an
    optimizer container that is itself a ``torch.optim.Optimizer`` and steps its inner optimizers (as LLM training
    frameworks have) is one training step, counted at its outermost ``step()``. Told from the stack: torch runs every
    ``step()`` inside ``Optimizer.profile_hook_step``'s ``wrapper``, so two of them on it are one step in another."""
    frame, steps = sys._getframe(1), 0
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wrapper" and os.path.normcase(code.co_filename) == _STEP_FILE:
            steps += 1
            if steps > 1:
                return True
        frame = frame.f_back
    return False


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
