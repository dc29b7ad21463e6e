"""ddpfaults.remedies.on_rank0 in real gloo worlds: one rank acts, every rank returns or raises its outcome."""

import os
import threading

import torch.distributed as dist

from ddpfaults import remedies, run_world


def _mark(directory, rank):
    """Make a file named after the rank that runs it; return the directory's listing."""
    open(os.path.join(directory, f"ran-on-{rank}"), "w").close()
    return sorted(os.listdir(directory))


def _mkdir(path):
    """os.makedirs without exist_ok: raises FileExistsError if ``path`` exists."""
    os.makedirs(path)


def _unpicklable():
    """Raise an exception carrying a lock (which cannot be pickled)."""
    raise ValueError(threading.Lock())


def share(ctx, src, what):
    """Every rank calls on_rank0 with ``src``; ``what`` picks the function rank ``src`` runs."""
    if what == "mark":
        return remedies.on_rank0(_mark, ctx.shared_dir, dist.get_rank(), src=src)
    if what == "mkdir":
        os.makedirs(os.path.join(ctx.shared_dir, "ckpt"), exist_ok=True)
        dist.barrier()
        return remedies.on_rank0(_mkdir, os.path.join(ctx.shared_dir, "ckpt"), src=src)
    return remedies.on_rank0(_unpicklable, src=src)


def share_in_group(ctx):
    """Ranks 1 and 2 form a group; its rank 1 (global rank 2) runs the function; rank 0 stays out."""
    group = dist.new_group([1, 2])
    if ctx.rank == 0:
        return None
    return remedies.on_rank0(_mark, ctx.shared_dir, dist.get_rank(), src=1, group=group)


def test_only_src_runs_the_function_and_every_rank_returns_its_result():
    result = run_world(share, world_size=3, kwargs={"src": 1, "what": "mark"})
    assert result.outcome == "completed", result.report()
    assert result.values == [["ran-on-1"]] * 3


def test_src_error_is_raised_on_every_rank_even_when_failed_ranks_linger():
    result = run_world(share, world_size=3, kwargs={"src": 0, "what": "mkdir"}, peer_failure="linger")
    assert result.outcome == "crashed", result.report()
    assert result.root_rank == 0, result.report()
    assert all((r.error or "").startswith("FileExistsError: [Errno 17] File exists") for r in result.ranks), [
        r.error for r in result.ranks
    ]


def test_an_unpicklable_error_reaches_the_peers_as_a_runtime_error_naming_it():
    result = run_world(share, world_size=2, kwargs={"src": 0, "what": "unpicklable"})
    assert result.outcome == "crashed", result.report()
    assert result.ranks[0].error.startswith("ValueError: <unlocked _thread.lock"), result.ranks[0].error
    assert result.ranks[1].error.startswith("RuntimeError: ValueError: <unlocked _thread.lock"), result.ranks[1].error


def test_src_is_a_rank_of_the_group():
    result = run_world(share_in_group, world_size=3)
    assert result.outcome == "completed", result.report()
    assert result.values == [None, ["ran-on-2"], ["ran-on-2"]]
