"""The rank side of the flight recorder: dumps never collide and never make a rank fail."""

from __future__ import annotations

import os
import threading

from ddpfaults.rank import flight


def test_concurrent_dumps_of_one_path_never_collide(tmp_path, monkeypatch):
    """The recorder thread and the job's end may dump at the same moment: both succeed, one file is left."""
    monkeypatch.setattr(flight, "dump", lambda since_wall=None: b"x" * 100_000)
    path = str(tmp_path / "rank0.fr")
    results, start = [], threading.Barrier(8)

    def dump_many():
        start.wait()
        results.extend(flight.write(path) for _ in range(50))

    threads = [threading.Thread(target=dump_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 400
    assert os.listdir(tmp_path) == ["rank0.fr"] and os.path.getsize(path) == 100_000


def test_a_dump_that_cannot_be_written_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(flight, "dump", lambda since_wall=None: b"x")
    assert flight.write(str(tmp_path / "missing" / "rank0.fr")) is False


def test_stop_waits_for_the_recorder_thread(tmp_path):
    recorder = flight.DumpOnRequest(str(tmp_path / "rank0.fr"))
    recorder.start()
    recorder.stop()
    assert not recorder.is_alive()
