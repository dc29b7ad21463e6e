"""A script world's rank: the user's ``train.py`` (or ``-m pkg.module``) run as a torchrun worker, unmodified.

The rank gets the environment torchrun's agent gives a worker (:func:`worker_env`, with the launcher hosting
the store as torchrun's agent does), ``sys.argv``, ``__main__``, the working directory and ``sys.path[0]`` as
``python -u train.py ARGS`` would have them, and its own ``init_process_group`` call traced as the wait on its
peers it is. Steps are counted by the seams (:mod:`ddpfaults.rank.seams`). ``SystemExit(0)`` (or ``None``) is
success; another exit status fails the rank, quoting the last line the script wrote to stderr (argparse's
complaint, typically), or the script's own message (``sys.exit("message")``), at the script's line that exited,
except after a preemption notice: then it is the script's handler answering the notice and
stays a ``SystemExit`` (as in a rank function, the judge's preemption). A script that ends without ever
initialising a process group fails too.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
from dataclasses import dataclass

import torch.distributed.distributed_c10d as c10d

from ddpfaults.errors import ScriptError
from ddpfaults.rank import context, preempt, running, seams, torch_private

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ScriptTarget:
    """What a script world runs: a file (``path``) or a module (``module``), with its argv, working directory,
    step clock, and the store torchrun's agent would host (``master_port``, ``run_id``; port 0: the rank runs
    under a real torchrun, whose environment it keeps)."""

    path: str | None
    module: str | None
    argv: tuple[str, ...]
    cwd: str
    clock: str
    master_port: int
    run_id: str
    shown: str | None = None  # how a report names the script: its path as the caller gave it (None: from cwd)
    restart: int = 0  # TORCHELASTIC_RESTART_COUNT: the attempt of a restarted world
    max_restarts: int = 0

    @property
    def name(self) -> str:
        """``train.py`` or ``-m pkg.module``, as a report names it."""
        return self.module and f"-m {self.module}" or self.shown or os.path.relpath(self.path, self.cwd)


def worker_env(target: ScriptTarget, rank: int, world_size: int, threads: int) -> dict[str, str]:
    """The variables torchrun's agent sets for the worker of ``rank`` on a one-node world
    (torch/distributed/elastic/agent/server/local_elastic_agent.py), so frameworks detect torchrun."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(world_size),
        "WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(target.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(target.restart),
        "TORCHELASTIC_MAX_RESTARTS": str(target.max_restarts),
        "TORCHELASTIC_RUN_ID": target.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
    }


class _StderrTail:
    """sys.stderr that remembers the last text written through Python (for an exit status's explanation)."""

    def __init__(self, stream):
        self._stream, self.tail = stream, ""

    def write(self, text):
        self.tail = (self.tail + text)[-2000:]
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


_initialised = False  # c10d set a default process group in this process (the script's, however it made it)
_inside_traced_init: list = []  # the traced init_process_group calls running (the script's own, by any reference)
_attempt_store = None  # under a real torchrun: the store an env:// process group gets (see use_store)


def use_store(store) -> None:
    """Under a real torchrun: give the script's ``env://`` process group ``store`` (the attempt's own) instead of
    torchrun's agent store, where a restarted worker reads the dead attempt's addresses (pytorch#135712)."""
    global _attempt_store
    _attempt_store = store


def _with_attempt_store(original, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``init_process_group``'s arguments with the attempt's store when the call initialises from torchrun's
    environment (no store, ``env://`` or no init_method); other calls as they are."""
    if _attempt_store is None:
        return args, kwargs
    bound = inspect.signature(original).bind_partial(*args, **kwargs)
    given = bound.arguments
    if given.get("store") is not None or given.get("init_method") not in (None, "env://"):
        return args, kwargs
    given.pop("init_method", None)
    given["store"] = _attempt_store
    for name, variable in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        if given.get(name, -1) == -1:
            given[name] = int(os.environ[variable])
    return bound.args, bound.kwargs


def _traced_init(original):
    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        ctx = running.current()
        if ctx is None:
            return original(*args, **kwargs)
        seq = ctx._enter("init_process_group", [], context.call_site())
        args, kwargs = _with_attempt_store(original, args, kwargs)
        _inside_traced_init.append(seq)
        try:
            original(*args, **kwargs)
        finally:
            _inside_traced_init.pop()
        ctx._exit(seq)
        seams.process_group_ready(ctx)

    init_process_group.__ddpfaults_original__ = original
    return init_process_group


def _default_group_set(group) -> None:
    """c10d set the default process group (:func:`~ddpfaults.rank.torch_private.on_default_group`): the script is
    distributed, however it made the group."""
    global _initialised
    if group is None:
        return
    _initialised = True
    ctx = running.current()
    if ctx is not None and not _inside_traced_init:  # the traced call starts the step clock once it returns
        seams.process_group_ready(ctx)


def _trace_init() -> None:
    """Trace the script's ``init_process_group`` as its wait on its peers, by every reference to it: c10d's and
    torch.distributed's, and the ones modules bound at their import (``torch.distributed.device_mesh``'s, which
    ``init_device_mesh`` calls; a library's). Whether the script became distributed is heard where c10d sets its
    default group, whatever made it."""
    original = c10d.init_process_group
    if hasattr(original, "__ddpfaults_original__"):
        return
    traced = _traced_init(original)
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("init_process_group") is original:
            module.init_process_group = traced
    torch_private.on_default_group(_default_group_set)


def run(ctx, target: ScriptTarget, threads: int = 1) -> None:
    """The rank function of a script world: run ``target`` as torchrun's worker of ``ctx.rank`` would."""
    if target.master_port:
        os.environ.update(worker_env(target, ctx.rank, ctx.world_size, threads))
    os.chdir(target.cwd)
    _trace_init()
    ctx.clock = target.clock
    stderr = sys.stderr = _StderrTail(sys.stderr)
    try:
        if target.path is not None:
            sys.argv = [target.path, *target.argv]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target.path)))
            runpy.run_path(target.path, run_name="__main__")
        else:
            sys.argv = [target.module, *target.argv]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, target.cwd)
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None) and preempt.notified(ctx):
            raise
        if exc.code not in (0, None):
            if isinstance(exc.code, int):
                last = stderr.tail.strip().splitlines()[-1:] or ["(nothing on stderr)"]
                message = f"{target.name} exited with status {exc.code}: {last[0]}"
            else:  # sys.exit("message"): the script's own words, printed to stderr, status 1
                message = f"{target.name} exited by its own choice: {exc.code}"
            # the script's frames come along: the site is the script's line that exited, not this one
            raise ScriptError(message).with_traceback(exc.__traceback__) from None
    finally:
        sys.stderr = stderr._stream
    if not _initialised:
        raise ScriptError(
            f"{target.name} ended on rank {ctx.rank} without initialising a process group "
            f"(c10d never set a default group: neither init_process_group nor init_device_mesh ran): it tested nothing "
            f"distributed"
        )
