"""The one predicate for "computing, or about to compute" (ddpfaults.judge.live.activity) over a fake observer's
evidence: the questions every rule asks of it, as its parameters."""

from __future__ import annotations

import time

from ddpfaults.judge.live import activity
from ddpfaults.judge.live.activity import BUSY, POLLING, Mark, computing


class Evidence:
    """An observer's evidence of computing, per rank: CPU seconds (its main thread's, and the whole process's),
    its main thread's demand for a core (seconds), and what a look at its threads answers."""

    def __init__(self, main=None, process=None, demand=None, runnable=None, threads_runnable=None):
        self.main, self.process, self.wants = main or {}, process or {}, demand or {}
        self.seen, self.threads_seen = runnable or {}, threads_runnable or {}
        self.looks = 0

    def cpu(self, i, main=False):
        return (self.main if main else self.process).get(i)

    def demand(self, i):
        return self.wants.get(i)

    def runnable(self, i, threads=False):
        self.looks += 1
        return (self.threads_seen if threads else self.seen).get(i, False)


def a_second_ago(**fields):
    return Mark(time.monotonic() - 1.0, **fields)


def test_where_demand_is_counted_it_alone_decides_a_waiting_rank():
    """Over about a second: rank 0 wanted a core 90% of it (computing, starved), rank 1 0.2% (asleep in a polling
    loop), rank 2 3% with CPU time moved (demand decides: not computing); no look is taken."""
    since = {i: a_second_ago(cpu=0.0, demand=0.0) for i in range(3)}
    evidence = Evidence(main={0: 0.01, 1: 0.001, 2: 0.02}, demand={0: 0.9, 1: 0.002, 2: 0.03}, runnable={1: True})
    assert computing(evidence, [0, 1, 2], since) == [0]
    assert evidence.looks == 0


def test_where_demand_is_not_counted_cpu_time_then_a_look_decides():
    since = {i: a_second_ago(cpu=1.0) for i in range(3)}
    evidence = Evidence(main={0: 1.01, 1: 1.0, 2: 1.0}, runnable={2: True})
    assert computing(evidence, [0, 1, 2], since) == [0, 2]  # 0 used CPU; 2 was seen runnable
    assert computing(evidence, [1, 2]) == [2]  # no window: the looks alone


def test_a_rank_polling_a_rendezvous_may_want_a_core_part_of_the_time():
    """POLLING: wanting a core 14% of the time (a FileStore poller beside CPU hogs) is waiting; 60% is not, nor using
    more than 5% of a core."""
    since = {i: a_second_ago(cpu=0.0, demand=0.0) for i in range(3)}
    evidence = Evidence(main={0: 0.01, 1: 0.1, 2: 0.02}, demand={0: 0.14, 1: 0.6, 2: 0.3})
    evidence.main[2] = 0.08  # 8% of a core with 30% demand
    assert computing(evidence, [0, 1, 2], since, allowance=POLLING) == [1, 2]
    assert computing(evidence, [0], since) == [0]  # the same 14% is computing for a rank waiting on its peers


def test_busy_since_progress_is_the_whole_process_cpu_and_never_looks():
    since = {0: a_second_ago(cpu=2.0), 1: a_second_ago(cpu=2.0), 2: a_second_ago(cpu=None)}
    evidence = Evidence(process={0: 2.3, 1: 2.1, 2: 9.0}, threads_runnable={1: True, 2: True})
    assert computing(evidence, [0, 1, 2], since, threads=True, allowance=BUSY) == [0]
    assert evidence.looks == 0


def test_a_proofs_look_at_every_thread_may_count_an_unanswered_look_as_running():
    evidence = Evidence(threads_runnable={0: None, 1: False, 2: True})
    assert computing(evidence, [0, 1], threads=True, looks=1) == []
    assert computing(evidence, [0, 1], threads=True, looks=1, unknown=True) == [0]
    assert evidence.looks == 4  # one look each
    assert computing(evidence, [1, 2], threads=True, first=True) == [2]
    assert computing(evidence, [1], threads=True) == [] and evidence.looks == 6 + activity.RUNNABLE_LOOKS
