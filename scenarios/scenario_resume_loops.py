"""Resume code as people write it, under the resume check: the false alarms it must not raise, the bugs it must catch.

``fast_forward``: a DDP loop (an MLP with dropout, SGD with momentum, a shuffling ``DistributedSampler``, two epochs)
that checkpoints after every step into ``ctx.shared_dir`` and resumes mid-epoch the common way: a fresh iterator over
the epoch, ``next(it)`` once per batch already trained on (drawn and thrown away), then torch's RNG restored.
Killed at step 5 and restarted once:

- ``fixed``: the batches drawn and thrown away never reach the model: resumed bit-equal at 2 ranks, equivalent
  (to rounding: a DDP made anew) at 4 (``fixed_4_ranks``).
- ``one_too_many``: the fast-forward draws one batch more than it trained on (``range(done - first + 1)``, an
  off-by-one in the count): the batch after the one due is trained on at the resumed step, samples skipped.

``fsdp2_dcp``: an FSDP2 job (``fully_shard`` per layer and on the root, Adam) that checkpoints with
``torch.distributed.checkpoint``: ``get_state_dict(model, optimizer)`` into ``dcp.save`` after every step; on a
restart a fresh model and optimizer, ``get_state_dict`` (which builds the fresh optimizer's state with a zero-gradient,
zero-rate ``step()``: no training step), ``dcp.load``, then ``set_state_dict``. Killed at step 5, restarted once:

- ``fixed``: the model and the optimizer restored: bit-equal at 2 ranks, equivalent at 4 (``fixed_4_ranks``).
- ``model_only``: the model's state alone (``get_model_state_dict``, ``dcp.load``, ``set_model_state_dict``): Adam
  resumes with no state (its moments start over), caught at the resumed step as ``optimizer_state``. (Loading into
  ``get_state_dict(model, optimizer)``'s dicts and then setting the model's alone is no such bug: ``dcp.load`` fills
  the optimizer's own state tensors in place.)
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpfaults
from _checks import SAFE_STALL
from ddpfaults.faults import RankKilled

SAMPLES, BATCH, EPOCHS = 32, 2, 2


def _bit_equal() -> ddpfaults.Check:
    """The resume check found the resumed run bit-equal (not only equivalent to rounding)."""

    def fn(result):
        finding = result.resume or {}
        return None if finding.get("bit_equal") else f"not bit-equal: {finding.get('rounding')}"

    return ddpfaults.Check("resumed bit-equal", fn)


def _equivalent(*, bit_equal: bool) -> ddpfaults.Expect:
    return ddpfaults.Expect(
        "completed", values_equal=True, resume_equivalent=True, checks=(_bit_equal(),) if bit_equal else ()
    )


def _killed_at_step_5_and_resumed(wrong: str, kwargs: dict, cause: str):
    """A family's scenario: rank 1 killed at step 5 and the world restarted once under the resume check; ``fixed``
    resumes bit-equal at 2 ranks and equivalent at 4, ``wrong`` (``kwargs``) is caught at step 5 as ``cause``."""
    return ddpfaults.scenario(
        world_size=2,
        stall=SAFE_STALL,
        max_restarts=1,
        check_resume=True,
        faults=[RankKilled(rank=1, step=5)],
        variants=[
            ddpfaults.variant("fixed", expect=_equivalent(bit_equal=True)),
            ddpfaults.variant("fixed_4_ranks", world_size=4, expect=_equivalent(bit_equal=False)),
            ddpfaults.variant(
                wrong, kwargs=kwargs, expect=ddpfaults.Expect("completed", resume_cause=cause, resume_step=5)
            ),
        ],
    )


def fast_forward_train(ctx, *, extra=0):
    """Two epochs, a checkpoint after every step, a mid-epoch resume by ``next(it)`` (``extra``: batches drawn
    beyond those trained on)."""
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(SAMPLES, 4, generator=generator), torch.randn(SAMPLES, 1, generator=generator))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    path = os.path.join(ctx.shared_dir, "ckpt.pt")
    state = torch.load(path, weights_only=False) if os.path.exists(path) else None
    done = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        done = state["done"]
    per_epoch, step = len(loader), done
    for epoch in range(done // per_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        it = iter(loader)
        if state is not None and epoch == done // per_epoch:
            for _ in range(done - epoch * per_epoch + extra):
                next(it)  # the fast-forward: batches drawn and thrown away
            torch.set_rng_state(state["rng"])
        for x, y in it:
            ctx.step(step)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if ctx.rank == 0:
                saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "done": step}
                torch.save({**saved, "rng": torch.get_rng_state()}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()  # the checkpoint is on disk before any rank trains on
    return "done"


@_killed_at_step_5_and_resumed("one_too_many", {"extra": 1}, "samples_skipped")
def fast_forward(ctx, **kwargs):
    """Killed at step 5 and restarted once: a mid-epoch resume by ``next(it)``."""
    return fast_forward_train(ctx, **kwargs)


STEPS = 8


def fsdp2_dcp_train(ctx, *, optimizer=True):
    """``STEPS`` steps of an FSDP2 MLP with Adam, a DCP checkpoint after every step (``get_state_dict``), resumed
    with ``set_state_dict`` (``optimizer=False``: the model alone)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(ctx.rank)
    batches = [(torch.randn(4, 8, generator=data), torch.randn(4, 1, generator=data)) for _ in range(STEPS)]
    latest = os.path.join(ctx.shared_dir, "latest")
    done = 0
    if os.path.exists(latest):
        with open(latest) as f:
            done = int(f.read())
        where = os.path.join(ctx.shared_dir, f"step-{done}")
        if optimizer:
            model_state, optim_state = get_state_dict(model, opt)  # builds the fresh optimizer's state: no step
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=where)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=where)
            set_model_state_dict(model, state["model"])
    for step in range(done, STEPS):
        ctx.step(step)
        x, y = batches[step]
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model_state, optim_state = get_state_dict(model, opt)
        dcp.save(
            {"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(ctx.shared_dir, f"step-{step + 1}")
        )
        if ctx.rank == 0:
            with open(latest + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(latest + ".tmp", latest)
        dist.barrier()  # the pointer is on disk before any rank trains on
    return "done"


@_killed_at_step_5_and_resumed("model_only", {"optimizer": False}, "optimizer_state")
def fsdp2_dcp(ctx, **kwargs):
    """Killed at step 5 and restarted once: an FSDP2 job resumed through DCP's state-dict API."""
    return fsdp2_dcp_train(ctx, **kwargs)
