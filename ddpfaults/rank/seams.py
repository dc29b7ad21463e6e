"""torch's own seams, where faults act on code that never calls ``ctx.fault``, and where a script's steps are counted.

Installed once per rank process (inert outside a job); each consults the current rank context:

- **DataLoader**: the first batch a ``torch.utils.data.DataLoader`` iterator yields at a fault's step passes
  its ``on_batch`` (``EmptyBatch``, ``SchemaDrift``); an iterator stops early at a fault's ``batch_limit``
  (``UnevenInputs``; it fires only if the iterator had a batch left, which is dropped).
  The same patch covers every loader built on DataLoader (Lightning's). A loader that wraps one and hands its batches
  out later than it fetches them (accelerate's ``DataLoaderShard`` reads one ahead) is the seam instead: its batches
  are acted on and recorded as the loop gets them (:func:`_hands_over`), else a fault at step ``n`` would empty the
  batch of step ``n + 1`` and each recorded collective would be placed in the batch after its own.
- **DDP construction**: ``DistributedDataParallel(...)`` gets the faults' ``ddp_kwargs`` (``DeviceMismatch``), and a
  comm hook where a fault acts on its gradient buckets (``SkippedCollective(op="ddp_bucket")``; a model that
  registers its own hook then fails to, as DDP allows one). The wrapped module (and one wrapped in FSDP) is noted
  for the replica checks (:mod:`ddpfaults.rank.wrapped`).
- **Process-group teardown** (local ranks, which end with ``os._exit``): a destroyed group is never freed
  (:func:`keep_destroyed_groups`).
- **The step clock** of a script world (``ctx.clock``): ``"optimizer"`` starts step ``n + 1`` when the ``n``-th
  optimizer step returns (torch's global optimizer step hooks: every optimizer counts) and step 0 when the
  default process group is up; ``"dataloader"`` starts step ``n`` when the ``n``-th batch is yielded. Step
  faults (``RankCrash``, ``Straggler``, ``RankKilled``, checkpoint faults) act when their step starts.
"""

from __future__ import annotations

import functools
import threading

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.utils.data.dataloader as dataloader
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from ddpfaults.rank import context, flight, real_steps, running, torch_private, wrapped
from ddpfaults.rank.on_import import patch_on_import
from ddpfaults.spec import STEP_CLOCKS

OPTIMIZER, DATALOADER = STEP_CLOCKS

_installed = False


def install() -> None:
    """Patch the DataLoader iterator (and accelerate's loaders when imported), DDP's constructor and the optimizer
    step hook (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    iterator = dataloader._BaseDataLoaderIter
    iterator.__next__ = _next_batch(iterator.__next__)
    patch_on_import("accelerate.data_loader", _accelerate_loaders)
    DistributedDataParallel.__init__ = _construct_ddp(DistributedDataParallel.__init__)
    import torch.distributed.fsdp as fsdp  # here, not at import: the launcher imports this module too (0.6 s)

    fsdp.FullyShardedDataParallel.__init__ = _construct_fsdp(fsdp.FullyShardedDataParallel.__init__)
    fsdp.fully_shard = _fully_shard(fsdp.fully_shard)
    register_optimizer_step_post_hook(_optimizer_stepped)


#: every process group destroyed in this process, kept referenced: see :func:`keep_destroyed_groups`
_DESTROYED: list = []


def keep_destroyed_groups() -> None:
    """Make ``destroy_process_group`` keep a reference to the groups it destroys (once per process).

    A group is shut down as the code asks, but its C++ destructor never runs: a local rank ends with ``os._exit``
    (its sockets close, as a torchrun worker's do when it exits). ~ProcessGroupGloo joins gloo's worker threads
    holding the GIL, while a worker thread that ran a Python callback (DDP's reducer) waits for the GIL to clear
    its thread state: worlds deadlocked there when ``main()`` returned and freed its DDP model, and none with the
    groups kept (docs/measurements.md).
    """
    original = c10d.destroy_process_group
    if hasattr(original, "__ddpfaults_original__"):
        return

    @functools.wraps(original)
    def destroy_process_group(group=None):
        everything = group is None or group is c10d.GroupMember.WORLD
        flight.remember_groups()
        _DESTROYED.extend(list(torch_private.groups().pg_map) if everything else [group])
        return original(group)

    destroy_process_group.__ddpfaults_original__ = original
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def process_group_ready(ctx) -> None:
    """The default process group is up: on the optimizer clock, step 0 starts."""
    if ctx.clock == OPTIMIZER and ctx.current_step is None:
        ctx.step(0)


def _optimizer_stepped(optimizer, args, kwargs) -> None:
    ctx = running.current()
    if (
        ctx is not None
        and ctx.clock == OPTIMIZER
        and not real_steps.initialising(optimizer)
        and not real_steps.nested()
    ):
        ctx.step(1 if ctx.current_step is None else ctx.current_step + 1)


class _Handed:
    """What the DataLoader seam keeps of one iterator of batches: batches handed out, whether a fault cut it short,
    whether its end was recorded, and its ordinal among the rank's iterators."""

    def __init__(self):
        self.yielded, self.cut, self.ended, self.ordinal = 0, False, False, 0


#: ``depth`` > 0 in a thread while a wrapping loader (:func:`_hands_over`) fetches there from the DataLoader iterator
#: it wraps: that fetch is not the batch the loop gets, the wrapper records the one it hands out
_wrapped_fetches = threading.local()


def _next_batch(original):
    @functools.wraps(original)
    def __next__(self):
        ctx = running.current()
        if ctx is None or getattr(_wrapped_fetches, "depth", 0):
            return original(self)
        if "_ddpfaults_handed" not in vars(self):
            self._ddpfaults_handed = _Handed()
        return _hand(ctx, self._ddpfaults_handed, lambda: original(self))

    return __next__


def _hand(ctx, handed: _Handed, fetch):
    """The next batch of an iterator the loop consumes (``fetch`` draws it), with the seam's faults applied and
    recorded as the rank's next batch; raises StopIteration where the iterator (or a fault's batch limit) ends it."""
    yielded = handed.yielded
    limits = [f for f in ctx.seam_faults() if f.batch_limit is not None and yielded >= f.batch_limit]
    try:
        if limits:
            if not handed.cut:
                fetch()  # a loader with no batch left ends here (StopIteration): nothing was cut off
                handed.cut = True
                how = f"stopped a DataLoader iterator after {yielded} batch(es)"
                ctx.record_fired(limits[0], how, effect="stopped_loader")
            raise StopIteration
        batch = fetch()
    except StopIteration:
        if yielded and not handed.ended:
            handed.ended = True
            ctx.loader_ended(handed.ordinal, yielded)
        raise
    if not yielded:
        ctx.iterators += 1
        handed.ordinal = ctx.iterators
    handed.yielded = yielded + 1
    if ctx.clock == DATALOADER:
        ctx.step(ctx.batches)
    ctx.batch_drawn(handed.ordinal, yielded)
    for fault in ctx.seam_faults():
        changed = fault.on_batch(batch)
        if changed is not None and ctx.once(fault):  # the step's first batch only (a skipped step repeats it)
            ctx.record_fired(fault, f"changed DataLoader batch {yielded} of this iterator", effect="changed_batch")
            batch = changed
    return batch


def _wrapped_fetch(iterator):
    _wrapped_fetches.depth = getattr(_wrapped_fetches, "depth", 0) + 1
    try:
        return next(iterator)
    finally:
        _wrapped_fetches.depth -= 1


def _hands_over(original):
    """``__iter__`` of a loader that wraps a DataLoader and may hand its batches out later than it fetches them
    (accelerate's ``DataLoaderShard`` fetches one ahead, and skips a resumed epoch's first batches): the seam acts on
    and records the batches it hands to the loop, when it hands them, and not its own fetches."""

    @functools.wraps(original)
    def __iter__(self):
        batches, handed = original(self), _Handed()
        try:
            while True:
                ctx = running.current()
                try:
                    batch = next(batches) if ctx is None else _hand(ctx, handed, lambda: _wrapped_fetch(batches))
                except StopIteration:
                    return
                yield batch
        finally:
            close = getattr(batches, "close", None)  # a generator has one (accelerate's), a plain iterator none
            if close is not None:
                close()

    return __iter__


def _accelerate_loaders(module) -> None:
    """accelerate's loaders (every ``DataLoaderAdapter`` of ``accelerate.data_loader`` with an ``__iter__`` of its
    own) record the batches they hand out (:func:`_hands_over`)."""
    for cls in list(vars(module).values()):
        if isinstance(cls, type) and issubclass(cls, module.DataLoaderAdapter) and "__iter__" in vars(cls):
            cls.__iter__ = _hands_over(cls.__iter__)


def _construct_ddp(original):
    @functools.wraps(original)
    def __init__(self, module, *args, **kwargs):
        ctx = running.current()
        for fault in ctx.seam_faults() if ctx is not None else ():
            changed = fault.ddp_kwargs(ctx.rank, args, kwargs)
            if changed is not None:
                given = ", ".join(f"{k}={v!r}" for k, v in changed.items() if kwargs.get(k) != v)
                ctx.record_fired(fault, f"DistributedDataParallel constructed with {given}", effect="ddp_arguments")
                kwargs = changed
        original(self, module, *args, **kwargs)
        if ctx is not None:
            wrapped.register(self.module, wrapped.DDP)
        if ctx is not None and not context.building_traced_ddp():
            if any(f.acts_on_ddp_buckets(ctx.rank) for f in ctx.unclaimed_faults()):
                self.register_comm_hook((ctx, self.process_group), _bucket_hook)

    return __init__


def _construct_fsdp(original):
    @functools.wraps(original)
    def __init__(self, module, *args, **kwargs):
        original(self, module, *args, **kwargs)
        if running.current() is not None:
            from torch.distributed.fsdp import ShardingStrategy

            no_shard = getattr(self, "sharding_strategy", None) == ShardingStrategy.NO_SHARD
            wrapped.register(self.module, wrapped.FSDP, sharded=not no_shard)

    return __init__


def _fully_shard(original):
    @functools.wraps(original)
    def fully_shard(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        if running.current() is not None:
            for each in module if isinstance(module, (list, tuple)) else [module]:
                wrapped.register(each, wrapped.FSDP, sharded=True)
        return result

    return fully_shard


def _bucket_hook(state, bucket):
    """Plain DDP's all_reduce of a gradient bucket, unless a fault skips it (``state``: the rank's context and
    DDP's process group)."""
    ctx, process_group = state
    skipped = context.skipped_bucket(ctx, bucket)
    if skipped is None:
        context.entering(ctx, context.DDP_BUCKET)
    return skipped if skipped is not None else default_hooks.allreduce_hook(process_group, bucket)
