"""Unused parameters that differ by rank: a data-dependent branch skips a head on one rank at one step.

A two-head MLP trains a main regression target and, when the batch carries one, an auxiliary target
(``batch["aux"]``). ``SchemaDrift(key="aux", rank=1, step=1)`` drops the auxiliary target from rank 1's
batch at step 1, so on that rank and step the auxiliary head takes no part in the loss: the parameters
DDP sees used differ by rank (the field's "data-dependent branch").

Measured on gloo, 4 ranks, torch 2.13.0 CPU (every variant 5 runs, the same verdict each time):

- ``naive`` (``find_unused_parameters=False``): rank 1 raises "Expected to have finished reduction in the
  prior iteration" at step 2's forward; its peers get "Connection closed by peer" — a crash, as reported.
- ``naive_last_step``: the same drift at the *last* step (2 of 3) is no crash: rank 1's gradient bucket is
  never ready, so it never calls that all_reduce and finishes its loop while ranks 0, 2, 3 wait in it — a
  hang, named as rank 1 never calling the DDP gradient bucket's all_reduce. The error the field knows only
  appears if there is a next forward to notice the unfinished reduction.
- ``find_unused`` (``find_unused_parameters=True``): completes with bit-equal replicas (the skipped head
  gets a zero gradient on rank 1, averaged with the others').
- ``static_graph`` (``static_graph=True``, the graph changes on rank 1 at step 1): rank 1 raises at step 2's
  forward "Expected to have finished reduction ... not compatible with static_graph set to True" (naming the
  parameter indices, 4 and 5: the aux head). Adding ``find_unused_parameters=True`` to it changes nothing
  (measured once: the same crash).
- ``static_graph_first_step`` (the change on rank 1 at step 0, the iteration static_graph learns from): rank
  1 raises at step 1's backward "Your training graph has changed in this iteration, e.g., one parameter is
  unused in first iteration, but then got used in the second iteration".
- ``fixed`` (``find_unused_parameters=False``; a rank without an auxiliary target still adds
  ``aux_out.sum() * 0``, so every rank's graph reaches every parameter): completes with bit-equal replicas,
  without find_unused's extra graph traversal each step.

Against the field: the "Expected to have finished reduction" crash is real, but only when another forward
follows; at the last step (end of epoch, end of training) the same bug is a silent hang. ``static_graph``
is sometimes suggested as a cheaper ``find_unused_parameters``: with a graph that differs by rank it is not
a fix, it crashes the same way (with a clearer message).
"""

import torch
import torch.nn.functional as F
from torch import nn

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults.faults import SchemaDrift
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import state_digest

DRIFT = SchemaDrift(key="aux", rank=1, step=1)


class TwoHeadMLP(nn.Module):
    """A seeded trunk with a main head and an auxiliary head (the branch a batch may not use)."""

    def __init__(self, *, in_dim: int = 8, hidden: int = 16, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.trunk = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU())
            self.main = nn.Linear(hidden, 2)
            self.aux = nn.Linear(hidden, 1)

    def forward(self, x, use_aux: bool):
        """``(main output, aux output or None)``: the aux head runs only when ``use_aux``."""
        h = self.trunk(x)
        return self.main(h), (self.aux(h) if use_aux else None)


def _batch(ctx, step):
    x, y = make_regression(seed=ctx.seed, rank=ctx.rank, step=step)
    batch = {"x": x, "y": y, "aux": y.sum(dim=1, keepdim=True)}
    drift = ctx.fault(SchemaDrift)
    return batch if drift is None else drift.on_batch(batch)


@ddpfaults.scenario(
    world_size=4,
    faults=[DRIFT],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"ddp_kwargs": {}},
            expect=ddpfaults.Expect(
                "crashed", rank=1, error="RuntimeError", root_cause="Expected to have finished reduction"
            ),
        ),
        ddpfaults.variant(
            "find_unused",
            kwargs={"ddp_kwargs": {"find_unused_parameters": True}},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "naive_last_step",
            faults=[SchemaDrift(key="aux", rank=1, step=2)],
            kwargs={"ddp_kwargs": {}},
            stall=HANG_STALL,
            expect="hung on rank 1 in all_reduce",
        ),
        ddpfaults.variant(
            "static_graph",
            kwargs={"ddp_kwargs": {"static_graph": True}},
            expect=ddpfaults.Expect(
                "crashed", rank=1, error="RuntimeError", root_cause="not compatible with static_graph set to True"
            ),
        ),
        ddpfaults.variant(
            "static_graph_first_step",
            faults=[SchemaDrift(key="aux", rank=1, step=0)],
            kwargs={"ddp_kwargs": {"static_graph": True}},
            expect=ddpfaults.Expect(
                "crashed", rank=1, error="RuntimeError", root_cause="unused in first iteration, but then got used"
            ),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"ddp_kwargs": {}, "zero_aux": True},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
    ],
)
def unused_params(ctx, ddp_kwargs, zero_aux=False, steps=3):
    """Train the two-head MLP; the aux head is skipped where the batch has no ``aux``; return the digest."""
    model = TwoHeadMLP(seed=ctx.seed)
    ddp = ctx.ddp(model, **ddp_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        ctx.step(step)
        batch = _batch(ctx, step)
        has_aux = "aux" in batch
        main, aux = ddp(batch["x"], use_aux=has_aux or zero_aux)
        loss = F.mse_loss(main, batch["y"])
        if has_aux:
            loss = loss + F.mse_loss(aux, batch["aux"])
        elif zero_aux:
            loss = loss + aux.sum() * 0  # this rank has no aux target, but its graph still reaches the aux head
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return state_digest(model)
