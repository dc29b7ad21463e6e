"""Every file a job's rank opens, renames or removes, whatever Python code issued it (``open``, ``torch.load``, numpy,
DCP's writer and reader), from the interpreter's audit events (``sys.addaudithook``: ``open``, ``os.rename`` (which
``os.replace`` raises too), ``os.remove``, ``os.truncate``).

The hook is added once per process and can never be removed: it consults the running job's context
(:mod:`ddpfaults.rank.running`), the job that :func:`begin`-s and its listeners (:func:`listen`: the resume check's
capture, an armed checkpoint fault), so a warm rank's next job, or the time between jobs, records nothing of
another's, and a job nobody listens to costs one test per audit event. It sees every open in the process (imports
too), so it filters first by event name, then drops the interpreter's and libraries' own files (sources, compiled
modules, anything under the interpreter's prefixes), the kernel's (``/proc``, ``/sys``, ``/dev``), caches, and
ddpfaults' own files (directly in the job's directory, the checkpoint handshake's flags). A file opened outside
Python's I/O raises no audit event: ``torch.save`` to a path (torch's C++ writer opens it) is noted by ``torch.save``
itself (:func:`saved`); a library's native writer or reader (safetensors' Rust ``save_file`` and ``safe_open``) is
not seen. A DataLoader worker forked from the rank inherits the hook; it records nothing (another process). Each file
met is one ``file`` event (:mod:`ddpfaults.events`): ``how`` (``read``, ``wrote``, ``renamed`` (``path`` the new name,
``src`` the old), ``removed``), ``path`` (resolved), ``mode``, ``size`` (bytes when seen; a file opened for writing is
measured later, :func:`measured`), ``step`` and ``wall``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import torch

from ddpfaults import events
from ddpfaults.rank import running

#: the audit events that touch a file by name
_EVENTS = frozenset({"open", "os.rename", "os.remove", "os.truncate"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SKIPPED_SUFFIXES = (".py", ".pyc", ".so", ".pyi")  # not .pth: a checkpoint as often as a site file
_SKIPPED_PIECES = ("/.ddpfaults-", "/torchinductor_", "/.cache/", "/.triton/", "/__pycache__/")

_job = None  # (ctx, pid, own directories) of the running job (begin)
_real_dirs: dict = {}  # directory -> its resolution, for the running job (begin forgets them)
_notes: list = []  # (ctx, note): who is told of that job's file events (listen)
_inside = threading.local()  # .busy: this thread is noting a file (its own opens are not the job's)
_installed = False


def install() -> None:
    """Add the audit hook and route ``torch.save`` to a path through :func:`saved` (once per process; inert unless a
    job :func:`begin`-s and someone :func:`listen`-s)."""
    global _installed
    if _installed:
        return
    _installed = True
    # the interpreter runs an audit hook untraced unless it has this attribute: with it, a tracer (coverage.py, a
    # debugger, a profiler) sees the hook and its listeners (an armed checkpoint fault, the resume check) as any code
    _hook.__cantrace__ = True
    sys.addaudithook(_hook)
    original = torch.save

    def save(obj, f, *args, **kwargs):
        """torch.save, noting a path it writes (torch's C++ writer opens it: no audit event shows it)."""
        if _notes:
            saved(f)
        return original(obj, f, *args, **kwargs)

    save.__doc__, save.__name__, save.__wrapped__ = original.__doc__, original.__name__, original
    torch.save = save


def begin(ctx, ignore: tuple = ()) -> None:
    """``ctx``'s job runs in this process from now on (``ignore``: directories whose own files, not their
    subdirectories', are ddpfaults': the job's directory holds the rank's files and the shared directory); a job
    begun anew keeps its listeners, another job's are dropped."""
    global _job, _notes
    install()
    _real_dirs.clear()
    own = frozenset(os.path.realpath(d) for d in ignore)
    if _job is not None and _job[0] is ctx:
        own |= _job[2]
    else:
        _notes = []
    _job = (ctx, os.getpid(), own)


def listen(ctx, note, first: bool = False) -> None:
    """Call ``note(event)`` with each ``file`` event of ``ctx``'s job from now on (until :func:`unlisten`); ``first``:
    before the other listeners (an audit event comes before its action: a listener that may kill the process there,
    so that the action never happens, goes first, and the others never note it)."""
    _notes.insert(0, (ctx, note)) if first else _notes.append((ctx, note))


def unlisten(ctx, note) -> None:
    """Stop telling ``note`` of ``ctx``'s files (other listeners stay)."""
    _notes[:] = [(c, n) for c, n in _notes if not (c is ctx and n == note)]


@contextlib.contextmanager
def quiet():
    """Inside the block this thread's file events are ddpfaults' own (a checkpoint fault cutting or restoring the
    job's file), not the job's."""
    busy = getattr(_inside, "busy", False)
    _inside.busy = True
    try:
        yield
    finally:
        _inside.busy = busy


def saved(path) -> None:
    """Note that the running job writes ``path`` through a door the audit events miss (``torch.save`` to a path)."""
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


#: where the interpreter's, the libraries' and the kernel's files are
_SYSTEM = tuple(
    os.path.join(p, "")
    for p in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, "/proc", "/sys", "/dev", "/usr/lib", "/usr/share"})
)


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS or not _notes or getattr(_inside, "busy", False):
        return
    job = _job
    if job is None or running.current() is not job[0] or os.getpid() != job[1]:
        return
    ctx, _, own = job
    _inside.busy = True  # a listener's own files (a checkpoint fault's flags and cuts) are none of the job's
    try:
        found = _event(event, args, own)
        if found is not None:
            record = events.event("file", **found, step=ctx.current_step, wall=time.time())
            for owner, note in list(_notes):
                if owner is ctx:
                    note(record)
    finally:
        _inside.busy = False


def _event(event: str, args: tuple, own: frozenset) -> dict | None:
    """The ``file`` event's fields for audit event ``event`` (None: no file of the job's)."""
    path = _path(args[0], own)
    if path is None:
        return None
    if event == "open":
        mode, flags = args[1], args[2]
        mode = mode if isinstance(mode, str) else f"flags {flags:#o}"
        if (flags or 0) & _WRITE_FLAGS:  # its size is what it holds once written: measured later (measured)
            return {"how": "wrote", "path": path, "mode": mode, "size": None}
        return {"how": "read", "path": path, "mode": mode, **_size(path)}
    if event == "os.rename":
        target = _path(args[1], own)
        return None if target is None else {"how": "renamed", "path": target, "src": path, **_size(path)}
    if event == "os.truncate":
        return {"how": "wrote", "path": path, "mode": "truncate", "size": args[1]}
    return {"how": "removed", "path": path, **_size(path)}


def _path(name, own: frozenset) -> str | None:
    """``name`` resolved, unless it is no file of the job's (a descriptor, the interpreter's, the kernel's, a cache's,
    ddpfaults' own: a file directly in one of the ``own`` directories)."""
    if isinstance(name, int):
        return None
    try:
        name = os.fsdecode(name)
    except TypeError:
        return None
    if name.endswith(_SKIPPED_SUFFIXES) or name.startswith(_SYSTEM):
        return None
    path = _resolved(name)
    if path.startswith(_SYSTEM) or any(piece in path for piece in _SKIPPED_PIECES) or os.path.dirname(path) in own:
        return None
    return path


def _resolved(name: str) -> str:
    """``name`` resolved as ``os.path.realpath`` does, its directory's resolution kept for the job (a job's files
    are mostly in directories it met before: a full resolution is a system call per path component)."""
    head, tail = os.path.split(os.path.abspath(name))
    real = _real_dirs.get(head)
    if real is None:
        real = _real_dirs[head] = os.path.realpath(head)
    path = os.path.join(real, tail)
    return os.path.realpath(path) if os.path.islink(path) else path


def _size(path: str) -> dict:
    try:
        return {"size": os.stat(path).st_size}
    except OSError:
        return {"size": None}
