"""How a setting is found: its names outside Python (the pytest option, the environment variable), the one read of
the environment, and the rule that picks a value from its layers (command line > environment > ini > marker >
declared), saying where it came from. The run spec (:mod:`ddpfaults.spec`) and the pytest plugin's settings
(:mod:`ddpfaults.settings`) both resolve through it. Imports nothing of ddpfaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def pytest_option_name(name: str) -> str:
    """The pytest plugin's option of setting ``name``, e.g. ``--ddpfaults-world-size``."""
    return "--ddpfaults-" + name.replace("_", "-")


def environment_name(name: str) -> str:
    """The environment variable of setting ``name``, e.g. ``DDPFAULTS_WORLD_SIZE``."""
    return "DDPFAULTS_" + name.upper()


def from_environment(name: str, environ: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """The one read of a setting from the environment: ``(DDPFAULTS_NAME, its text)``; None when unset or empty."""
    variable = environment_name(name)
    return variable, environ.get(variable) or None


def first_given(layers) -> tuple[str, Any]:
    """The resolver's rule: the first of ``layers`` (``(where, value)``, highest first: command line > environment >
    ini > marker > declared) that gives a value (not None); ``("default", None)`` when none does."""
    return next(((where, value) for where, value in layers if value is not None), ("default", None))
