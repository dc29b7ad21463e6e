"""The oldest torch ddpfaults supports, checked when ``ddpfaults`` is imported (from torch's installed metadata:
torch itself is not imported).

torch 2.8 is the first whose gloo process groups feed torch's flight recorder, the record in which ddpfaults sees
DDP's gradient buckets and broadcasts; without it a rank that skips ``backward`` is not named at the collective it
skipped (torch 2.7.1: 74 of the 75 built-in cases; docs/development.md has the measurements).
"""

from __future__ import annotations

import re
from importlib import metadata

from ddpfaults.errors import UnsupportedTorch

TORCH_FLOOR = (2, 8)


def torch_version() -> str | None:
    """The installed torch's version (``2.13.0+cpu``), or None if torch is not installed (importing it says so)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def check_torch(version: str | None = None) -> None:
    """Raise :class:`~ddpfaults.errors.UnsupportedTorch` if the installed torch (or ``version``) is older than
    :data:`TORCH_FLOOR`."""
    version = torch_version() if version is None else version
    found = re.match(r"(\d+)\.(\d+)", version or "")
    if found and (int(found.group(1)), int(found.group(2))) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise UnsupportedTorch(
            f"ddpfaults needs torch >= {floor}; the installed torch is {version} "
            f"(its gloo has no flight recorder). Install a CPU build: "
            f"pip install 'torch>={floor}' --index-url https://download.pytorch.org/whl/cpu"
        )
