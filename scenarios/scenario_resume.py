"""Resume after a restart: is the resumed run the run that would have happened? (``check_resume`` compares every
optimizer step of an uninterrupted run with the killed-and-restarted one's.)

``resume_train`` is a DDP loop (an MLP with dropout, SGD with momentum, a LambdaLR decay, a shuffling
DistributedSampler over two epochs) that checkpoints after every optimizer step into ``ctx.shared_dir`` (kept across
restarts) and resumes from the last one. Each keyword leaves one thing out of the resume, as the field does:

- ``data="restart"``: the epoch's data restarts from its beginning (only the epoch is restored, not the position in
  it): samples seen twice (KempnerInstitute/KempnerForge#51: "every resume replays the first epoch"). Fixed: the
  position is restored.
- ``rng="none"`` / ``rng="before"``: torch's RNG is not restored (transformers#17032), or restored before
  ``iter(loader)`` (making an iterator draws from the global RNG): dropout masks differ from the uninterrupted run's.
  Fixed: restored where it was captured, after the iterator a mid-epoch resume makes and before the one an epoch
  start makes (as vllm-project/speculators#1027 does).
- ``scheduler=False``: the LR scheduler is not saved: its schedule starts over (lightly-ai/lightly-train#301). The
  optimizer's state holds the resumed step's learning rate, so the first step that differs is the next one, whose
  rate the fresh scheduler set. Fixed: saved.
- ``optimizer=False``: the optimizer's state (momentum) is not saved.
- ``counter="off_by_one"``: the step counter is saved before it is incremented: the resumed run repeats a step
  (Lightning#17543, "won't fix"). Fixed: the number of steps done.
- ``save="pointer_first"``: a ``latest`` pointer is written before the checkpoint it names; the writer killed
  mid-save leaves it pointing at a torn file, and every restart crashes loading it (the field's report 002 tore a
  checkpoint; Cibiv/IQ-TREE#90: a queue-killed job left a truncated one). Fixed: temp file, ``os.replace``, then the
  pointer.

``preempt``: a scheduler's SIGTERM at step 6 (checkpoints every 4 steps), SIGKILL 3 s later, the job requeued once:

- ``no_handler``: every rank dies of the notice; the steps since the last checkpoint are lost (the resume from it is
  still bit-equal).
- ``rank0_only``: every rank notes the notice, rank 0 alone acts on it and waits in the save's collective while the
  others train on (Lightning#20806): the attempt hangs, nothing is saved.
- ``agree``: every rank all-reduces its stop flag each step, so they stop at the same step and save together: no step
  lost, and the requeued run resumes bit-equal.

``resume_script``: the same question asked of a plain torchrun script (``scripts/train_resume.py``: a DataLoader over a
``DistributedSampler``, checkpointing into its working directory, resuming from it), killed at step 5 and restarted
once: ``fixed`` restores everything; ``position_lost`` restarts the epoch's data from its beginning (samples
replayed); ``random_not_restored`` restores torch's RNG but not Python's ``random``, which its input scaling draws
from (huggingface/transformers#17032 restored torch's alone).

Measured (gloo, 2 ranks, 3+ runs each): every naive variant is caught at the first step after the resume with its
cause; the fixed loop resumes bit-equal wherever it is killed.
"""

import os
import signal
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpfaults
from _checks import REPLICAS_EQUAL, SAFE_STALL
from ddpfaults.faults import Preempt, RankKilled, WriterKilledMidSave

EPOCHS, SAMPLES, BATCH = 2, 32, 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))


def _save(state: dict, directory: str, save: str, step: int) -> None:
    latest = os.path.join(directory, "latest")
    name = os.path.join(directory, f"ckpt-{step}.pt")
    if save == "pointer_first":  # the pointer names a file not yet written
        with open(latest, "w") as f:
            f.write(name)
        torch.save(state, name)
        return
    torch.save(state, name + ".tmp")
    os.replace(name + ".tmp", name)
    with open(latest + ".tmp", "w") as f:
        f.write(name)
    os.replace(latest + ".tmp", latest)


def _load(directory: str):
    latest = os.path.join(directory, "latest")
    if not os.path.exists(latest):
        return None
    with open(latest) as f:
        return torch.load(f.read(), weights_only=False)


def _decay(epoch: int) -> float:
    return 0.8**epoch


def resume_train(
    ctx,
    *,
    data="restore",
    rng="restore",
    scheduler=True,
    optimizer=True,
    counter="right",
    save="atomic",
    handler=None,
    every=1,
    epochs=EPOCHS,
    samples=SAMPLES,
):
    """Train ``epochs`` epochs, checkpointing every ``every`` steps and resuming from the last checkpoint; each
    keyword leaves one thing out of the resume (see the module). ``handler``: None (no SIGTERM handler), ``"rank0"``
    or ``"agree"``."""
    how = SimpleNamespace(data=data, rng=rng, counter=counter, save=save, handler=handler, every=every, epochs=epochs)
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    ddp = DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _decay)
    state = _load(ctx.shared_dir)  # every object built first, then every state loaded (the optimizer's holds its lr)
    if state is not None:
        ddp.module.load_state_dict(state["model"])
        if optimizer:
            opt.load_state_dict(state["optimizer"])
        if scheduler:
            sched.load_state_dict(state["scheduler"])
    run = SimpleNamespace(ctx=ctx, ddp=ddp, opt=opt, sched=sched, dataset=dataset, sampler=sampler, state=state)
    run.stop = torch.zeros(1)
    if handler is not None:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: run.stop.fill_(1))
    try:
        return _train(run, how, state["done"] if state is not None else 0)
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, previous)


def _train(run, how, done: int):
    rank, per_epoch = run.ctx.rank, len(run.sampler) // BATCH
    for epoch in range(done // per_epoch, how.epochs):
        run.sampler.set_epoch(epoch)
        first = epoch * per_epoch
        skip = done - first if done > first and how.data == "restore" else 0
        order = list(run.sampler)[skip * BATCH :]
        restoring = run.state is not None and how.rng != "none" and epoch == done // per_epoch
        if restoring and (how.rng == "before" or skip == 0):
            torch.set_rng_state(run.state["rng"])
        loader = iter(DataLoader(run.dataset, batch_size=BATCH, sampler=order))
        if restoring and how.rng == "restore" and skip > 0:
            torch.set_rng_state(run.state["rng"])
        for i, (x, y) in enumerate(loader):
            step = first + skip + i
            run.ctx.step(step)
            loss = torch.nn.functional.mse_loss(run.ddp(x), y)
            run.opt.zero_grad()
            loss.backward()
            run.opt.step()
            run.sched.step()
            if how.handler is not None and _preempted(how.handler, run.stop, rank):
                return _save_on_stop(run, how, step)
            if rank == 0 and (step + 1) % how.every == 0:
                count = step if how.counter == "off_by_one" else step + 1
                _save(_state(run.ddp, run.opt, run.sched, count), run.ctx.shared_dir, how.save, step)
    return "done"


def _state(ddp, opt, sched, done: int) -> dict:
    return {
        "model": ddp.module.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "done": done,
        "rng": torch.get_rng_state(),
    }


def _preempted(handler: str, stop: torch.Tensor, rank: int) -> bool:
    flag = stop.clone()
    if handler == "agree":
        dist.all_reduce(flag)  # every rank learns that any rank got the notice
    return bool(flag.item()) and (handler == "agree" or rank == 0)


def _save_on_stop(run, how, step: int) -> str:
    dist.barrier()  # the save's collective (a DCP save or a gathered state): rank 0 alone waits in it
    if run.ctx.rank == 0:
        _save(_state(run.ddp, run.opt, run.sched, step + 1), run.ctx.shared_dir, how.save, step)
    dist.barrier()
    return "preempted"


@ddpfaults.scenario(
    world_size=2,
    stall=SAFE_STALL,
    max_restarts=1,
    check_resume=True,
    faults=[RankKilled(rank=1, step=5)],
    variants=[
        ddpfaults.variant("fixed", expect=ddpfaults.Expect("completed", values_equal=True, resume_equivalent=True)),
        ddpfaults.variant(
            "data_restarted",
            kwargs={"data": "restart"},
            expect=ddpfaults.Expect("completed", resume_cause="samples_replayed", resume_step=5),
        ),
        ddpfaults.variant(
            "rng_not_restored",
            kwargs={"rng": "none"},
            expect=ddpfaults.Expect("completed", resume_cause="rng", resume_step=5),
        ),
        ddpfaults.variant(
            "rng_before_iterator",
            kwargs={"rng": "before"},
            expect=ddpfaults.Expect("completed", resume_cause="rng", resume_step=5),
        ),
        ddpfaults.variant(
            "scheduler_not_saved",
            kwargs={"scheduler": False},
            expect=ddpfaults.Expect("completed", resume_cause="learning_rate", resume_step=6),
        ),
        ddpfaults.variant(
            "optimizer_not_saved",
            kwargs={"optimizer": False},
            expect=ddpfaults.Expect("completed", resume_cause="optimizer_state", resume_step=5),
        ),
        ddpfaults.variant(
            "counter_off_by_one",
            kwargs={"counter": "off_by_one"},
            expect=ddpfaults.Expect("completed", resume_cause="samples_replayed", resume_step=5),
        ),
        ddpfaults.variant(
            "torn_pointer_first",
            kwargs={"save": "pointer_first"},
            faults=[WriterKilledMidSave(writer=0, step=5)],
            expect=ddpfaults.Expect("crashed", error="OSError", resume_cause="missing_step", resume_step=6),
        ),
        ddpfaults.variant(
            "torn_atomic",
            faults=[WriterKilledMidSave(writer=0, step=5)],
            expect=ddpfaults.Expect("completed", resume_equivalent=True),
        ),
    ],
)
def resume(ctx, **kwargs):
    """Killed at step 5 and restarted once: the fixed loop, and one naive resume per variant."""
    return resume_train(ctx, **kwargs)


def preempted(first: str, *, handled, saved, lost) -> ddpfaults.Check:
    """The first attempt, preempted, ended ``first``: ``handled`` and ``saved`` the ranks that handled the notice and
    saved after it, ``lost`` the steps since the last checkpoint."""

    def fn(result):
        attempt = (result.attempts or [{}])[0]
        got = attempt.get("preemption") or {}
        seen = (attempt.get("outcome"), got.get("handled"), got.get("saved"), got.get("steps_lost"))
        return None if seen == (first, handled, saved, lost) else f"outcome, handled, saved, lost: {seen}"

    return ddpfaults.Check(f"preempted, {first}: handled by {handled}, saved by {saved}, {lost} step(s) lost", fn)


@ddpfaults.scenario(
    world_size=2,
    stall=SAFE_STALL,
    max_restarts=1,
    faults=[Preempt(step=6, grace=3)],
    kwargs={"every": 4},
    variants=[
        ddpfaults.variant(
            "no_handler",
            expect=ddpfaults.Expect(
                "completed", checks=(preempted("crashed", handled=[], saved=[], lost=3),), resume_equivalent=True
            ),
        ),
        ddpfaults.variant(
            "rank0_only",
            kwargs={"handler": "rank0"},
            expect=ddpfaults.Expect("completed", checks=(preempted("hung", handled=[0, 1], saved=[], lost=4),)),
        ),
        ddpfaults.variant(
            "agree",
            kwargs={"handler": "agree"},
            expect=ddpfaults.Expect(
                "completed", checks=(preempted("completed", handled=[0, 1], saved=[0], lost=0),), resume_equivalent=True
            ),
        ),
    ],
)
def preempt(ctx, **kwargs):
    """Preempted at step 6 (checkpoints every 4 steps) and requeued once."""
    return resume_train(ctx, **kwargs)


def _rng_named(name: str) -> ddpfaults.Check:
    """The resume's first difference names ``name`` as the RNG whose state differed."""

    def fn(result):
        detail = ((result.resume or {}).get("first_difference") or {}).get("detail") or ""
        return None if f"RNG state differs ({name})" in detail else f"detail: {detail!r}"

    return ddpfaults.Check(f"the RNG named: {name}", fn)


resume_script = ddpfaults.script_scenario(
    "scripts/train_resume.py",
    name="resume_script",
    world_size=2,
    stall=SAFE_STALL,
    max_restarts=1,
    faults=[RankKilled(rank=1, step=5)],
    variants=[
        ddpfaults.variant(
            "fixed",
            argv=["--lose", "nothing"],
            expect=ddpfaults.Expect("completed", checks=(REPLICAS_EQUAL,), resume_equivalent=True),
        ),
        ddpfaults.variant(
            "position_lost",
            argv=["--lose", "position"],
            expect=ddpfaults.Expect("completed", resume_cause="samples_replayed", resume_step=5),
        ),
        ddpfaults.variant(
            "random_not_restored",
            argv=["--lose", "random"],
            expect=ddpfaults.Expect(
                "completed", checks=(_rng_named("python random"),), resume_cause="rng", resume_step=5
            ),
        ),
    ],
)
