"""The torchrun judge's wait for stack answers through the store (no processes: torch's in-process HashStore, a
thread standing for a live rank's watchdog; the real thing is in test_torchrun.py, -m slow)."""

import threading
import time

import pytest
from torch.distributed import HashStore

from ddpfaults.judge.live import loop
from ddpfaults.spec import RunSpec
from ddpfaults.torchrun import store as store_world
from ddpfaults.torchrun.store import StoreWorld


def _watchdog(store, stop: threading.Event, *, late: int | None, beating: bool = True) -> None:
    """Rank 0's watchdog: beat (unless not ``beating``), and answer each stack request with a dump ``late`` heartbeats
    after it came (None: never)."""
    served, beats, seen = 0, 1, 0
    while beating and not stop.is_set():
        beats += 1
        store.set("hb/0", str(beats))
        asked = int(store.get("stackreq/0"))
        seen = seen + 1 if asked > served else 0
        if late is not None and seen > late:
            store.multi_set(["stack/0", "stackn/0"], ['File "train.py", line 7 in all_reduce', str(asked)])
            served = asked
        time.sleep(store_world.TICK)


def _collect(world, store, indices, **watchdog) -> float:
    """``world.collect_stacks(indices)`` while :func:`_watchdog` runs rank 0; the seconds it took."""
    stop = threading.Event()
    rank0 = threading.Thread(target=_watchdog, args=(store, stop), kwargs=watchdog, daemon=True)
    rank0.start()
    try:
        began = time.monotonic()
        world.collect_stacks(indices)
        return time.monotonic() - began
    finally:
        stop.set()
        rank0.join()


def test_a_live_rank_s_late_answer_is_waited_for_and_a_dead_rank_ends_the_wait_before_the_guard(monkeypatch):
    monkeypatch.setattr(store_world, "DEAD_AFTER", 0.3)  # the dead rule, short: rank 1 stopped beating long ago
    store = HashStore()
    world = StoreWorld(store, spec=RunSpec(world_size=2), t0_wall=time.time())
    for w in world.watches:
        w.events, w.stack = [{"k": "start"}], "a stale stack"
    store.set("hb/1", "5")
    world.watches[1].hb, world.watches[1].hb_seen = 5, time.monotonic()
    # 30 heartbeats (1.5 s): a loaded machine's late answer, later than the 1 s the judge once waited at most
    waited = _collect(world, store, [0, 1], late=30)
    assert world.watches[0].stack == 'File "train.py", line 7 in all_reduce'
    assert world.answered == {0}
    assert world.watches[1].stack is None  # unknown, never the stale one
    assert waited < loop.ANSWER_GUARD, f"the wait for a dead rank ran to the guard ({waited:.1f} s)"


@pytest.mark.parametrize("beating", [False, True])
def test_a_rank_that_never_answers_is_waited_for_up_to_the_guard_reading_its_heartbeat(beating, monkeypatch):
    # fixed: the guard, cut short; the dead rule, long: only the guard can end the wait for a beating rank
    monkeypatch.setattr(loop, "ANSWER_GUARD", 0.5)
    monkeypatch.setattr(store_world, "DEAD_AFTER", 60.0)
    store = HashStore()
    world = StoreWorld(store, spec=RunSpec(world_size=1), t0_wall=time.time())
    w = world.watches[0]
    w.events, w.hb, w.hb_seen = [{"k": "start"}], 1, time.monotonic()
    _collect(world, store, [0], late=None, beating=beating)
    assert w.stack is None and world.answered == set()
    assert (w.hb > 1) == beating  # the wait read the heartbeat it judges death by
