"""What the CUDA mapping (``cuda_on_cpu``) shares: which devices it maps, and the one refusal of what it cannot map.

A refusal is :class:`~ddpfaults.errors.UnmappableCudaCall` naming the call and the user's line (the innermost frame
outside torch and ddpfaults).
"""

from __future__ import annotations

import os
import sys

import torch

from ddpfaults.errors import UnmappableCudaCall
from ddpfaults.rank.context import is_machinery

CPU = torch.device("cpu")
OPTION = "--cuda-on-cpu"


def maps(device) -> bool:
    """True if ``device`` names a CUDA device: ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)``, or a bare
    index (torch reads ``device=0`` as ``cuda:0``)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":", 1)[0].strip() == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def user_line() -> str:
    """``file.py:LINE in func`` of the innermost frame outside torch and ddpfaults (the user's call)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not is_machinery(frame.f_code.co_filename):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def refuse(call: str, reason: str):
    """Raise :class:`UnmappableCudaCall` for ``call`` at the user's line."""
    line = user_line()
    where = f" (called at {line})" if line != "?" else ""
    raise UnmappableCudaCall(
        f"{OPTION} cannot map {call}{where}: {reason}; run this script on a GPU, or change the call "
        f"(docs/scripts.md lists what the mapping covers)"
    )


#: the attribute a stand-in carries for the census (:func:`ddpfaults.rank.cuda_on_cpu.census`): ``(how, what)``,
#: how being ``"mapped"`` or ``"refused"`` and what the CPU answer, or the reason
CENSUS = "__ddpfaults_census__"


def marked(stand_in, how: str, what: str):
    """``stand_in`` marked for the census as ``how`` (``"mapped"``, ``"refused"``) with ``what``; returned."""
    setattr(stand_in, CENSUS, (how, what))
    return stand_in


def refusing(name: str, reason: str, prefix: str = "torch.cuda."):
    """A function standing in for ``prefix + name`` that refuses every call."""

    def refused(*args, **kwargs):
        refuse(f"{prefix}{name}", reason)

    refused.__name__ = refused.__qualname__ = name
    return marked(refused, "refused", reason)


def refusing_class(name: str, reason: str, prefix: str = "torch.cuda."):
    """A class standing in for ``prefix + name`` that refuses to be made (``isinstance`` against it stays valid)."""
    made = type(name, (), {"__new__": lambda cls, *a, **k: refuse(f"{prefix}{name}", reason)})
    return marked(made, "refused", reason)
