"""The modules a rank's job wrapped in DDP or FSDP, and a digest of their state: what replica checks compare.

The seams (:mod:`ddpfaults.rank.seams`) call :func:`register` as ``DistributedDataParallel(module)``,
``FullyShardedDataParallel(module)`` or ``fully_shard(module)`` returns, so a script that never imports ddpfaults
is seen wrapping its model. When the job ends, :func:`records` gives each top-level wrapped module (a module
inside another wrapped one, as ``fully_shard`` on each layer then on the root makes, counts once, as its root) in
construction order with its :func:`state_digest`; the registry is then cleared for the next job (:func:`forget`).
Imports nothing of ddpfaults but the rank context's call site.
"""

from __future__ import annotations

from ddpfaults.rank import context
from ddpfaults.rank.digest import SHA256, hexdigest

DDP, FSDP = "ddp", "fsdp"

_registry: list[tuple] = []  # (module, kind, sharded, site), in construction order
_listeners: list = []  # what register calls with each module it notes (the resume capture's forward hook)


def register(module, kind: str, *, sharded: bool = False) -> None:
    """Note that the job wrapped ``module`` (``kind``: ``"ddp"`` or ``"fsdp"``; ``sharded``: each rank holds a part
    of its state, so its ranks' states are not replicas)."""
    if not any(m is module for m, *_ in _registry):
        _registry.append((module, kind, sharded, context.call_site()))
        for listener in _listeners:
            listener(module)


def on_register(listener) -> None:
    """Call ``listener(module)`` with every module :func:`register` notes from now on (once per process)."""
    _listeners.append(listener)


def wrapped_modules() -> list:
    """The top-level modules the job wrapped in DDP or FSDP, in construction order."""
    return [entry[0] for entry in _top_level()]


def _top_level() -> list[tuple]:
    inner = {id(sub) for m, *_ in _registry for sub in m.modules() if sub is not m}
    return [entry for entry in _registry if id(entry[0]) not in inner]


def state_digest(state: dict) -> str:
    """A SHA-256 (hex) of a module's state dict, bit for bit: every entry's name, dtype, shape and bytes, in order
    (a sharded tensor counts its local shard)."""
    return hexdigest(state, SHA256)


def records() -> list[dict]:
    """What the job wrapped, as data for the judge: ``index`` (construction order), ``kind``, ``type`` (the module's
    class), ``site`` (where it was wrapped), ``sharded`` and ``digest`` (:func:`state_digest`; its error's text when
    the state cannot be read)."""
    found = []
    for index, (module, kind, sharded, site) in enumerate(_top_level()):
        try:
            digest = state_digest(module.state_dict())
        except Exception as exc:  # noqa: BLE001 - a state that cannot be read is reported, not fatal to the job
            digest = f"unreadable: {type(exc).__name__}: {exc}"
        found.append(
            {
                "index": index,
                "kind": kind,
                "type": type(module).__name__,
                "site": site,
                "sharded": sharded,
                "digest": digest,
            }
        )
    return found


def forget() -> None:
    """Clear the registry (a job's end: a warm rank's next job starts with none)."""
    _registry.clear()
