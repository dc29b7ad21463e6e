"""A function world's ranks leave their group's creation together (rank/main._all_connected): none runs the function
while a peer may still be finishing its side of gloo's connections."""

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from ddpfaults.rank.main import _all_connected
from processes import EVENT_GUARD


@pytest.mark.parametrize("world_size", [2, 4])
def test_no_rank_leaves_before_the_last_has_joined(tmp_path, world_size):
    path = str(tmp_path / "store")
    left: dict[int, float] = {}
    last_joined = []

    def rank(r):
        store = dist.FileStore(path, world_size)
        store.set_timeout(timedelta(seconds=60))
        if r == world_size - 1:
            # fixed: makes the last rank late: the others must wait for it however long it takes, no speed decides
            time.sleep(0.5)  # the last rank's init_process_group returns late
            last_joined.append(time.monotonic())
        _all_connected(store, world_size)
        left[r] = time.monotonic()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=EVENT_GUARD)
    assert sorted(left) == list(range(world_size))
    assert min(left.values()) >= last_joined[0]


def test_a_rank_that_never_joins_leaves_the_others_waiting_until_the_store_times_out(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 2)
    store.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(RuntimeError, match="[Tt]imeout|[Tt]imed out"):
        _all_connected(store, 2)
