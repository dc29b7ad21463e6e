"""The folders a world is given (its ranks' working directory, where its dumps go): checked before it starts."""

from __future__ import annotations

import os

from ddpfaults import errors
from ddpfaults.spec import output_problem


def check_cwd(cwd, call: str) -> str | None:
    """``cwd`` as an absolute path (None stays None), once it is known to be a directory; a ConfigError naming
    ``call`` otherwise."""
    if cwd is None:
        return None
    if not isinstance(cwd, (str, os.PathLike)):
        raise errors.ConfigError(f"{call}: cwd must be a directory's path, got {cwd!r}")
    path = os.path.abspath(os.fspath(cwd))
    if not os.path.isdir(path):
        raise errors.ConfigError(f"{call}: cwd {path!r} is not a directory (the ranks' working directory)")
    return path


def check_output_dir(path, name: str) -> None:
    """A :class:`~ddpfaults.errors.ConfigError` naming ``name`` unless ``path`` (None: not asked for) is a folder
    the world's dumps can be written in (or one that can be created)."""
    if path is None:
        return
    if not isinstance(path, (str, os.PathLike)):
        raise errors.ConfigError(f"{name} must be a path, got {path!r}")
    problem = output_problem(path, directory=True)
    if problem:
        raise errors.ConfigError(f"{name} {os.fspath(path)!r} cannot be written: {problem}")
