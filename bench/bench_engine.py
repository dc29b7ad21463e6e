"""Engine benchmark: 4-rank world start (forkserver vs spawn) and hang-verdict latency.

Run:  python bench/bench_engine.py [--repeat 5] [--world-size 4] [--stall 1.0]
Prints medians and ratios, each against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import worlds  # noqa: E402
from ddpfaults import run_world  # noqa: E402
from ddpfaults.faults import SkippedCollective  # noqa: E402


def time_start(method: str, world_size: int, repeat: int, reuse: bool = False) -> list[float]:
    """Wall time of run_world for a world doing init + one all_reduce, ``repeat`` times."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_world(worlds.one_all_reduce, world_size=world_size, start_method=method, reuse=reuse)
        times.append(time.perf_counter() - t0)
        assert result.outcome == "completed", result.report()
    return times


LAUNCHER_EVENTS = ("exited", "killed")  # recorded by the launcher, not progress of a rank


def hang_latency(world_size: int, stall: float, repeat: int) -> list[float]:
    """Seconds from the last progress event of any rank to the hang verdict."""
    latencies = []
    for _ in range(repeat):
        result = run_world(
            worlds.steps_of_all_reduce,
            world_size=world_size,
            stall=stall,
            reuse=False,
            faults=[SkippedCollective(rank=1, step=2)],
        )
        assert result.outcome == "hung", result.report()
        last = max(e["t"] for r in result.ranks for e in r.events if e["k"] not in LAUNCHER_EVENTS)
        latencies.append(result.elapsed - last)
    return latencies


def phases(world_size: int, repeat: int) -> list[float]:
    """Medians (s) of: last rank up, init (FileStore rendezvous + gloo connect mesh), fn, verdict, teardown."""
    rows = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_world(worlds.one_all_reduce, world_size=world_size, reuse=False)
        wall = time.perf_counter() - t0

        def first(rank, kind, **match):
            return next(e["t"] for e in rank.events if e["k"] == kind and all(e.get(k) == v for k, v in match.items()))

        up = max(first(r, "start") for r in result.ranks)
        init = max(first(r, "exit") for r in result.ranks) - min(
            first(r, "enter", op="init_process_group") for r in result.ranks
        )
        fn = max(first(r, "finished") for r in result.ranks) - max(first(r, "exit") for r in result.ranks)
        rows.append((up, init, fn, result.elapsed, wall - result.elapsed))
    return [statistics.median(column) for column in zip(*rows, strict=True)]


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--stall", type=float, default=1.0)
    args = parser.parse_args()
    n = args.world_size

    t0 = time.perf_counter()
    run_world(worlds.one_all_reduce, world_size=n, reuse=False)  # first world pays for starting the fork server
    first = time.perf_counter() - t0
    fork = time_start("forkserver", n, args.repeat)
    spawn = time_start("spawn", n, args.repeat)
    run_world(worlds.one_all_reduce, world_size=n, reuse=True)  # puts a warm world in the pool
    warm = time_start("forkserver", n, args.repeat, reuse=True)
    latency = hang_latency(n, args.stall, args.repeat)

    med_fork, med_spawn, med_warm = statistics.median(fork), statistics.median(spawn), statistics.median(warm)
    print(f"P1 {n}-rank world start to first all_reduce, end to end (median of {args.repeat}):")
    print(f"   warm world (reused)      {med_warm:.3f} s   [goal: overhead <= 0.020 s]")
    print(
        f"   forkserver, cold world   {med_fork:.3f} s   [goal <= 0.2 s]  first world incl. server start {first:.2f} s"
    )
    print(f"   spawn (baseline)         {med_spawn:.3f} s")
    print(f"   ratio spawn/forkserver   {med_spawn / med_fork:.1f}x   [goal >= 15x]")
    print(f"   ratio spawn/warm         {med_spawn / med_warm:.1f}x")
    print(f"   where a cold world's time goes (median of {args.repeat}, ms; torch is preloaded in the fork server):")
    for size in (n, 16, 64):
        up, init, fn, verdict, teardown = phases(size, args.repeat)
        print(
            f"     {size:3d} ranks: last rank forked+up {up * 1e3:6.1f} | init_process_group (rendezvous + gloo "
            f"mesh) {init * 1e3:6.1f} | fn {fn * 1e3:5.1f} | verdict at {verdict * 1e3:6.1f} | teardown "
            f"{teardown * 1e3:5.1f}"
        )
    print(f"P2 hang verdict latency after the last progress, stall={args.stall:g} s (median of {args.repeat}):")
    med_lat = statistics.median(latency)
    print(
        f"   {med_lat:.3f} s = {med_lat / args.stall:.2f}x the stall   [goal <= stall + 0.5 s]"
        f"   (max {max(latency):.3f} s)"
    )


if __name__ == "__main__":
    main()
