"""Patch a module when it is imported: now if it already is, else the first time anything imports it (after the
module ran, before the importer binds names from it: ``from pkg import f`` then gets the patched ``f``). DCP's saver
and loader and ``torch.utils.cpp_extension`` are patched this way: each costs a rank 0.6-1.2 s to import for nothing
when the job never uses it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


def patch_on_import(name: str, patch: Callable) -> None:
    """Call ``patch(module)`` for the module ``name``: now if it is imported, else once it is."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                self.patch(module)

            spec.loader.exec_module = exec_module
        return spec
