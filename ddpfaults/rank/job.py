"""Running one job inside a rank: the part both launchers share (local rank files, torchrun's store).

A job seeds the RNGs, makes its :class:`~ddpfaults.rank.context.RankContext` current, initialises the
process group (traced as a wait on the peers), calls the user's function and reports what happened:
the result is published *before* the ``finished``/``failed`` event that announces it, so a judge that
sees the event can always read the result. What a failed rank does next (exit, linger, sever its peer
connections) is the launcher's business.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
import traceback
from collections.abc import Callable

import torch

from ddpfaults.errors import UnpicklableReturnValue
from ddpfaults.rank import checkpoint, context, cuda_on_cpu, dcp, effects, files, resume, running, wrapped
from ddpfaults.rank.context import RankContext, is_machinery

#: the path every rank's main-thread stack is cut below (frames under it are the launchers' own)
ENTRY_FILE = os.path.abspath(__file__)


def error_text(exc: BaseException) -> str:
    """``KeyError: 'segment_mask'`` (the type alone when the message is empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def error_site(exc: BaseException) -> str:
    """``file.py:LINE in func`` of the innermost frame of ``exc`` outside torch and ddpfaults' rank machinery."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not is_machinery(frame.filename):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's and (if loaded) numpy's global RNGs alike on every rank."""
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def run_job(
    ctx: RankContext,
    *,
    load: Callable[[], tuple],
    init_process_group: Callable[[], None] | None,
    publish: Callable[[dict], None],
    leftovers: Callable[[], list] = list,
    still_reporting: Callable[[], bool] = lambda: True,
    process_ends: bool = False,
) -> dict:
    """Run ``fn(ctx, *args, **kwargs)`` (``load()`` gives the triple) and report it; return the result dict.

    The result dict holds ``value`` (pickled) and ``wrapped`` (the modules it wrapped in DDP or FSDP, with their
    state's digest: :func:`ddpfaults.rank.wrapped.records`), or ``error``, ``traceback`` and ``site``.
    ``publish(result)`` stores it where the judge reads it; the ``finished`` event carries ``leftovers()``, the
    state the job left in this process, and ``exits`` when ``process_ends`` (the process ends with the job: its
    peers will read its connections closed). ``init_process_group`` None: the function initialises its own (a
    script world). A failure is not reported when ``still_reporting()`` says the world was already judged.
    """
    if ctx.spec.cuda_on_cpu:  # before the user's code runs (and before the seed: torch.cuda's seeding is mapped)
        cuda_on_cpu.install(int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)))
    seed_everything(ctx.seed)
    running.activate(ctx)
    files.begin(ctx)  # its file events go to whoever listens (the resume check, a checkpoint fault)
    checkpoint.reads_after_restart(ctx)
    result = {"value": None, "error": None, "traceback": None, "site": None, "wrapped": []}
    wrapped.forget()
    try:
        fn, args, kwargs = load()
        if init_process_group is not None:
            seq = ctx._enter("init_process_group", [], "ddpfaults")
            init_process_group()
            ctx._exit(seq)
        value = fn(ctx, *args, **kwargs)
        resume.finish(ctx)
        try:
            result["value"] = pickle.dumps(value)
        except Exception as exc:
            raise UnpicklableReturnValue(
                f"rank {ctx.rank}: the function returned {type(value).__name__} {value!r:.80}, "
                f"which cannot be pickled back to the launcher ({error_text(exc)})"
            ) from None
    except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported, not propagated
        effects.job_ends()
        if not still_reporting():
            return result
        result.update(error=error_text(exc), traceback=traceback.format_exc(), site=error_site(exc))
        publish(result)
        named = dcp.failing_ranks(exc)
        ctx._events.emit(
            "failed",
            error=result["error"],
            site=result["site"],
            step=ctx.current_step,
            pg_seq=context.default_group_seq(),
            **({"names": named} if named else {}),
        )
        sys.stderr.write(result["traceback"])
        sys.stderr.flush()
        return result
    effects.job_ends()
    running.activate(None)
    result["wrapped"] = wrapped.records()
    wrapped.forget()
    left = leftovers()
    publish(result)
    ends = {"exits": True} if process_ends else {}
    ctx._events.emit("finished", step=ctx.current_step, leftovers=left, pg_seq=context.default_group_seq(), **ends)
    return result


def warm_up(ctx) -> None:
    """A job that does nothing: a standby world's ranks join their process group (and pay a fresh process's first
    job) before the job they are kept for."""
