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


class FunctionNotRunnable(DDPFaultsError, TypeError):
    """The rank function is not callable, or cannot be pickled by reference (lambda, closure, local def)."""


class UnpicklableReturnValue(DDPFaultsError):
    """A rank function returned a value that cannot be pickled back to the launcher."""


class FaultError(DDPFaultsError, ValueError):
    """A fault is invalid: a bad argument, or a rank/step outside the world it was given to."""


class FaultNeverFired(DDPFaultsError):
    """A fault that a scenario required to fire never did: the scenario, not the code under test, is wrong."""
