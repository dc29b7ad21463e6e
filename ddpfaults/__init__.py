"""ddpfaults: reproduce PyTorch DistributedDataParallel failures on a CPU, as tests.

``run_world(fn, world_size=4, ...)`` runs ``fn(ctx)`` in real gloo rank processes and
returns a :class:`WorldResult` whose ``outcome`` is completed, hung or crashed.
"""

from .errors import DDPFaultsError
from .results import Outcome, RankResult, RankState, WorldResult
from .scenario import Expect, RunOptions, ScenarioError, scenario, variant
from .world import run_world

__all__ = [
    "DDPFaultsError", "Expect", "Outcome", "RankResult", "RankState", "RunOptions", "ScenarioError",
    "WorldResult", "run_world", "scenario", "variant",
]
__version__ = "0.1.0"
