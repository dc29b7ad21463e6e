"""Reports 000/001: one rank's batch has no valid instances and its trainer takes a shortcut.

Measured on gloo (what the variants assert), against the reports' claims:

- ``early_return`` (``pred_logits.sum() * 0``, ``mask_embed`` unused on the empty rank, no criterion
  collective), ``find_unused_parameters=False``: the empty rank raises "Expected to have finished
  reduction in the prior iteration" at the next step; its peers get "Connection closed by peer".
- ``early_return_find_unused``: the same with ``find_unused_parameters=True`` completes with bit-equal
  replicas — contradicting report 000, which says the early return cannot work there.
- ``criterion_skip``: the real criterion all_reduces ``num_masks``; the empty rank skips it. This is
  the cause report 000's note names (confirmed with ``find_unused_parameters=True``; with ``False``
  the unused parameters alone already crash, see ``early_return``). Report 000 saw a freeze; on gloo
  the skip is a size mismatch that gloo detects and aborts a rank on — a crash, named here as the
  empty rank diverging.
- ``blamed_params_zero`` / ``proposed_per_param_zero``: report 001 blamed
  ``sum(p.sum() for p in params) * 0.0`` and proposed ``(p * 0).sum()`` per parameter. Both complete
  with bit-equal replicas: the blamed code was not the cause.
- ``skip_backward``: the empty rank ``continue`` s past loss and backward. Its next step's gradient
  all_reduce pairs with its peers' current one, so it finishes a step early while they wait: a true
  hang (the freeze report 000 describes), named as rank 1 diverging.
- ``fixed``: every rank all_reduces an empty flag first; an empty rank runs the full forward and the
  real criterion (with its collective) on fake targets derived from a real target's schema.
"""

import torch

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults import remedies
from ddpfaults.faults import EmptyBatch
from ddpfaults.toy.data import make_batch, make_scene, stack_point2segment
from ddpfaults.toy.models import SetCriterion, SetPredictionModel, state_digest

EMPTY = EmptyBatch(rank=1, step=1)


class LocalCriterion(SetCriterion):
    """The set criterion without its ``num_masks`` all_reduce (normalises by the local count)."""

    def _reduce_num_masks(self, num_masks):
        return torch.clamp(num_masks, min=1)


def _shortcut_loss(strategy, model, outputs):
    """The zero loss an empty rank returns instead of running the criterion (the naive strategies)."""
    if strategy == "blamed_params_zero":
        return sum(p.sum() for p in model.parameters()) * 0.0
    if strategy == "proposed_per_param_zero":
        return sum((p * 0).sum() for p in model.parameters())
    return outputs["pred_logits"].sum() * 0


@ddpfaults.scenario(
    world_size=4,
    faults=[EMPTY],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "early_return",
            kwargs={"strategy": "early_return", "sync_criterion": False},
            expect=ddpfaults.Expect(
                "crashed", rank=1, error="RuntimeError", root_cause="Expected to have finished reduction"
            ),
        ),
        ddpfaults.variant(
            "early_return_find_unused",
            expect=ddpfaults.Expect("completed", values_equal=True),
            kwargs={"strategy": "early_return", "find_unused": True, "sync_criterion": False},
        ),
        ddpfaults.variant(
            "criterion_skip",
            kwargs={"strategy": "early_return", "find_unused": True},
            expect=ddpfaults.Expect("crashed", rank=1, collective="all_reduce", root_cause="collective mismatch"),
        ),
        ddpfaults.variant(
            "blamed_params_zero",
            expect=ddpfaults.Expect("completed", values_equal=True),
            kwargs={"strategy": "blamed_params_zero", "sync_criterion": False},
        ),
        ddpfaults.variant(
            "proposed_per_param_zero",
            expect=ddpfaults.Expect("completed", values_equal=True),
            kwargs={"strategy": "proposed_per_param_zero", "sync_criterion": False},
        ),
        ddpfaults.variant(
            "skip_backward",
            kwargs={"strategy": "skip_backward", "sync_criterion": False},
            stall=HANG_STALL,
            expect="hung on rank 1 in all_reduce",
        ),
        ddpfaults.variant(
            "fixed", kwargs={"strategy": "fixed"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
    ],
)
def empty_batch(ctx, strategy, find_unused=False, sync_criterion=True, steps=3):
    """Train the set-prediction toy; rank 1's batch at step 1 has no instances; return the weights' digest."""
    model = SetPredictionModel(seed=ctx.seed)
    ddp = ctx.ddp(model, find_unused_parameters=find_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = SetCriterion() if sync_criterion else LocalCriterion()
    reference = make_scene(seed=ctx.seed, index=0)[1]  # a real target: the schema fake targets derive from
    for step in range(steps):
        ctx.step(step)
        points, targets = make_batch(seed=ctx.seed, rank=ctx.rank, step=step)
        fault = ctx.fault(EmptyBatch)
        if fault is not None:
            targets = fault.apply(targets)
        is_empty = all(len(t["labels"]) == 0 for t in targets)
        if strategy == "fixed":
            if remedies.all_ranks_empty(is_empty):
                continue  # every rank skips together: no collective is left unmatched
            if is_empty:
                targets = remedies.fake_targets(reference, targets)
        outputs = ddp(points, stack_point2segment(targets))
        if is_empty and strategy == "skip_backward":
            continue
        if is_empty and strategy != "fixed":
            loss = _shortcut_loss(strategy, model, outputs)
        else:
            loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return state_digest(model)
