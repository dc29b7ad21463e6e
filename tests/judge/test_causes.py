"""Unit tests of ddpfaults.judge.causes and the verdict they decide: hand-built rank results (no processes)."""

from __future__ import annotations

import dataclasses

from ddpfaults.faults import Preempt, RankCrash, TornCheckpointWrite, TornDcpWrite, WriterKilledMidSave
from ddpfaults.judge.causes import common_error, find_cause, preemption, torn_file
from ddpfaults.judge.results import Cause, FiredFault, Outcome, RankResult, RankState, WorldResult
from ddpfaults.judge.verdict import decide, mark_collateral

CUDA = "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
CLOSED = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:8620"
DEVICE_IDS = "ValueError: ... got device_ids [{}], output_device None, and module parameters {{device(type='cpu')}}."
CHECKPOINT = "CheckpointException: CheckpointException ranks:dict_keys([0, 1, 2, 3])"


def raised(rank, error=CUDA, site="train.py:89 in main", step=0, **kw):
    return RankResult(rank, RankState.RAISED, error=error, site=site, last_step=step, failed_at=1.0 + rank, **kw)


def notice(rank, step=2, signal=None, index=0):
    fault = repr(Preempt(step=step))
    how = "SIGKILLed: still running" if signal else "sent SIGTERM"
    return FiredFault(index, fault, rank, step, how, effect="preempted", signal=signal)


def _decide(ranks, plan=()):
    mark_collateral(ranks)
    # fixed: a value handed to a pure function or refused before any world starts: no real time passes
    return decide(ranks, None, "ended", deadline=60, stall=5, cause=find_cause(ranks, plan))


# -- a common error --------------------------------------------------------------------------


def test_every_rank_raising_the_same_error_at_the_same_site_is_a_common_cause_with_no_culprit():
    for size in (2, 4):
        decision = _decide([raised(r) for r in range(size)])
        assert decision.outcome == Outcome.CRASHED and decision.root_rank is None
        assert decision.cause == Cause(
            "common_error", ranks=tuple(range(size)), error=CUDA, site="train.py:89 in main", step=0
        )
        assert decision.root_cause.startswith(f"every rank raised {CUDA} at train.py:89 in main at step 0")
        assert "no rank at fault" in decision.root_cause


def test_messages_that_differ_only_in_numbers_are_one_error_and_the_text_says_so():
    cause = common_error([raised(r, error=DEVICE_IDS.format(r)) for r in range(2)])
    assert cause is not None and cause.error == DEVICE_IDS.format(0)
    assert "differ only in numbers" in cause.describe()


def test_messages_that_differ_only_in_an_object_s_address_are_one_error():
    """Each rank's own object in the message: its address differs in hex letters too (seen as a flaky
    test_unpicklable_return_value_is_a_crash_naming_it, where ``0x...76b0`` and ``0x...7850`` made two errors)."""
    error = "UnpicklableReturnValue: rank {}: the function returned generator <generator object f at 0x7f88f6ed{}>"
    cause = common_error([raised(0, error=error.format(0, "76b0")), raised(1, error=error.format(1, "7850"))])
    assert cause is not None and cause.error == error.format(0, "76b0")
    assert common_error([raised(0, error="x at 0x7f"), raised(1, error="y at 0x7f")]) is None  # the words still count


def test_a_different_site_step_or_message_or_one_rank_not_raising_is_no_common_error():
    assert common_error([raised(0), raised(1, site="train.py:90 in main")]) is None
    assert common_error([raised(0), raised(1, step=1)]) is None
    assert common_error([raised(0), raised(1, error="KeyError: 'x'")]) is None
    assert common_error([raised(0), RankResult(1, RankState.BLOCKED)]) is None
    assert common_error([raised(0)]) is None  # one rank is the rank at fault
    ranks = [raised(0, error=CLOSED), raised(1, error=CLOSED)]
    mark_collateral(ranks)
    assert common_error(ranks) is None  # a consequence of something else


JOINED = [{"k": "enter", "seq": 0, "op": "init_process_group"}, {"k": "exit", "seq": 0}]
CONNECTING = [{"k": "enter", "seq": 0, "op": "init_process_group"}]
MESH = "RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer [127.0.0.1]:20124"


def test_a_rank_that_failed_connecting_as_the_others_exited_is_set_aside_from_their_common_error():
    # measured on a fresh clone beside 4 CPU hogs: ranks 0-2 joined and raised DDP's device_ids error; rank 3, still
    # inside gloo's connectFullMesh, failed when their processes exited
    ranks = [raised(r, error=DEVICE_IDS.format(r), events=JOINED) for r in range(3)]
    ranks.append(RankResult(3, RankState.RAISED, error=MESH, site="x.py:1 in f", failed_at=9.0, events=CONNECTING))
    decision = _decide(ranks)
    assert ranks[3].collateral
    assert decision.outcome == Outcome.CRASHED and decision.root_rank is None
    assert decision.cause.kind == "common_error" and decision.cause.ranks == (0, 1, 2)
    assert decision.cause.unreached == (3,)
    assert decision.root_cause.startswith(f"ranks 0-2 raised {DEVICE_IDS.format(0)} at train.py:89 in main at step 0")
    assert (
        "; rank 3 failed as a consequence, connecting to them as they exited, before it joined the process group: a "
        "common cause (the code or the environment), no rank at fault" in decision.root_cause
    )


def test_a_consequence_after_joining_or_one_rank_raising_alone_keeps_its_culprit():
    # a rank that joined and then failed as a consequence did get past where the others raised: it may be the
    # others' branch that raised (rank-0-only code), so the error is no common one
    after = RankResult(2, RankState.RAISED, error=CLOSED, site="x.py:1 in f", failed_at=9.0, events=JOINED)
    decision = _decide([raised(0, events=JOINED), raised(1, events=JOINED), after])
    assert decision.cause is None and decision.root_rank == 0
    # one rank raising, its one peer still connecting: one rank's error is no common one
    connecting = RankResult(1, RankState.RAISED, error=MESH, site="x.py:1 in f", failed_at=9.0, events=CONNECTING)
    decision = _decide([raised(0, events=JOINED), connecting])
    assert decision.cause is None and decision.root_rank == 0


def test_a_fault_on_some_ranks_only_is_no_common_error_but_one_on_every_rank_is():
    crash = FiredFault(0, "RankCrash(rank=1, step=0)", 1, 0, "on_step", effect="on_step")
    assert common_error([raised(0), raised(1, fired=[crash])]) is None
    both = [raised(r, fired=[dataclasses.replace(crash, rank=r)]) for r in range(2)]
    assert common_error(both) is not None


def test_a_checkpoint_exception_naming_the_failed_ranks_is_left_to_the_names():
    failed = {"k": "failed", "names": [1]}
    assert common_error([raised(r, error=CHECKPOINT, events=[failed]) for r in range(2)]) is None


# -- preemption -------------------------------------------------------------------------------


def test_every_rank_ended_by_the_notice_is_a_preemption_with_no_culprit():
    ranks = [
        RankResult(r, RankState.DIED, error="was killed by SIGTERM", exitcode=-15, fired=[notice(r)]) for r in range(4)
    ]
    decision = _decide(ranks)
    assert decision.outcome == Outcome.CRASHED and decision.root_rank is None
    assert decision.cause.kind == "preemption" and decision.cause.ranks == (0, 1, 2, 3)
    assert decision.root_cause == (
        "the job was preempted at step 2: Preempt(step=2, grace=5) sent the notice to every rank and ranks 0-3 "
        "were ended by it; no rank at fault"
    )


def test_the_grace_period_s_sigkill_a_handler_s_exit_and_a_peer_s_consequence_are_the_preemption_too():
    ranks = [
        RankResult(0, RankState.DIED, error="was killed by SIGKILL", fired=[notice(0), notice(0, signal="SIGKILL")]),
        RankResult(1, RankState.RAISED, error="SystemExit: 1", fired=[notice(1)]),
        RankResult(2, RankState.RAISED, error=CLOSED, fired=[notice(2)]),
    ]
    decision = _decide(ranks)
    assert decision.root_rank is None and decision.cause.kind == "preemption"
    assert "rank 1 was ended by it, rank 0 outlived the grace period and was SIGKILLed, rank 2 failed as a " in (
        decision.root_cause
    )


def test_a_preemption_of_some_ranks_or_a_rank_s_own_error_after_the_notice_is_no_preemption_cause():
    died = [RankResult(r, RankState.DIED, error="was killed by SIGTERM", fired=[notice(r)]) for r in range(2)]
    assert preemption([died[0], RankResult(1, RankState.DIED, error="was killed by SIGTERM")]) is None
    own = [died[0], RankResult(1, RankState.RAISED, error="KeyError: 'x'", fired=[notice(1)])]
    mark_collateral(own)
    assert preemption(own) is None  # its handler's own error is the rank's
    handled = [RankResult(r, RankState.FINISHED, fired=[notice(r)]) for r in range(2)]
    assert preemption(handled) is None
    assert _decide(handled).outcome == Outcome.COMPLETED


# -- a torn file ------------------------------------------------------------------------------


def test_a_torn_file_names_its_writer_not_the_first_rank_the_checkpoint_exception_names():
    plan = [TornDcpWrite(writer=2, step=1)]
    tore = FiredFault(0, repr(plan[0]), 2, 1, "tore __2_0.distcp to 100 of 200 bytes", effect="checkpoint")
    failed = {"k": "failed", "names": [0, 1, 2, 3]}
    ranks = [raised(r, error=CHECKPOINT, step=1, events=[failed], fired=[tore] if r == 2 else []) for r in range(4)]
    decision = _decide(ranks, plan)
    assert decision.root_rank == 2 and decision.cause.kind == "torn_file" and decision.cause.ranks == (2,)
    assert decision.root_cause.startswith("rank 2 wrote a torn file at step 1 (TornDcpWrite(writer=2, step=1): tore")
    assert "names ranks 0-3 as failed" in decision.root_cause
    assert _decide(ranks).root_rank == 0  # without the plan: the first rank the exception names
    killed = [TornDcpWrite(writer=2, step=1, killed=True)]
    assert torn_file(ranks, killed) is None  # a killed writer is named by its death
    other = [RankCrash(rank=2, step=1)]
    assert torn_file(ranks, other) is None


def test_a_file_an_earlier_attempt_tore_names_its_writer_from_that_attempts_record():
    plan = [TornDcpWrite(writer=1, step=2), RankCrash(rank=0, step=3)]
    tore = FiredFault(0, repr(plan[0]), 1, 2, "tore __1_0.distcp to 100 of 200 bytes", effect="checkpoint")
    failed = {"k": "failed", "names": [0, 1]}
    restarted = [raised(r, error=CHECKPOINT, step=3, events=[failed]) for r in range(2)]  # nothing fired in it
    assert torn_file(restarted, plan) is None
    cause = torn_file(restarted, plan, before=(tore,), attempt=0)
    assert (cause.kind, cause.culprit, cause.step) == ("torn_file", 1, 2)
    assert "in attempt 0, before the restart: tore __1_0.distcp" in cause.describe()


def test_a_checkpoint_an_earlier_attempt_cut_that_every_rank_then_failed_reading_names_its_writer():
    """A plain ``torch.save``/``open`` checkpoint: no exception names ranks; the record does. Rank 0 was killed mid-save
    of ``ckpt.pt`` in attempt 0 (its fired record's ``file``); in attempt 1 both ranks read it and raised the same error
    (a common error, taken alone)."""
    plan = [WriterKilledMidSave(writer=0, step=6)]
    cut = FiredFault(
        0, repr(plan[0]), 0, 6, "SIGKILLed the writer mid-save of ckpt.pt", "checkpoint", file="/c/ckpt.pt"
    )
    read = {"k": "file", "how": "read", "path": "/c/ckpt.pt", "size": 100}
    other = {"k": "file", "how": "read", "path": "/c/latest", "size": 8}
    restarted = [raised(r, error="ValueError: negative seek value -1593", events=[other, read]) for r in range(2)]
    cause = torn_file(restarted, plan, before=(cut,), attempt=0)
    assert (cause.kind, cause.culprit, cause.ranks, cause.step) == ("torn_file", 0, (0,), 6)
    assert cause.describe() == (
        "rank 0 wrote a torn file at step 6 (WriterKilledMidSave(writer=0, step=6): in attempt 0, before the restart: "
        "SIGKILLed the writer mid-save of ckpt.pt); ranks 0, 1 read /c/ckpt.pt and raised ValueError: negative seek "
        "value -1593"
    )
    assert torn_file(restarted, plan) is None  # the cut is an earlier attempt's evidence only
    one_did_not_read = [restarted[0], raised(1, error="ValueError: negative seek value -1593", events=[other])]
    assert torn_file(one_did_not_read, plan, before=(cut,), attempt=0) is None
    assert torn_file(restarted, plan, before=(dataclasses.replace(cut, file=None),), attempt=0) is None


def test_readers_that_raised_on_a_file_the_writer_held_torn_in_this_run_name_the_writer():
    """``TornCheckpointWrite`` in one attempt: its records on the writer (the file it held torn) and on each reader
    that read it so; the ranks that raised all read it: the writer is the cause. A reader's own record is no writer's:
    it names no reader, also as an earlier attempt's evidence."""
    plan = [TornCheckpointWrite(writer=0, step=2)]
    held = "held the writer of ckpt.pt with 50 of 100 bytes on disk (/c/ckpt.pt) until every reader had moved on"
    writer = FiredFault(0, repr(plan[0]), 0, 2, held, "checkpoint", file="/c/ckpt.pt")
    read = [FiredFault(0, repr(plan[0]), r, 2, "read ckpt.pt with 50 of 100 bytes", "checkpoint", file="/c/ckpt.pt")
            for r in (1, 2, 3)]  # fmt: skip
    error = "OSError: [Errno 22] Invalid argument"
    ranks = [RankResult(0, RankState.FINISHED, fired=[writer])]
    ranks += [raised(r, error=error, site="train.py:39 in train", step=2, fired=[read[r - 1]]) for r in (1, 2, 3)]
    cause = torn_file(ranks, plan)
    assert (cause.kind, cause.culprit, cause.ranks, cause.step) == ("torn_file", 0, (0,), 2)
    assert cause.describe().endswith(f"; ranks 1-3 read /c/ckpt.pt and raised {error}"), cause.describe()
    assert _decide(ranks, plan).root_rank == 0
    one_raised_elsewhere = [*ranks[:3], raised(3, error=error, site="train.py:39 in train", step=2)]
    assert torn_file(one_raised_elsewhere, plan) is None  # rank 3 read nothing torn: not explained
    readers_only = [r if r.rank else RankResult(0, RankState.FINISHED) for r in ranks]
    assert torn_file(readers_only, plan) is None  # no writer's record: nobody tore it
    assert torn_file(ranks[1:], plan, before=tuple(read), attempt=0) is None  # readers' records name no writer


def test_a_cause_round_trips_through_the_report_document():
    cause = Cause("common_error", ranks=(0, 1), error=CUDA, site="train.py:89 in main", step=0, unreached=(2,))
    world = WorldResult(Outcome.CRASHED, [raised(0), raised(1)], cause.describe(), None, "ended", 1.0, cause=cause)
    again = WorldResult.from_dict(world.to_dict())
    assert again.cause == cause
    assert WorldResult.from_dict({**world.to_dict(), "cause": None}).cause is None


# -- a signal from outside the world ------------------------------------------------------------


def died(rank, exitcode=-15, **kw):
    return RankResult(rank, RankState.DIED, exitcode=exitcode, error="was killed by SIGTERM", failed_at=1.0, **kw)


def test_a_termination_signal_no_fault_sent_names_no_rank_and_its_peers_are_a_consequence():
    for size in (2, 4):
        ranks = [died(0)] + [raised(r, error=CLOSED) for r in range(1, size)]
        decision = _decide(ranks)
        assert decision.outcome == Outcome.CRASHED and decision.root_rank is None
        assert decision.cause == Cause("outside_signal", ranks=(0,), error="SIGTERM", how=decision.cause.how)
        assert decision.root_cause.startswith("rank 0 was ended by SIGTERM from outside the world")
        assert decision.root_cause.endswith("failed as a consequence; no rank at fault")


def test_a_handlers_system_exit_and_ctrl_c_count_as_the_signal():
    term = [raised(r, error="SystemExit: 143", site="", step=1) for r in range(2)]
    assert find_cause(term).kind == "outside_signal" and find_cause(term).error == "SIGTERM"
    interrupted = [raised(0, error="KeyboardInterrupt", step=1), died(1, exitcode=-2)]
    assert find_cause(interrupted).error == "SIGINT" and find_cause(interrupted).ranks == (0, 1)


def test_a_signal_a_fault_sent_a_lone_sigkill_or_a_rank_failing_on_its_own_is_no_outside_signal():
    from ddpfaults.faults import RankKilled

    killed = RankKilled(rank=0, step=1, signal=15)
    fired = FiredFault(0, repr(killed), 0, 1, "killed", effect="on_step", signal="SIGTERM")
    assert find_cause([died(0, fired=[fired]), raised(1, error=CLOSED)], [killed]) is None
    assert find_cause([died(0, exitcode=-9), raised(1, error=CLOSED)]) is None  # the OOM killer's, as likely
    assert find_cause([died(0, exitcode=-9), died(1, exitcode=-9)]).error == "SIGKILL"  # a grace period's end
    assert find_cause([died(0), raised(1, error="KeyError: 'mask'")]) is None  # rank 1 failed on its own
    assert find_cause([died(0), died(1, exitcode=-6)]) is None  # SIGABRT: a crash inside the rank
    assert find_cause([died(0), died(1, exitcode=-2)]) is None  # two signals: no one stop of the job
