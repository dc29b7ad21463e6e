"""ddpfaults: reproduce PyTorch DistributedDataParallel failures on a CPU, as tests.

``run_world(fn, world_size=4, ...)`` runs ``fn(ctx)`` in real gloo rank processes and
returns a :class:`WorldResult` whose ``outcome`` is completed, hung or crashed.
"""

from .errors import DDPFaultsError
from .results import Outcome, RankResult, RankState, WorldResult
from .world import run_world

__all__ = ["DDPFaultsError", "Outcome", "RankResult", "RankState", "WorldResult", "run_world"]
__version__ = "0.1.0"
