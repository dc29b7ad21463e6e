"""The directories ``torch.distributed.checkpoint.load`` reads, for the resume check (:mod:`ddpfaults.rank.resume`).

DCP's loader module is wrapped as it is imported (it costs 0.6 s and is never imported here), before its package binds
``load`` from it, so ``dcp.load(state, checkpoint_id=...)`` calls ``note("loaded", directory)``. (A DCP save is seen
where it ends: its ``.metadata`` file renamed into place.)
"""

from __future__ import annotations

import functools
import os
import sys

from ddpfaults.rank.on_import import patch_on_import

_LOADER = "torch.distributed.checkpoint.state_dict_loader"


def watch(note) -> None:
    """Make DCP's ``load`` call ``note("loaded", directory)`` (now if the loader is imported, else as it is)."""
    patch_on_import(_LOADER, lambda module: _wrap(module, note))


def _wrap(loader, note) -> None:
    original = loader.load
    package = sys.modules.get(loader.__name__.rpartition(".")[0])

    @functools.wraps(original)
    def load(*args, **kwargs):
        where = kwargs.get("checkpoint_id") or getattr(kwargs.get("storage_reader"), "path", None)
        if isinstance(where, (str, os.PathLike)):
            note("loaded", where)
        return original(*args, **kwargs)

    loader.load = load
    if getattr(package, "load", None) is original:
        package.load = load
