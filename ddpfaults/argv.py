"""A script's arguments as a run setting holds them (``restart_argv``): a shell-quoted string or a list of strings.

Imports nothing of ddpfaults (the settings table reads it).
"""

from __future__ import annotations

import shlex


def is_argv(value) -> bool:
    """True for a script's arguments as a setting holds them: None, a shell-quoted string, a list of strings."""
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value))
    )


def parse_argv(text: str) -> str:
    """Arguments as a command line gives them: checked to split as a shell would (ValueError: unbalanced quotes)."""
    shlex.split(text)
    return text


def argv_of(value) -> tuple[str, ...] | None:
    """A :attr:`RunSpec.restart_argv` value as a script's arguments (None: none given)."""
    if value is None:
        return None
    return tuple(shlex.split(value)) if isinstance(value, str) else tuple(value)


def argv_text(argv) -> str:
    """A list of arguments as a shell command line writes them."""
    return shlex.join(argv)
