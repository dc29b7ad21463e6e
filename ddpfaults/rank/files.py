"""Every file a job's rank opens, renames or removes, whatever issued it (``open``, ``torch.load``, numpy,
safetensors, DCP's writer), from the interpreter's audit events (``sys.addaudithook``: ``open``, ``os.rename`` (which
``os.replace`` raises too), ``os.remove``, ``os.truncate``).

The hook is added once per process and can never be removed: it consults the running job's context
(:mod:`ddpfaults.rank.running`) and the note the job asked for (:func:`watch`), so a warm rank's next job, or the
time between jobs, records nothing of another's. It sees every open in the process (imports too), so it filters
first by event name, then drops the interpreter's and libraries' own files (sources, compiled modules, anything under
the interpreter's prefixes), the kernel's (``/proc``, ``/sys``, ``/dev``), caches, and ddpfaults' own files (the job's
directory, the checkpoint handshake's flags). ``torch.save`` to a path is the one door Python's audit does not see
(torch's C++ writer opens the file): :func:`saved` is called for it. A DataLoader worker forked from the rank inherits
the hook; it records nothing (another process). Each file met is one ``file`` event (:mod:`ddpfaults.events`):
``how`` (``read``, ``wrote``, ``renamed`` (``path`` the new name, ``src`` the old), ``removed``), ``path`` (resolved),
``mode``, ``size`` (bytes when seen; a file opened for writing is measured later, :func:`measured`), ``step`` and
``wall``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from ddpfaults import events
from ddpfaults.rank import running

#: the audit events that touch a file by name
_EVENTS = frozenset({"open", "os.rename", "os.remove", "os.truncate"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SKIPPED_SUFFIXES = (".py", ".pyc", ".so", ".pth", ".pyi")
_SKIPPED_PIECES = ("/.ddpfaults-", "/torchinductor_", "/.cache/", "/.triton/", "/__pycache__/")

_watch = None  # (ctx, pid, skipped prefixes, note) of the job that asked for its files
_inside = threading.local()  # .busy: this thread is noting a file (its own opens are not the job's)
_installed = False


def install() -> None:
    """Add the audit hook (once per process; inert unless a job :func:`watch`-es its files)."""
    global _installed
    if not _installed:
        _installed = True
        sys.addaudithook(_hook)


def watch(ctx, note, ignore: tuple = ()) -> None:
    """Call ``note(event)`` with each ``file`` event of ``ctx``'s job from now on (``ignore``: directories whose
    files are ddpfaults' own, such as the job's directory)."""
    global _watch
    install()
    prefixes = tuple(os.path.join(os.path.abspath(d), "") for d in ignore) + _system_prefixes()
    _watch = (ctx, os.getpid(), prefixes, note)


def stop(ctx) -> None:
    """Stop noting ``ctx``'s files (a later job's watch is left alone)."""
    global _watch
    if _watch is not None and _watch[0] is ctx:
        _watch = None


def saved(path) -> None:
    """Note that the running job wrote ``path`` through a door the audit events miss (``torch.save`` to a path)."""
    if isinstance(path, (str, bytes, os.PathLike)):
        _hook("open", (path, "wb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC))


def measured(event: dict) -> dict:
    """``event`` with its file's size now (a file written since it was opened); the size it had if it is gone."""
    if event["how"] in ("wrote", "renamed"):
        try:
            return {**event, "size": os.stat(event["path"]).st_size}
        except OSError:
            pass
    return event


def _system_prefixes() -> tuple:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, "/proc", "/sys", "/dev", "/usr/lib", "/usr/share"}
    return tuple(os.path.join(p, "") for p in sorted(prefixes))


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS:
        return
    watching = _watch
    if watching is None or getattr(_inside, "busy", False):
        return
    ctx, pid, skipped, note = watching
    if running.current() is not ctx or os.getpid() != pid:
        return
    _inside.busy = True
    try:
        found = _event(event, args, skipped)
        if found is not None:
            note(events.event("file", **found, step=ctx.current_step, wall=time.time()))
    finally:
        _inside.busy = False


def _event(event: str, args: tuple, skipped: tuple) -> dict | None:
    """The ``file`` event's fields for audit event ``event`` (None: no file of the job's)."""
    path = _path(args[0], skipped)
    if path is None:
        return None
    if event == "open":
        mode, flags = args[1], args[2]
        how = "wrote" if (flags or 0) & _WRITE_FLAGS else "read"
        return {"how": how, "path": path, "mode": mode if isinstance(mode, str) else f"flags {flags:#o}", **_size(path)}
    if event == "os.rename":
        target = _path(args[1], skipped)
        return None if target is None else {"how": "renamed", "path": target, "src": path, **_size(path)}
    if event == "os.truncate":
        return {"how": "wrote", "path": path, "mode": "truncate", "size": args[1]}
    return {"how": "removed", "path": path, **_size(path)}


def _path(name, skipped: tuple) -> str | None:
    """``name`` resolved, unless it is no file of the job's (a descriptor, the interpreter's or ddpfaults' own)."""
    if isinstance(name, int):
        return None
    try:
        name = os.fsdecode(name)
    except TypeError:
        return None
    if name.endswith(_SKIPPED_SUFFIXES) or name.startswith(skipped):
        return None
    path = os.path.realpath(name)
    if path.startswith(skipped) or any(piece in path for piece in _SKIPPED_PIECES) or path.endswith(_SKIPPED_SUFFIXES):
        return None
    return path


def _size(path: str) -> dict:
    try:
        return {"size": os.stat(path).st_size}
    except OSError:
        return {"size": None}
