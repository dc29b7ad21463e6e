"""Worlds recorded once from real runs and kept as fixtures (``tests/recorded/NAME.json.gz``: the world's JSON, as
``WorldResult.to_json`` writes it), for tests of what is made from a result where a live world adds nothing but its
cost: the HTML page at 16 and 64 ranks (a world past 8 ranks costs seconds of CPU on two cores; it belongs in the
slow tests and the benchmarks).

Re-record them all, after a change to what a world records: ``python tests/support/recorded.py``. The fast tests
check that each recording reads back whole (``tests/report/test_recorded.py``); the slow tests run each live world
again and check that it still gives what was recorded.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

import rankfns
from ddpfaults import run_world
from ddpfaults.faults import SkippedCollective
from ddpfaults.judge.results import WorldResult
from processes import WORLD_GUARD

DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recorded")

#: name -> (world size, the rank that skips its step-2 all_reduce of ``rankfns.all_reduce_steps``): one collective
#: ahead of its peers, which hang; the judge names it
RECORDINGS = {"hung16": (16, 9), "hung64": (64, 33)}


def live(name: str) -> WorldResult:
    """Run the world recorded as ``name``."""
    world_size, skipper = RECORDINGS[name]
    return run_world(
        rankfns.all_reduce_steps,
        world_size=world_size,
        # fixed: the stall window of the hang recorded; load calls none sooner (a starved rank is computing)
        stall=1.0,
        timeout=WORLD_GUARD,
        startup=WORLD_GUARD,
        faults=[SkippedCollective(rank=skipper, step=2)],
    )


def path(name: str) -> str:
    """Where the recording ``name`` is kept."""
    return os.path.join(DIRECTORY, f"{name}.json.gz")


def document(name: str) -> dict:
    """The recording ``name`` as its JSON document."""
    with gzip.open(path(name), "rt", encoding="utf-8") as f:
        return json.load(f)


def load(name: str) -> WorldResult:
    """The world recorded as ``name``."""
    return WorldResult.from_dict(document(name))


def record(name: str) -> WorldResult:
    """Run the world ``name`` and keep it as its recording (only a world that hung at its skipper)."""
    result = live(name)
    skipper = RECORDINGS[name][1]
    if result.outcome != "hung" or result.root_rank != skipper:
        raise SystemExit(f"{name}: not recorded: expected hung at rank {skipper}, got\n{result.report()}")
    os.makedirs(DIRECTORY, exist_ok=True)
    with gzip.GzipFile(path(name), "wb", mtime=0) as f:  # mtime 0: the same world gives the same bytes
        f.write(result.to_json().encode())
    return result


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(RECORDINGS):
        print(f"{name}: {record(name).outcome} at rank {RECORDINGS[name][1]} -> {os.path.relpath(path(name))}")
