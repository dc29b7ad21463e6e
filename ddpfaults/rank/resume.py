"""The resume check's capture inside a rank: what each optimizer step saw and did, as digests, with no change to the
script.

At every optimizer step (torch's global optimizer step hooks: every optimizer counts) a rank writes one record to its
``rank{r}.resume`` file: the optimizer's parameters after the step (and, at its first step in the job, before it), each
param group's learning rate, the step's batch (the inputs of every forward, with gradients, of a top-level module the
job wrapped in DDP or FSDP since the previous step: what the step learned from, not a batch a loader drew and threw away
or fetched ahead; a job that wrapped none: the batches its DataLoaders yielded, which are also kept beside the inputs,
as ``drawn``, to explain a difference), the global RNGs' states before the step (torch's CPU generator, Python's
``random`` and, if the rank imported it, numpy's), every file the job read, wrote, renamed or removed since the previous
step (``files``: ``file`` events, :mod:`ddpfaults.rank.files`; where a resumed attempt resumed from, and what the judge
refuses when the uninterrupted run read the faulted run's file), and, what a resumed run restores, the optimizer's
state: at each optimizer's first step, and at each step entered with parameters the job was told to watch (the judge
compares them where a run resumed: the run without faults, which runs second, watches the parameters each attempt of the
run with faults resumed with). When the job's function returns, a final record holds the state of every module it
wrapped in DDP or FSDP (:mod:`ddpfaults.rank.wrapped`) and of every optimizer's parameters, as digests and as
:func:`values` (what tells a difference in the last bits from a real one). The judge compares an interrupted, resumed
run's records with an uninterrupted run's (:mod:`ddpfaults.judge.checks.resume`). Inert unless the job's spec asks for
the check. A ``step()`` that learns nothing (:mod:`ddpfaults.rank.real_steps`: DCP building a fresh optimizer's
state) is no step here.
"""

from __future__ import annotations

import ctypes
import json
import numbers
import os
import random
import sys

import torch
import torch.utils.data.dataloader as dataloader
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpfaults import jobfiles
from ddpfaults.rank import files as job_files
from ddpfaults.rank import real_steps, running, wrapped
from ddpfaults.rank.digest import Digest
from ddpfaults.rank.digest import feed as _feed
from ddpfaults.rank.digest import hexdigest as _digest
from ddpfaults.rank.digest import local as _local

_capture = None  # the running job's capture, when its spec asks for the resume check


class Capture:
    """One job's records, appended to ``path`` as JSON lines (``watch``: see :func:`start`)."""

    def __init__(self, ctx, path: str, watch: frozenset):
        self.ctx, self.path, self.watch = ctx, path, watch
        self.batches: list[str] = []  # digests of the batches DataLoaders yielded since the last optimizer step
        self.inputs: list[str] = []  # digests of the inputs that reached a wrapped module's forward since then
        self.top: set = set()  # ids of the top-level wrapped modules (whose forward inputs are the batch)
        self.files: list = []  # the file events since the last optimizer step (ddpfaults.rank.files)
        self.seen: set = set()  # their (how, path): a file read again in one step is noted once
        self.pending: dict = {}  # optimizer id -> what was digested before its step
        self.entering: dict = {}  # optimizer id -> the digest of its parameters after its last step
        self.steps = 0
        self.optimizers: list = []
        self.file = None

    def note(self, event: dict) -> None:
        """Keep a ``file`` event of the job's (the first of its kind and path since the last optimizer step), and
        write it at once as a record of its own (the next step's record holds them all again, measured)."""
        key = (event["how"], event["path"])
        if key not in self.seen:
            self.seen.add(key)
            self.files.append(event)
            # now: a rank killed before its next step still tells what it wrote
            self.line(f"{jobfiles.RESUME_FILE_LINE}{json.dumps(event)}}}\n")

    def taken(self) -> list:
        """The file events since the last optimizer step, each written file measured now; forgotten here."""
        taken = [job_files.measured(e) for e in self.files]
        self.files, self.seen = [], set()
        return taken

    def write(self, record: dict) -> None:
        """Append one record (a whole line: a rank killed mid-job leaves every record it finished)."""
        self.line(json.dumps(record) + "\n")

    def line(self, text: str) -> None:
        """Append one whole line of the file."""
        if self.file is None:
            self.file = open(self.path, "a", buffering=1)
        self.file.write(text)


def start(ctx, path: str, watch: frozenset = frozenset()) -> None:
    """Capture the job's optimizer steps into ``path``, recording the optimizer state and RNG states at each
    optimizer's first step and at every step entered with parameters whose digest is in ``watch``."""
    global _capture
    install()
    wrapped.forget()  # a warm rank's earlier jobs wrapped modules too
    _capture = Capture(ctx, path, watch)
    job_files.begin(ctx, ignore=(os.path.dirname(path),))
    job_files.listen(ctx, _capture.note)


def finish(ctx) -> None:
    """The job's function returned: record the final state of every module it wrapped, and stop capturing."""
    global _capture
    capture, _capture = _capture, None
    if capture is None or capture.ctx is not ctx:
        return
    job_files.unlisten(ctx, capture.note)
    states = [m.state_dict() for m in wrapped.wrapped_modules()]
    params = [_params(o) for o in capture.optimizers]
    seen = {}  # a DDP module's parameters are its optimizer's: summarised once
    capture.write(
        {
            "final": True,
            "modules": [wrapped.state_digest(state) for state in states],
            "optimizers": [_digest(p) for p in params],
            "module_values": [values(state.values(), seen) for state in states],
            "optimizer_values": [values(p, seen) for p in params],
            "steps": capture.steps,
            **({"files": capture.taken()} if capture.files else {}),
        }
    )
    capture.file.close()
    capture.file = None


_installed = False


def install() -> None:
    """Register the optimizer step hooks and the DataLoader patch (once per process; inert outside a capture).
    Installed before the step clock's hooks, so a step's record is written before a fault at the next step acts."""
    global _installed
    if _installed:
        return
    _installed = True
    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(_after_step)
    iterator = dataloader._BaseDataLoaderIter
    iterator.__next__ = _drawn(iterator.__next__)
    wrapped.on_register(_watch_forward)
    job_files.install()


def _active():
    capture = _capture
    return capture if capture is not None and running.current() is capture.ctx else None


def _before_step(optimizer, args, kwargs) -> None:
    capture = _active()
    if capture is None or real_steps.initialising(optimizer):
        return
    if not any(o is optimizer for o in capture.optimizers):
        capture.optimizers.append(optimizer)
    first = id(optimizer) not in capture.entering  # the optimizer's first step in the job, where an attempt resumes:
    pending = {"before": _params_digest(optimizer)} if first else {}  # its parameters place it on the other run
    if first or capture.entering.get(id(optimizer)) in capture.watch:  # what an attempt resumed with, where it did
        pending["state"] = _state_digest(optimizer)
    pending["rng"] = rng_digests()  # every step's: a generator not restored differs from the resumed step on
    pending["lr"] = [_number(group.get("lr")) for group in optimizer.param_groups]
    capture.pending[id(optimizer)] = pending


def _after_step(optimizer, args, kwargs) -> None:
    capture = _active()
    if capture is None or id(optimizer) not in capture.pending:  # an initialising step() (ddpfaults.rank.real_steps)
        return
    before = capture.pending.pop(id(optimizer))
    opt = next(i for i, o in enumerate(capture.optimizers) if o is optimizer) if capture.optimizers else 0
    batch = capture.inputs if capture.inputs else capture.batches  # what reached the model, else what was drawn
    record = {"i": capture.steps, "opt": opt, **before, "params": _params_digest(optimizer), "batch": batch}
    if capture.inputs:  # what the loaders yielded too: explains a difference (samples replayed, a transform)
        record["drawn"] = capture.batches
    if capture.files:
        record["files"] = capture.taken()
    capture.entering[id(optimizer)] = record["params"]
    capture.steps += 1
    capture.batches, capture.inputs = [], []
    capture.write(record)


def _watch_forward(module) -> None:
    """Digest the inputs of every forward of ``module`` (a module the job wrapped) run with gradients, while it is a
    top-level wrapped module: what the next optimizer step learns from (a batch drawn and skipped, or fetched ahead
    by a prefetching loader, never reaches it)."""
    capture = _active()
    if capture is not None:
        capture.top = {id(m) for m in wrapped.wrapped_modules()}

    def hook(module, args, kwargs):
        capture = _active()
        if capture is not None and id(module) in capture.top and torch.is_grad_enabled():
            capture.inputs.append(_digest([args, kwargs]))

    module.register_forward_pre_hook(hook, prepend=True, with_kwargs=True)


def _drawn(original):
    def __next__(self):
        batch = original(self)
        capture = _active()
        if capture is not None:
            capture.batches.append(_digest(batch))
        return batch

    __next__.__wrapped__ = original
    return __next__


def rng_digests() -> dict:
    """The digest of each global RNG's state: ``torch`` (the CPU generator), ``random`` (Python's) and ``numpy``
    (its legacy global generator, only if numpy is already imported: it is never imported here). Taken at every
    optimizer step, so each is read the cheapest way that sees every word of it (numpy's ``get_state`` alone costs
    40 us: its generator's words are read in place instead)."""
    digests = {
        "torch": Digest(torch.get_rng_state().numpy()).hexdigest(),
        "random": f"{hash(random.getstate()) & 0xFFFFFFFFFFFFFFFF:016x}",  # ints hash alike in every process
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        digests["numpy"] = _numpy_rng_digest(numpy)
    return digests


def _numpy_rng_digest(numpy) -> str:
    """numpy's legacy global generator (``numpy.random.seed``, ``numpy.random.rand``...): its Mersenne Twister's
    624 words and position, read through the generator's public ctypes interface; any other generator by its
    ``get_state()``."""
    generator = getattr(getattr(numpy.random, "mtrand", None), "_rand", None)
    bits = getattr(generator, "_bit_generator", None)
    if type(bits).__name__ == "MT19937":
        return Digest(ctypes.string_at(bits.ctypes.state_address, _MT19937_STATE_BYTES)).hexdigest()
    return _digest(numpy.random.get_state())


_MT19937_STATE_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32_t key[624]; int pos


def _number(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else _digest(value)
    return value if isinstance(value, numbers.Number) else repr(value)


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _params_digest(optimizer) -> str:
    return _digest(_params(optimizer))


#: how many fixed random directions :func:`values` projects a tensor on
PROJECTIONS = 4


def values(tensors, seen: dict | None = None) -> list:
    """Each of ``tensors`` summarised so two runs' can be compared within rounding: a floating tensor as
    ``[norm, p1, ..., p4]``, its L2 norm and its dot products with :data:`PROJECTIONS` fixed random vectors (standard
    normal, drawn in float32, seeded by the tensor's size: 5x faster to draw than in float64), in float64, so the RMS
    of two runs' projection differences estimates the norm of their difference; any other value as its digest. Taken
    once per job, at its end; ``seen`` (summaries by tensor memory) summarises a tensor met again (a module's
    parameter that is also an optimizer's) once."""
    out = []
    seen = {} if seen is None else seen
    for value in tensors:
        tensor = _local(value)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            out.append(_digest(value))
            continue
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if key not in seen:
            flat = tensor.detach().cpu().reshape(-1).to(torch.float64)
            generator = torch.Generator().manual_seed(flat.numel())
            projections = [
                torch.dot(torch.randn(flat.numel(), generator=generator).to(torch.float64), flat).item()
                for _ in range(PROJECTIONS)
            ]
            seen[key] = [torch.linalg.vector_norm(flat).item(), *projections]
        out.append(seen[key])
    return out


def _state_digest(optimizer) -> str:
    digest = Digest()
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state, key=str):
                digest.update(str(key).encode())
                _feed(digest, state[key])
    return digest.hexdigest()
