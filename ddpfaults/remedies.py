"""The fixes from the field reports as small helpers to call in your own trainer.

Each one is proven by a fixed built-in scenario in a real gloo world:

- :func:`all_ranks_empty` — agree on emptiness across ranks before skipping anything (report 000);
- :func:`fake_targets` — zero-instance targets *derived* from a real target's schema (report 000);
- :func:`atomic_save` + :func:`load_after_barrier` — no rank ever reads a half-written checkpoint (report 002);
- :func:`ddp_wrap` — no ``device_ids`` for a CPU (or non-CUDA) module (report 004);
- :func:`even_batches` / :func:`join` — uneven inputs without a hang; :func:`training_census` — are all ranks
  training, on different samples (report 003)?
- :class:`GlooSyncBatchNorm` / :func:`convert_gloo_sync_batchnorm` — synchronised BatchNorm on CPU and gloo
  (torch's ``SyncBatchNorm`` refuses CPU), an empty rank joining with a count of 0 (scenario_sync_batchnorm).
- :func:`on_rank0` — rank 0 alone does a step (makes the checkpoint directory, saves), every rank learns how it
  went: all return together or all raise its error together, never some waiting forever on a rank that raised.
- :func:`any_rank` — agree whether any rank's condition holds (a NaN loss, a caught out-of-memory error) before
  skipping a step (Lightning #12190, scenario_oom);
- :func:`sync_metrics` — metrics logged with different keys on different ranks, reduced without a mismatch
  (Lightning #19106).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ddpfaults.toy.data import PER_SCENE_FIELDS, fake_target_like


def empty_rank_count(is_empty: bool, *, group=None) -> int:
    """How many ranks have an empty batch: every rank must call this at the same point (one all_reduce)."""
    flag = torch.tensor([int(bool(is_empty))], dtype=torch.int64)
    dist.all_reduce(flag, group=group)
    return int(flag.item())


def all_ranks_empty(is_empty: bool, *, group=None) -> bool:
    """True only if every rank's batch is empty: then (and only then) all ranks may skip the step together."""
    return empty_rank_count(is_empty, group=group) == dist.get_world_size(group)


def fake_targets(reference: dict, scenes: list[dict]) -> list[dict]:
    """One zero-instance target per scene, derived from the real target ``reference``.

    Every key, dtype and trailing shape comes from ``reference`` (so the matcher finds every field it
    reads); the per-scene fields (``point2segment``) come from each scene's own target when it has them.
    """
    fakes = []
    for scene in scenes:
        fake = fake_target_like(reference)
        fake.update({key: scene[key] for key in PER_SCENE_FIELDS if key in scene})
        fakes.append(fake)
    return fakes


def atomic_save(obj, path: str) -> None:
    """``torch.save`` to a temp file in the same directory, fsync, then ``os.replace``: readers see the
    old file or the new one, never a torn one; a writer killed mid-save leaves the last good file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_after_barrier(path: str, *, group=None, **load_kwargs):
    """Barrier, ``torch.load(path)``, barrier: every rank (the writer included) must call it.

    The first barrier waits for the writer's save; the second keeps a later save from replacing the
    file while a slow rank still reads it.
    """
    dist.barrier(group=group)
    state = torch.load(path, **load_kwargs)
    dist.barrier(group=group)
    return state


def ddp_kwargs(model: torch.nn.Module, local_device=None) -> dict:
    """The device arguments for DDP that fit where ``model``'s parameters really are.

    ``device_ids=[i]`` only for a module on exactly one CUDA device ``i``; ``{}`` for a CPU (or any
    non-CUDA) module, whatever device the launcher handed out in ``local_device``.
    """
    devices = {p.device for p in model.parameters()}
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda":
            return {"device_ids": [device.index if device.index is not None else torch.device(local_device).index]}
    return {}


def ddp_wrap(model: torch.nn.Module, local_device=None, *, wrapper=None, **kwargs):
    """Wrap ``model`` in DDP with :func:`ddp_kwargs` (``wrapper`` defaults to DistributedDataParallel;
    pass ``ctx.ddp`` inside ddpfaults to keep the gradient all_reduces traced)."""
    wrapper = wrapper or torch.nn.parallel.DistributedDataParallel
    return wrapper(model, **ddp_kwargs(model, local_device), **kwargs)


def even_batches(batches, *, group=None) -> list:
    """The first N batches of this rank's ``batches``, N being the smallest count on any rank (drop-last
    across ranks): every rank runs the same number of steps, so no rank waits on a finished peer."""
    batches = list(batches)
    count = torch.tensor([len(batches)], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
    return batches[: int(count.item())]


def join(ddp_model, **kwargs):
    """``torch.distributed.algorithms.Join([ddp_model])``: ranks that run out of batches shadow the
    others' gradient all_reduces, and the final model is synchronised from the last rank to finish."""
    from torch.distributed.algorithms import Join

    return Join([ddp_model], **kwargs)


def training_census(steps: int, samples, *, group=None) -> dict:
    """Gather every rank's step count and sample ids (report 003's checks); identical on every rank.

    Returns ``{"steps": [per rank], "samples": [count per rank], "overlap": ids seen by more than one
    rank, "covered": distinct ids seen}``. With a proper DistributedSampler ``overlap`` is 0.
    """
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (int(steps), sorted(int(s) for s in samples)), group=group)
    seen: dict = {}
    for _, ids in gathered:
        for i in set(ids):
            seen[i] = seen.get(i, 0) + 1
    return {
        "steps": [s for s, _ in gathered],
        "samples": [len(ids) for _, ids in gathered],
        "overlap": sum(1 for n in seen.values() if n > 1),
        "covered": len(seen),
    }


class GlooSyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """A BatchNorm whose training statistics are summed over every rank, on any device (CPU and gloo too).

    torch's ``SyncBatchNorm`` refuses CPU input ("SyncBatchNorm expected input tensor to be on GPU ...";
    its kernels are CUDA-only). This one all_reduces each channel's sum, sum of squares and count with
    the autograd-aware ``torch.distributed.nn.functional.all_reduce`` (its backward all_reduces too), so
    a rank with an empty batch still joins both collectives with zeros and a count of 0, as torch's does.
    Every rank must run its forward and backward in the same steps. Outside training (or without a
    process group) it is a plain BatchNorm. Build it with :func:`convert_gloo_sync_batchnorm`.
    """

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"GlooSyncBatchNorm: expected at least 2D input (N, C, ...), got {input.dim()}D")

    def forward(self, input):
        """Normalise with the statistics of every rank's batch (training) or the running statistics."""
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(input)
        from torch.distributed.nn.functional import all_reduce

        channels = input.shape[1]
        flat = input.transpose(0, 1).reshape(channels, -1)
        count = torch.full((1,), float(flat.shape[1]), dtype=input.dtype)
        totals = all_reduce(torch.cat([flat.sum(1), (flat * flat).sum(1), count]))
        n = totals[-1].clamp(min=1)
        mean = totals[:channels] / n
        var = (totals[channels : 2 * channels] / n - mean * mean).clamp(min=0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.lerp_(mean, factor)
                self.running_var.lerp_(var * n / (n - 1).clamp(min=1), factor)
        shape = (1, channels) + (1,) * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def convert_gloo_sync_batchnorm(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every BatchNorm layer replaced by a :class:`GlooSyncBatchNorm` holding its state
    (the CPU/gloo counterpart of ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``)."""
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlooSyncBatchNorm):
        converted = GlooSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        converted.load_state_dict(module.state_dict())
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        module.add_module(name, convert_gloo_sync_batchnorm(child))
    return module


def on_rank0(fn, *args, src: int = 0, group=None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on rank ``src`` (of ``group``) only, then share its outcome: every rank must
    call this.

    One ``broadcast_object_list`` carries the result (returned on every rank) or the exception, which every
    rank then raises: a rank waiting for ``src`` learns of its failure instead of waiting forever (under NCCL,
    a failed rank's peers hang), and the ranks fail together at the same line. An exception that cannot be
    pickled travels as a ``RuntimeError`` naming its type and message.
    """
    import pickle

    root = src if group is None else dist.get_global_rank(group, src)
    outcome, error = [None], None
    if dist.get_rank() == root:
        try:
            outcome = [(True, fn(*args, **kwargs))]
        except Exception as exc:
            error = exc
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            outcome = [(False, exc)]
    dist.broadcast_object_list(outcome, src=root, group=group)
    ok, value = outcome[0]
    if error is not None:
        raise error
    if not ok:
        raise value
    return value


def any_rank(flag: bool, *, group=None) -> bool:
    """True if ``flag`` is true on any rank (one all_reduce, MAX): every rank must call it at the same point.

    Agree before skipping a step on one rank's condition (a NaN or zero loss, Lightning #12190; an out-of-memory
    error it caught): then all ranks skip ``backward`` and ``optimizer.step`` together and no gradient all_reduce
    is left unmatched.
    """
    value = torch.tensor([int(bool(flag))], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def sync_metrics(metrics: dict, *, group=None) -> dict:
    """Every rank's logged ``{key: number}`` averaged over the ranks that logged each key; identical on every rank.

    Ranks may log different keys (a metric logged only when a batch has samples, Lightning #19106): the key sets
    are agreed first (one ``all_gather_object`` of the sorted keys), then values and counts travel in one
    ``all_reduce`` of a fixed-size tensor, so no reduction can pair with another rank's different key. A key
    is in the result if any rank logged it. Every rank must call it at the same point.
    """
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, sorted(metrics), group=group)
    keys = sorted(set().union(*gathered))
    packed = torch.zeros(2, len(keys), dtype=torch.float64)
    for i, key in enumerate(keys):
        if key in metrics:
            packed[0, i], packed[1, i] = float(metrics[key]), 1.0
    dist.all_reduce(packed, group=group)
    return {key: float(packed[0, i] / packed[1, i]) for i, key in enumerate(keys)}
