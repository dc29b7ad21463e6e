"""ddpfaults: reproduce PyTorch DistributedDataParallel failures on a CPU, as tests.

``run_world(fn, world_size=4, ...)`` runs ``fn(ctx)`` in real gloo rank processes and
returns a :class:`WorldResult` whose ``outcome`` is completed, hung, crashed or timed out;
``run_script("train.py", argv, world_size=4, ...)`` does the same for an unmodified torchrun script.

Importing the package is cheap (pytest loads its plugin on every run); names that need
torch are imported on first use.
"""

from ddpfaults.requirements import check_torch

check_torch()

from ddpfaults.errors import DDPFaultsError  # noqa: E402
from ddpfaults.expect import Check, Expect  # noqa: E402
from ddpfaults.judge.results import Collective, Divergence, FiredFault, Outcome, RankResult, RankState, WorldResult  # noqa: E402
from ddpfaults.scenario import ScenarioError, scenario, script_scenario, variant  # noqa: E402
from ddpfaults.spec import RunSpec, StopReason  # noqa: E402


def pytest_addhooks(pluginmanager):
    """``pytest -p ddpfaults`` from a source checkout (no entry point installed) registers this package:
    register the real plugin module then. Installed, the entry point registers ``ddpfaults.plugin`` under
    the name ``ddpfaults`` and this package is never registered as a plugin."""
    from ddpfaults import plugin

    if not pluginmanager.is_registered(plugin):
        pluginmanager.register(plugin, "ddpfaults.plugin")


_LAZY = {"run_world": "engine.launcher", "run_script": "engine.scripts"}

__all__ = [
    "Check",
    "Collective",
    "DDPFaultsError",
    "Divergence",
    "Expect",
    "FiredFault",
    "Outcome",
    "RankResult",
    "RankState",
    "RunSpec",
    "ScenarioError",
    "StopReason",
    "WorldResult",
    "run_script",
    "run_world",
    "scenario",
    "script_scenario",
    "variant",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``run_world`` and ``run_script`` on first use (importing them imports torch)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddpfaults' has no attribute {name!r}")
