"""The DataLoader seam in this process, on plain data: a loader that wraps a DataLoader and fetches one batch ahead
(as accelerate's ``DataLoaderShard`` does) is acted on and recorded where it hands each batch to the loop, so a
data fault at step ``n`` empties the batch the loop gets at step ``n``, as with a plain DataLoader."""

import json
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.utils.data.dataloader as dataloader
from torch.utils.data import DataLoader, TensorDataset

from ddpfaults.faults import EmptyBatch
from ddpfaults.rank import running, seams
from ddpfaults.rank.context import EventLog, RankContext
from ddpfaults.spec import RunSpec


class Adapter:
    """accelerate's ``DataLoaderAdapter``, reduced: it wraps a DataLoader."""

    def __init__(self, batches):
        self.base = DataLoader(TensorDataset(torch.arange(float(batches))), batch_size=1)


class ReadsAhead(Adapter):
    """``DataLoaderShard.__iter__``, reduced: it fetches the next batch before it hands out the current one."""

    def __iter__(self):
        batches = iter(self.base)
        current = next(batches)
        while True:
            try:
                ahead = next(batches)
            except StopIteration:
                yield current
                return
            yield current
            current = ahead


class Inherits(ReadsAhead):
    """An adapter with no ``__iter__`` of its own: patched through its base only."""


class Returns(Adapter):
    """An adapter whose ``__iter__`` returns the DataLoader's iterator (no generator: nothing to close)."""

    def __iter__(self):
        return iter(self.base)


def _loop(tmp_path, loader) -> tuple[list, list]:
    """What a rank 1 on the dataloader clock, with ``EmptyBatch(rank=1, step=2)``, sees of ``loader``: each batch's
    (step when the loop got it, its size), and the seam's events."""
    log = tmp_path / "events"
    ctx = RankContext(
        rank=1,
        spec=RunSpec(world_size=2),
        shared_dir=str(tmp_path),
        faults=(EmptyBatch(rank=1, step=2),),
        events=EventLog(str(log)),
        clock="dataloader",
    )
    running.activate(ctx)
    try:
        got = [(ctx.current_step, len(x)) for (x,) in loader]
    finally:
        running.activate(None)
    kept = ("batch", "loader_end", "fault")
    events = [e for e in map(json.loads, log.read_text().splitlines()) if e["k"] in kept]
    return got, [(e["k"], e.get("index", e.get("yielded"))) for e in events]


@pytest.fixture
def seam(monkeypatch):
    """The DataLoader iterator patched as a rank patches it, undone after the test; accelerate's module reduced to
    the two adapters, patched as :func:`seams._accelerate_loaders` patches accelerate's."""
    iterator = dataloader._BaseDataLoaderIter
    monkeypatch.setattr(iterator, "__next__", seams._next_batch(iterator.__next__))
    for cls in (ReadsAhead, Returns):
        monkeypatch.setattr(cls, "__iter__", cls.__iter__)
    loaders = {"ReadsAhead": ReadsAhead, "Inherits": Inherits, "Returns": Returns}
    seams._accelerate_loaders(SimpleNamespace(DataLoaderAdapter=Adapter, **loaders))


EXPECTED = [(0, 1), (1, 1), (2, 0), (3, 1), (4, 1)]  # batch 2, the batch of step 2, emptied
EVENTS = [("batch", 0), ("batch", 1), ("batch", 2), ("fault", 0), ("batch", 3), ("batch", 4), ("loader_end", 5)]


def test_a_plain_dataloader_is_recorded_where_it_yields(tmp_path, seam):
    assert _loop(tmp_path, Adapter(5).base) == (EXPECTED, EVENTS)


@pytest.mark.parametrize("kind", [ReadsAhead, Inherits, Returns])
def test_a_loader_reading_ahead_is_recorded_where_it_hands_a_batch_to_the_loop(tmp_path, seam, kind):
    assert "__iter__" not in vars(Inherits)  # its base's patch is the one it runs
    assert _loop(tmp_path, kind(5)) == (EXPECTED, EVENTS)


def test_without_the_wrapper_patch_a_loader_reading_ahead_is_recorded_a_batch_late(tmp_path, monkeypatch):
    """What the seam saw of accelerate's loader before: the fetches, each one batch ahead of the loop (two before
    its first batch, none before its last), so the loop got batch ``i`` at step ``i + 1`` and the fault's batch, the
    one fetched at step 2, at step 3."""
    iterator = dataloader._BaseDataLoaderIter
    monkeypatch.setattr(iterator, "__next__", seams._next_batch(iterator.__next__))
    got, events = _loop(tmp_path, ReadsAhead(5))
    assert got == [(1, 1), (2, 1), (3, 0), (4, 1), (4, 1)]
    assert events[:2] == [("batch", 0), ("batch", 1)]


def test_a_loop_that_stops_early_closes_the_wrapped_iterator(tmp_path, seam):
    closed = []

    class Tracked(Adapter):
        def __iter__(self):
            try:
                yield from self.base
            finally:
                closed.append(True)

    seams._accelerate_loaders(SimpleNamespace(DataLoaderAdapter=Adapter, Tracked=Tracked))
    running.activate(None)
    batches = iter(Tracked(5))
    next(batches)
    batches.close()
    assert closed == [True]


def test_a_dataloader_another_thread_draws_from_meanwhile_is_still_recorded(tmp_path, seam):
    """A wrapper's own fetches are silent in its thread only: a plain DataLoader a thread draws from while the
    wrapper fetches keeps its batches (each of its iterators is one of the rank's, numbered in order)."""

    class BesideAThread(Adapter):
        def __iter__(self):
            for batch in self.base:
                thread = threading.Thread(target=lambda: next(iter(Adapter(1).base)))
                thread.start()
                thread.join()
                yield batch

    seams._accelerate_loaders(SimpleNamespace(DataLoaderAdapter=Adapter, BesideAThread=BesideAThread))
    got, events = _loop(tmp_path, BesideAThread(2))
    # the thread's batch came first each time, a step of the dataloader clock each: the fault's step 2 was its batch
    assert got == [(1, 1), (3, 1)]
    assert [k for k, _ in events] == ["batch", "batch", "batch", "fault", "batch", "loader_end"]
