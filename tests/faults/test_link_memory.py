"""Unit tests of OutOfMemory, SlowLink and DroppedLink (values; their effects in isolation, in a child process)."""

import math
import subprocess
import sys
import textwrap

import pytest

import ddpfaults.faults
from ddpfaults.errors import FaultArgumentError, FaultError
from ddpfaults.faults import (
    DroppedLink,
    OutOfMemory,
    RankCrash,
    SkippedCollective,
    SlowLink,
    Straggler,
    check_faults,
)
from ddpfaults.faults.base import check_plan
from ddpfaults.faults.plan import parse_plan
from processes import EVENT_GUARD

FAULTS = [
    OutOfMemory(rank=1, step=2),
    OutOfMemory(rank=[0, 2], step=[3, 1]),
    SlowLink(rank=1, step=1, delay=0.5),
    SlowLink(rank=0, step=[1, 2], op="ddp_bucket", delay=2),
    DroppedLink(rank=2, step=1),
    DroppedLink(rank=1, step=0, op="all_reduce"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=repr)
def test_repr_rebuilds_the_fault_and_the_cli_parses_it(fault):
    rebuilt = eval(repr(fault), vars(ddpfaults.faults))
    assert rebuilt == fault and hash(rebuilt) == hash(fault)
    assert parse_plan(f"[{fault!r}]") == [fault]
    assert check_faults([fault], 4) == (fault,)


def test_repr_examples():
    assert repr(OutOfMemory(rank=1, step=2)) == "OutOfMemory(rank=1, step=2)"
    assert repr(SlowLink(rank=1, step=1, op="all_reduce", delay=1)) == (
        "SlowLink(rank=1, step=1, op='all_reduce', delay=1.0)"
    )
    assert repr(DroppedLink(rank=1, step=[2, 1])) == "DroppedLink(rank=1, step=[1, 2])"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: OutOfMemory(rank=1), "OutOfMemory: missing a required argument: 'step'"),
        (lambda: OutOfMemory(step=1), "OutOfMemory: missing a required argument: 'rank'"),
        (lambda: DroppedLink(rank=1), "DroppedLink: missing a required argument: 'step'"),
        (lambda: SlowLink(rank=1, step=1, delay=0), "SlowLink: delay must be a positive finite number"),
        (lambda: SlowLink(rank=1, step=1, delay=-1.0), "got -1.0"),
        (lambda: SlowLink(rank=1, step=1, delay=math.inf), "got inf"),
        (lambda: SlowLink(rank=1, step=1, delay=math.nan), "got nan"),
        (lambda: SlowLink(rank=1, step=1, delay=True), "got True"),
        (lambda: SlowLink(rank=1, step=1, delay="1"), "got '1'"),
        (lambda: SlowLink(rank=1, step=1, op="allreduce", delay=1), "SlowLink: op must be None, 'ddp_bucket'"),
        (lambda: DroppedLink(rank=1, step=1, op="ddp"), "DroppedLink: op must be None, 'ddp_bucket'"),
    ],
)
def test_invalid_values_raise_fault_error_naming_the_fault(make, message):
    with pytest.raises(FaultError) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: OutOfMemory(1, 2), "OutOfMemory"),
        (lambda: SlowLink(rank=1, step=1), "SlowLink"),
        (lambda: DroppedLink(rank=1, step=1, delay=1), "DroppedLink"),
    ],
)
def test_positional_unknown_or_missing_arguments_are_fault_argument_errors(make, name):
    with pytest.raises(FaultArgumentError, match=f"^{name}: .*keyword-only"):
        make()


@pytest.mark.parametrize("fault", [OutOfMemory(rank=3, step=1), SlowLink(rank=3, step=1, delay=1)], ids=repr)
def test_a_rank_beyond_the_world_is_refused(fault):
    with pytest.raises(FaultError, match="rank 3 does not exist in a world of 3 ranks"):
        check_faults([fault], 3)


@pytest.mark.parametrize(
    "first, second, why",
    [
        (OutOfMemory(rank=1, step=1), OutOfMemory(rank=1, step=1), "both limit the address space"),
        (RankCrash(rank=1, step=1), OutOfMemory(rank=1, step=1), "RankCrash ends the rank"),
        (DroppedLink(rank=1, step=1), DroppedLink(rank=1, step=1, op="all_reduce"), "both drop the links"),
        (SkippedCollective(rank=1, step=1, op="ddp_bucket"), SlowLink(rank=1, step=1, op="ddp_bucket", delay=1), ""),
        (SkippedCollective(rank=1, step=1), DroppedLink(rank=1, step=1, op="barrier"), "the skip would swallow it"),
    ],
)
def test_faults_that_cannot_both_act_conflict(first, second, why):
    with pytest.raises(FaultError, match="conflict on rank 1 at step 1") as info:
        check_plan([first, second])
    assert why in str(info.value)


@pytest.mark.parametrize(
    "first, second",
    [
        (SlowLink(rank=1, step=1, delay=1), SlowLink(rank=1, step=1, delay=2)),  # two delays add up
        (SkippedCollective(rank=1, step=1), DroppedLink(rank=1, step=1, op="ddp_bucket")),
        (DroppedLink(rank=1, step=1), DroppedLink(rank=1, step=2)),
        (OutOfMemory(rank=1, step=1), SlowLink(rank=1, step=1, delay=1)),
        (OutOfMemory(rank=1, step=1), Straggler(rank=1, step=1, seconds=1)),
    ],
)
def test_faults_that_compose_are_accepted(first, second):
    assert check_plan([first, second]) == (first, second)


class _Ctx:
    """The part of a rank context a link fault uses: ``once`` per (fault, step)."""

    def __init__(self):
        self.seen = set()

    def once(self, fault):
        key = id(fault)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def test_a_slow_link_acts_once_on_its_op_only():
    slow = SlowLink(rank=0, step=0, op="all_reduce", delay=0.01)
    ctx = _Ctx()
    assert slow.before_collective(ctx, "broadcast") is None
    assert slow.before_collective(ctx, "ddp_bucket") is None
    assert slow.before_collective(ctx, "all_reduce") == "held all_reduce back 0.01 s"
    assert slow.before_collective(ctx, "all_reduce") is None
    anything = SlowLink(rank=0, step=0, delay=0.01)
    assert anything.before_collective(_Ctx(), "ddp_bucket") is None
    assert anything.before_collective(_Ctx(), "barrier") == "held barrier back 0.01 s"


def test_only_bucket_link_faults_ask_for_the_comm_hook_on_their_ranks():
    assert DroppedLink(rank=1, step=1, op="ddp_bucket").acts_on_ddp_buckets(1)
    assert not DroppedLink(rank=1, step=1, op="ddp_bucket").acts_on_ddp_buckets(0)
    assert not SlowLink(rank=1, step=1, delay=1).acts_on_ddp_buckets(1)


def _child(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=EVENT_GUARD
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_memory_limit_fails_the_next_large_allocation_and_is_lifted():
    out = _child(
        """
        import numpy, torch
        from ddpfaults.rank import memory
        print(memory.limit(32 * 2**20))
        for make in (lambda: torch.empty(16 * 2**20), lambda: numpy.empty(8 * 2**20)):
            try:
                make()
                print("allocated")
            except BaseException as exc:
                print(type(exc).__name__, exc)
        small = torch.ones(1000)  # small allocations still succeed
        memory.restore()
        torch.empty(16 * 2**20)
        print("after restore: allocated")
        """
    )
    lines = out.splitlines()
    assert lines[0].startswith("limited the address space to ") and "(32 MiB above use)" in lines[0]
    assert lines[1].startswith("RuntimeError") and "DefaultCPUAllocator: can't allocate memory" in lines[1]
    assert lines[2].startswith("MemoryError")
    assert lines[3] == "after restore: allocated"


def test_dropping_the_links_ends_every_tcp_connection_of_the_process():
    out = _child(
        """
        import socket
        from ddpfaults.rank import links
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        print(sorted(links.gloo_sockets()) == sorted([client.fileno(), accepted.fileno()]))
        print(links.drop_all())
        print(client.recv(1) == b"" and accepted.recv(1) == b"")
        print(links.gloo_sockets() == [] or links.gloo_sockets())
        """
    )
    assert out.split() == ["True", "2", "True", "True"]
