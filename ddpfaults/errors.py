"""Every error ddpfaults raises on purpose derives from :class:`DDPFaultsError`."""


class DDPFaultsError(Exception):
    """Base class of all ddpfaults errors; the message names the bad value and where it came from."""


class ConfigError(DDPFaultsError, ValueError):
    """A ``run_world`` argument or a setting is out of range (world size, timeout, stall, backend...)."""


class InvalidWorldSize(ConfigError):
    """``world_size`` is not an integer of at least 1."""


class InvalidTimeout(ConfigError):
    """``timeout`` or ``stall`` is not a positive number, or ``stall`` is not below ``timeout``."""


class UnknownBackend(ConfigError):
    """``backend`` names a torch.distributed backend ddpfaults cannot run here."""


class UnknownStartMethod(ConfigError):
    """``start_method`` is not one of forkserver, spawn, fork."""


class UnknownPeerFailure(ConfigError):
    """``peer_failure`` is not ``"exit"`` or ``"linger"``."""


class UnsupportedPlatform(DDPFaultsError):
    """This machine lacks what a world needs (Linux's ``/proc`` thread states, ``prctl``); names what is missing."""


class UnsupportedTorch(DDPFaultsError, ImportError):
    """The installed torch is older than the oldest ddpfaults supports; names both versions."""


class FunctionNotRunnable(DDPFaultsError, TypeError):
    """The rank function is not callable, or cannot be pickled by reference (lambda, closure, local def)."""


class InvalidArguments(FunctionNotRunnable):
    """A rank function's ``args`` is not a sequence, its ``kwargs`` not a mapping of names, or its signature does
    not take ``(ctx, *args, **kwargs)``."""


class UnpicklableReturnValue(DDPFaultsError):
    """A rank function returned a value that cannot be pickled back to the launcher."""


class FaultError(DDPFaultsError, ValueError):
    """A fault or a fault plan is invalid: a bad argument, a rank/step outside the world it was given to, a plan
    that is not a list of faults, or two faults that conflict on one rank and step."""


class FaultArgumentError(FaultError, TypeError):
    """A fault constructor was called with a positional, unknown or missing argument (fault arguments are
    keyword-only); names the fault and the arguments it takes."""


class ExpectationFailed(DDPFaultsError):
    """A world did not do what its ``Expect`` says; ``mismatches`` lists every difference, ``result`` is the
    world's :class:`~ddpfaults.judge.results.WorldResult` (None if the raiser had none to give)."""

    def __init__(self, mismatches, result=None):
        self.mismatches = list(mismatches)
        self.result = result
        super().__init__("; ".join(map(str, self.mismatches)))


class FaultNeverFired(ExpectationFailed):
    """A fault of the plan never took effect although it had every chance: a scenario's ``Expect`` required it
    to fire, or ``run_world``/``run_script`` (unless ``require_faults_fire=False``) found a rank it targets
    finished its function without it. The plan, not the code under test, is wrong. ``result`` is the world's
    result, to inspect or print."""


class MarkerError(ConfigError):
    """A ``ddpfaults(...)`` marker has an unknown keyword, a positional argument, or a bad value."""


class DeadlineError(ConfigError):
    """pytest-timeout leaves a test too little time to run a world and reap it."""


class ScenarioError(DDPFaultsError):
    """A scenario declaration is invalid (bad expect, variant, fault or option); names the scenario."""


class ScriptError(DDPFaultsError):
    """A script world's script cannot run as a torchrun worker: not found, exited with an error status, or
    ended without initialising a process group. Names the script."""


class ReportFileError(DDPFaultsError):
    """A report document cannot be read or written, or is not a valid ``ddpfaults.report`` document."""


class ScenarioMismatch(DDPFaultsError):
    """A test's world did not do what was expected; the message is the failure pytest shows (mismatches, the
    expectation, the world's report)."""


class OrphanRanks(DDPFaultsError):
    """Rank processes (or their children) outlived their world: an engine bug, reported after killing them."""


class UnmappableCudaCall(DDPFaultsError):
    """Under ``cuda_on_cpu`` a script made a CUDA call with no CPU meaning (a stream, an event, a CUDA graph, an
    NCCL-only call, a custom CUDA kernel); names the call and the script's line."""
