"""Every use of torch's private API, in one place: what a torch upgrade may break, and where to look when it does.

torch offers no public way to do any of these: read the default process group or the registry of groups
(``c10d._world``), hear when the default group is set (``c10d._World.default_pg``'s setter), dump the flight
recorder (``torch._C._distributed_c10d._dump_fr_trace``) or empty it (torch 2.15's ``_reset_fr_trace``; before it,
its C++ ``reset_all``, hidden in libtorch_cpu: found by :mod:`ddpfaults.rank.native` in its symbol table), queue a
callback at the end of a backward pass (the autograd engine's ``queue_callback``), read where torch.compile keeps its
cache, or import Dynamo ahead of time. Each function says what it gives; callers keep their fallbacks (a function
here raising, or returning None, means: not on this torch).
"""

from __future__ import annotations

import ctypes
import functools
import getpass
import os
import pickle
import re
import tempfile

import torch
import torch.distributed.distributed_c10d as c10d

from ddpfaults.rank import native


def default_group():
    """The default process group (RuntimeError or ValueError without one)."""
    return c10d._get_default_group()


def groups():
    """torch's registry of this process's process groups: ``pg_map``, ``pg_names``, ``pg_group_ranks``,
    ``default_pg``."""
    return c10d._world


def on_default_group(callback) -> None:
    """Call ``callback(group)`` whenever c10d sets this process's default process group (``None`` when it is
    destroyed), however it was made: ``init_process_group``, ``init_device_mesh`` (which calls c10d's function
    through its own reference, bound at its import), a library holding another reference. The one chokepoint is the
    setter of ``c10d._World.default_pg``, through which ``init_process_group``, ``destroy_process_group`` and
    ``_update_default_pg`` all go (torch 2.8 to 2.15). Installed once per process; later calls add callbacks."""
    _DEFAULT_GROUP_CALLBACKS.append(callback)
    prop = c10d._World.__dict__.get("default_pg")
    if not isinstance(prop, property) or getattr(prop.fset, "__ddpfaults_original__", None) is not None:
        return
    original = prop.fset

    def default_pg(self, value):
        original(self, value)
        for call in list(_DEFAULT_GROUP_CALLBACKS):
            call(value)

    default_pg.__ddpfaults_original__ = original
    c10d._World.default_pg = prop.setter(default_pg)


_DEFAULT_GROUP_CALLBACKS: list = []


def flight_record(collectives: bool = True, stacks: bool = True, only_active: bool = False) -> dict:
    """The flight recorder's dump, unpickled: its ``entries`` (with ``collectives``), their stack traces (with
    ``stacks``), ``pg_status``... (raises where torch has no recorder)."""
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace(collectives, stacks, only_active))


def queue_after_backward(callback) -> None:
    """Have the autograd engine call ``callback`` once the running backward pass's computation is done (before
    callbacks queued later, such as DDP's own); RuntimeError outside a backward pass."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def inductor_cache_dir() -> str:
    """Where torch.compile keeps its cache by default (a directory under TMPDIR)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # torch < 2.6: the same rule, inlined in runtime_utils.cache_dir (which creates it)
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
        return os.path.join(tempfile.gettempdir(), "torchinductor_" + user)

    return default_cache_dir()


def load_dynamo() -> None:
    """Import Dynamo now (the first flight-recorder dump imports it: about 1 s of CPU)."""
    import torch._dynamo  # noqa: F401


#: torch's gloo flight recorder (``c10d::FlightRecorder<c10::Event>``): the pointer its ``get()`` keeps, and its
#: ``reset_all()``, declared ``TORCH_API`` in FlightRecorder.hpp but hidden in libtorch_cpu and, before torch 2.15,
#: not bound to Python (``torch._C._distributed_c10d`` has only the dumps). ``reset_all`` starts a new epoch: a dump
#: lists only the entries recorded since, and gloo retires entries by (id, epoch), so it keeps marking the new
#: epoch's entries done.
_RECORDER = b"_ZZN4c10d14FlightRecorderIN3c105EventEE3getEvE8instance"
_RESET_ALL = b"_ZN4c10d14FlightRecorderIN3c105EventEE9reset_allEv"


def _public_reset():
    """torch's own reset of the gloo flight record (torch >= 2.15), or None."""
    return getattr(torch._C._distributed_c10d, "_reset_fr_trace", None)


@functools.cache
def _reset_all():
    """``(address of the recorder pointer, reset_all)`` for this process's libtorch_cpu, or None if torch has its
    own reset (:func:`_public_reset`) or its symbol table does not list both as expected (another build, another
    platform, a torch without a gloo flight recorder)."""
    if _public_reset() is not None:
        return None
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    found = native.symbols(library, [_RECORDER, _RESET_ALL])
    recorder, reset_all = found.get(_RECORDER), found.get(_RESET_ALL)
    if recorder is None or reset_all is None:
        return None
    if (recorder.kind, recorder.size) != (native.STT_OBJECT, ctypes.sizeof(ctypes.c_void_p)):
        return None
    if reset_all.kind != native.STT_FUNC:
        return None
    return recorder.address, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(reset_all.address)


def reset_flight_record() -> bool | None:
    """Empty the gloo flight recorder (a new epoch): True if it was reset, False if it holds nothing yet (no process
    group made one), None where this torch gives no way to (neither its own reset nor the hidden symbols)."""
    public = _public_reset()
    if public is not None:
        try:
            public(backend="gloo")
        except RuntimeError:  # no gloo recorder in this process
            return None
        return True
    found = _reset_all()
    if found is None:
        return None
    recorder = ctypes.c_void_p.from_address(found[0]).value
    if not recorder:
        return False
    found[1](recorder)
    return True
