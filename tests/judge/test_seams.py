"""Unit tests of ddpfaults.judge.seams and the never-fired hint it gives: hand-built rank results."""

from ddpfaults.faults import DeviceMismatch, EmptyBatch, RankCrash, SkippedCollective, TornDcpWrite
from ddpfaults.judge import seams
from ddpfaults.judge.results import Collective, RankResult, RankState
from ddpfaults.judge.verdict import unfired_faults


def finished(rank, events=(), makers=(), wrapped=()):
    calls = [Collective(i + 1, "all_reduce", [[4]], "t.py:3 in f", 1, maker=m) for i, m in enumerate(makers)]
    return RankResult(
        rank,
        RankState.FINISHED,
        events=list(events),
        collectives=calls,
        wrapped=[{"kind": k} for k in wrapped],
    )


STEP = {"k": "step", "step": 1, "clock": "optimizer"}


def test_the_seams_used_are_read_from_events_collectives_and_wrapped_modules():
    assert seams.used([finished(0)]) == []
    assert seams.used([finished(0, [STEP], ["ddp_bucket"], ["ddp"])]) == ["ddp", "optimizer"]
    loader = finished(1, [{"k": "batch", "index": 0}, {"k": "saved", "step": 1}], ["user", "dcp", "fsdp_all_gather"])
    assert seams.used([finished(0, [STEP]), loader]) == [
        "dataloader",
        "fsdp",
        "torch_save",
        "dcp",
        "collectives",
        "optimizer",
    ]


def test_a_data_fault_on_ranks_that_drew_no_dataloader_batch_names_the_seams_they_did_use():
    ranks = [finished(r, [STEP], ["ddp_bucket"], ["ddp"]) for r in range(2)]
    (unfired,) = unfired_faults([EmptyBatch(rank=1, step=1)], ranks, [])
    assert unfired.finished == (1,)
    assert unfired.hint == (
        "it acts through batches drawn from a DataLoader, which the ranks it targets never used (the seams they "
        "used: DistributedDataParallel, optimizer steps)"
    )
    assert (
        "the seams they used: none ddpfaults sees"
        in unfired_faults([EmptyBatch(rank=0, step=1)], [finished(0)], [])[0].hint
    )


def test_a_fault_whose_seam_was_used_or_that_has_none_keeps_its_own_hint():
    loader = [finished(r, [{"k": "batch", "index": 0}, STEP]) for r in range(2)]
    assert unfired_faults([EmptyBatch(rank=1, step=1)], loader, [])[0].hint == ""
    ranks = [finished(r, [STEP], ["ddp_bucket"], ["ddp"]) for r in range(2)]
    assert unfired_faults([DeviceMismatch()], ranks, [])[0].hint == ""
    skipped = unfired_faults([SkippedCollective(rank=1, step=1)], ranks, [])[0].hint
    assert skipped.startswith("its step's only collectives were DDP's gradient-bucket all_reduces")
    assert unfired_faults([RankCrash(rank=1, step=9)], ranks, [])[0].hint == ""
    assert (
        "DCP (dcp.save, dcp.load), which the ranks"
        in unfired_faults([TornDcpWrite(writer=1, step=1)], ranks, [])[0].hint
    )
