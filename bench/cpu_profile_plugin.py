"""A pytest plugin for ``bench/profile_tests.py``: each test's CPU, by where it was spent.

Per test (its whole protocol: setup, call, teardown) it appends one JSON line to ``$CPU_PER_TEST_OUT.<worker>``:
wall seconds; CPU seconds of the test's own process (``self``), of the subprocesses it reaped (``children``: pytest
sessions, ``python -m ddpfaults`` runs), of the ranks the fork server reaped (``ranks``) and of the fork server itself
(``fork_server``); and how many worlds it ran through ``ddpfaults.engine.world.run`` and their ranks (``worlds``,
``rank_slots``: world size times the attempts allowed).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

_count = {"worlds": 0, "rank_slots": 0}


def _times(pid: int | None) -> tuple[float, float]:
    """(own CPU, reaped children's CPU) of process ``pid`` in seconds; zeros if it is unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _fork_server() -> int | None:
    from ddpfaults.proc import mp_private

    return mp_private.fork_server_pid()


def _rusage(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config):
    """Count the worlds every test runs, at the engine's one entry."""
    from ddpfaults.engine import world

    run = world.run

    def counted(request):
        _count["worlds"] += 1
        _count["rank_slots"] += request.spec.world_size * (1 + request.spec.max_restarts)
        return run(request)

    world.run = counted


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Measure around the test's whole protocol."""
    server = _fork_server()
    before = (_times(server), _rusage(resource.RUSAGE_SELF), _rusage(resource.RUSAGE_CHILDREN), dict(_count))
    t0 = time.perf_counter()
    yield
    wall = time.perf_counter() - t0
    (server_self, server_reaped), own, reaped, counted = before
    if _fork_server() != server:  # the fork server started during this test: all of its time is this test's
        server, server_self, server_reaped = _fork_server(), 0.0, 0.0
    now_self, now_reaped = _times(server)
    record = {
        "id": item.nodeid,
        "wall": wall,
        "self": _rusage(resource.RUSAGE_SELF) - own,
        "children": _rusage(resource.RUSAGE_CHILDREN) - reaped,
        "ranks": now_reaped - server_reaped,
        "fork_server": now_self - server_self,
        "worlds": _count["worlds"] - counted["worlds"],
        "rank_slots": _count["rank_slots"] - counted["rank_slots"],
    }
    with open(f"{os.environ['CPU_PER_TEST_OUT']}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a") as f:
        f.write(json.dumps(record) + "\n")
