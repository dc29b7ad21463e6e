"""Restart benchmark: a world killed mid-run and restarted from its last checkpoint vs the same world fault-free.

Run:  python bench/bench_restarts.py [--repeat 5] [--world-size 2] [--epochs 6] [--wide 1024]
The training is the built-in resume scenario's loop (``scenarios/scenario_resume.py``: DDP on a 4-16-1 MLP, a
shuffling DistributedSampler, a checkpoint after every step), or with ``--wide W`` a DDP MLP W wide (2.1M parameters
at 1024: ``worlds.wide_train``, 20 steps, a checkpoint every 5), fault-free on a warm world, and killed half-way
(``RankKilled`` on rank 1, ``max_restarts=1``); and the resume check (``check_resume``) of the killed run against
the cost of the two runs it compares, and against the same check without its file record (the audit hook's
listener removed in the ranks; both checks run through ``worlds.recorded``, one after the other, in an order that
alternates from repeat to repeat). Prints the medians and the ratios (the issues' bounds: a restarted world at most
1.5x the fault-free one; the check no more than the two runs; the file record at most 1.05x the check without it:
the median of each repeat's ratio, with the quartiles of those ratios), and what the audit hook costs an audit event
nobody listens to.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ddpfaults import run_world  # noqa: E402
from ddpfaults.faults import RankKilled  # noqa: E402
from ddpfaults.scenario import builtin_dir, load_function  # noqa: E402
from worlds import recorded, wide_train  # noqa: E402

TRAIN = load_function(os.path.join(builtin_dir(), "scenario_resume.py") + ":resume_train")


def timed(run, check) -> float:
    """Wall seconds of one world, which must pass ``check``."""
    started = time.perf_counter()
    result = run()
    assert check(result), result.report()
    return time.perf_counter() - started


def hook_cost() -> float:
    """Seconds the rank's audit hook takes on an ``open`` while no job listens (every open of a rank's process between
    and outside the check pays it), against a call of an empty function."""
    from ddpfaults.rank import files

    def empty(event, args):
        pass

    calls, args = 200_000, ("/tmp/x", "r", 0)
    times = []
    for hook in (files._hook, empty):
        started = time.perf_counter()
        for _ in range(calls):
            hook("open", args)
        times.append((time.perf_counter() - started) / calls)
    return max(times[0] - times[1], 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--wide", type=int, default=0, help="train worlds.wide_train this wide instead")
    args = parser.parse_args()
    n, kwargs = args.world_size, {"epochs": args.epochs, "samples": 64}
    steps = args.epochs * 64 // n // 4
    train = TRAIN
    if args.wide:
        train, kwargs, steps = wide_train, {"width": args.wide}, 20
    kill = [RankKilled(rank=1, step=steps // 2)]
    completed = lambda r: r.outcome == "completed"  # noqa: E731
    restarted = lambda r: completed(r) and len(r.attempts) == 2  # noqa: E731
    equivalent = lambda r: restarted(r) and r.resume["equivalent"]  # noqa: E731
    timed(lambda: run_world(train, world_size=n, kwargs=kwargs), completed)  # the fork server and a warm world
    free, killed, checked, bare = [], [], [], []
    for _ in range(args.repeat):  # interleaved, so every side sees the same machine load
        free.append(timed(lambda: run_world(train, world_size=n, kwargs=kwargs), completed))
        killed.append(
            timed(lambda: run_world(train, world_size=n, kwargs=kwargs, faults=kill, max_restarts=1), restarted)
        )
        arms = {
            record: lambda record=record: timed(
                lambda: run_world(
                    recorded,
                    world_size=n,
                    kwargs={"train": train, "recorded": record, **kwargs},
                    faults=kill,
                    max_restarts=1,
                    check_resume=True,
                ),
                equivalent,
            )
            for record in (True, False)
        }
        order = (True, False) if len(checked) % 2 == 0 else (False, True)  # neither always runs first
        times = {record: arms[record]() for record in order}
        checked.append(times[True])
        bare.append(times[False])
    base, cost, check = statistics.median(free), statistics.median(killed), statistics.median(checked)
    print(f"{n}-rank world, {steps} steps, fault-free (warm):           median {base:.3f} s over {args.repeat}")
    print(f"{n}-rank world killed at step {steps // 2}, restarted once:      median {cost:.3f} s over {args.repeat}")
    print(f"the killed world with the resume check (both runs): median {check:.3f} s over {args.repeat}")
    print(f"restarted / fault-free: {cost / base:.2f}x (bound: 1.5x); the restart's own cost: {cost - base:.3f} s")
    print(
        f"resume check / (fault-free + restarted): {check / (base + cost):.2f}x (bound: 1x); the check's own cost "
        f"(the capture in the ranks, the comparison): {check - base - cost:.3f} s"
    )
    ratios = sorted(c / b for c, b in zip(checked, bare, strict=True))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"the check with its file record / without it: {statistics.median(ratios):.3f}x, the median of {args.repeat} "
        f"repeats' ratios (bound: 1.05x; quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}x, range {ratios[0]:.3f}-"
        f"{ratios[-1]:.3f}x; medians with {check:.3f} s, without {statistics.median(bare):.3f} s)"
    )
    print(f"the audit hook on an event nobody listens to: {hook_cost() * 1e9:.0f} ns")
    restarts = sorted(k / f for f, k in zip(free, killed, strict=True))
    checks = sorted(c / (f + k) for f, k, c in zip(free, killed, checked, strict=True))
    print(
        f"per repeat (same round): restarted / fault-free {restarts[0]:.2f}-{restarts[-1]:.2f}x; "
        f"resume check / the two runs {checks[0]:.2f}-{checks[-1]:.2f}x"
    )


if __name__ == "__main__":
    main()
