"""Report 004: the model's parameters stayed on the CPU, but the wrap still passes ``device_ids``.

``DeviceMismatch`` hands every rank an accelerator-style device (``xla:{rank}``, as under MMEngine);
the naive wrap turns it into ``DistributedDataParallel(model, device_ids=[rank])`` and every rank
raises ``ValueError: DistributedDataParallel device_ids and output_device arguments only work with
single-device/multiple-device GPU modules or CPU modules`` at construction — as reported, on every
rank. (The naive variant lets failed ranks linger: in gloo's exit mode a rank still connecting its
process group when the others raise and exit gets "Connection closed by peer" before it reaches the
wrap — measured.) The fixed wrap (:func:`ddpfaults.remedies.ddp_wrap`) passes no ``device_ids`` for a CPU module.
"""

import torch

import ddpfaults
from _checks import SAFE_STALL, every_rank_errors, expect
from ddpfaults import remedies
from ddpfaults.faults import DeviceMismatch
from ddpfaults.toy.models import MLP, regression_step, state_digest


@ddpfaults.scenario(
    world_size=4,
    faults=[DeviceMismatch()],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"wrap": "naive"},
            peer_failure="linger",
            expect=expect(
                "crashed with ValueError",
                every_rank_errors("ValueError"),
                root_cause="device_ids and output_device arguments only work",
            ),
        ),
        ddpfaults.variant(
            "fixed", kwargs={"wrap": "device_aware"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
    ],
)
def device(ctx, wrap, steps=3):
    """Wrap a CPU MLP in DDP with the launcher's device, naively or device-aware; train a few steps."""
    mismatch = ctx.fault(DeviceMismatch)
    local_device = mismatch.launcher_device(ctx.rank) if mismatch else torch.device("cpu")
    model = MLP(seed=ctx.seed)  # never moved to local_device: the bug's precondition
    if wrap == "naive":
        device_ids = [local_device.index] if local_device.type != "cpu" else None
        ddp = ctx.ddp(model, device_ids=device_ids)
    else:
        ddp = remedies.ddp_wrap(model, local_device, wrapper=ctx.ddp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        regression_step(ctx, ddp, optimizer, step)
    return state_digest(model)
