"""P4: big worlds on a small machine: init + a few DDP steps on the toy model + verdict.

Run:  python bench/bench_scale.py [--sizes 4 64 200] [--steps 3] [--stall 2] [--runs N] [--timeout 300]
For each world size prints wall time and the peak total memory of all rank processes, measured
as the sum of their PSS (proportional set size: pages shared copy-on-write with the fork server
are split between the processes that share them, so the sum is real memory) sampled every 20 ms;
RSS sums (which count shared pages once per process) are printed alongside. Cold worlds
(no reuse). The first world pays the fork server start and is reported separately. The stall window is the
default (2 s): a big world's slow rendezvous must not be taken for a hang, nor a rank starved of CPU (256 ranks
on 2 cores get a few ms each per second) for a rank waiting on its peers. ``--runs N`` runs each size N times and
prints how many worlds got each verdict (every one is healthy: any verdict but completed is a false one, printed
with its reason and where its ranks stood). ``--rank-memory MiB`` sets the capacity check's memory budget per rank
for this run only (default 64 MiB: room for a user's model; the toy rank here uses 5-9 MiB of PSS at 256 ranks,
20-90 MiB at 2 and 4, where the fork server's shared pages are split among fewer processes), so that a world larger
than the check admits on this machine (512 ranks on 24 GiB) can be measured.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import worlds  # noqa: E402
from ddpfaults import run_world  # noqa: E402
from ddpfaults.engine import capacity, census  # noqa: E402
from ddpfaults.spec import PARAM  # noqa: E402


def _memory_kib(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of a process in KiB; zeros if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[-1] == "kB"}
        return fields.get("Pss", 0), fields.get("Rss", 0)
    except (OSError, ValueError, IndexError):
        return 0, 0


class PeakMemory:
    """Samples the summed memory of every rank process this launcher has started (and their children).

    A sample of 256 ranks' ``smaps_rollup`` takes about 0.5 s of kernel time on this machine (a torch process maps
    thousands of regions), so the sampler sleeps four times as long as its last sample took (at least 20 ms): it
    takes at most a fifth of a core from the world it measures. ``cpu`` is the CPU time it used."""

    def __init__(self):
        self.peak_pss = self.peak_rss = 0
        self.cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            started = time.perf_counter()
            pids = [pid for pid, _ in census.survivors()]
            pss = rss = 0
            for pid in pids:
                p, r = _memory_kib(pid)
                pss, rss = pss + p, rss + r
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.cpu = time.thread_time()
            self._stop.wait(max(0.02, 4 * (time.perf_counter() - started)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main() -> None:
    """Run the scale benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 32, 64])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stall", type=float, default=PARAM["stall"].default)
    parser.add_argument("--runs", type=int, default=1, help="worlds of each size (default 1)")
    parser.add_argument("--timeout", type=float, default=300, help="each world's timeout, s (default 300)")
    parser.add_argument(
        "--rank-memory",
        type=int,
        default=capacity.RANK_MEMORY // 2**20,
        help=f"the capacity check's memory per rank for this run, MiB (default {capacity.RANK_MEMORY // 2**20})",
    )
    args = parser.parse_args()
    if args.rank_memory * 2**20 != capacity.RANK_MEMORY:
        print(f"capacity check: {args.rank_memory} MiB per rank for this run (default {capacity.RANK_MEMORY // 2**20})")
        capacity.RANK_MEMORY = args.rank_memory * 2**20
    t0 = time.perf_counter()
    run_world(worlds.one_all_reduce, world_size=2, reuse=False)
    print(f"(fork server start, paid once: {time.perf_counter() - t0:.2f} s)")
    print(
        f"P4 world of N ranks on {os.cpu_count()} cores: init + {args.steps} DDP steps (MLP) + verdict, cold, "
        f"stall {args.stall:g} s"
    )
    print(
        f"{'ranks':>6}  {'wall s':>7}  {'s/rank':>7}  {'peak PSS GiB':>12}  {'PSS MiB/rank':>12}  "
        f"{'judge CPU s':>11}  {'sampler CPU s':>13}  verdict"
    )
    for n in args.sizes:
        verdicts = collections.Counter()
        for _ in range(args.runs):
            verdicts[_one_world(n, args)] += 1
        if args.runs > 1:
            counted = ", ".join(f"{count} {outcome}" for outcome, count in verdicts.most_common())
            print(f"{n} ranks, {args.runs} runs: {counted}")
    print("goal for 64 ranks: <= 20 s and <= 12 GiB")


def _one_world(n: int, args) -> str:
    """Run one healthy world of ``n`` ranks; print its row (and, for a false verdict, why); return its outcome."""
    with PeakMemory() as memory:
        t0, cpu0 = time.perf_counter(), time.process_time()
        result = run_world(
            worlds.ddp_steps,
            world_size=n,
            kwargs={"steps": args.steps},
            timeout=args.timeout,
            stall=args.stall,
            startup=args.timeout,
            reuse=False,
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    judge_cpu = cpu - memory.cpu  # this process's CPU but the sampler's: the launcher and its judge loop
    print(
        f"{n:>6}  {wall:>7.2f}  {wall / n:>7.3f}  {memory.peak_pss / 2**20:>12.2f}  "
        f"{memory.peak_pss / 2**10 / n:>12.1f}  {judge_cpu:>11.2f}  {memory.cpu:>13.2f}  "
        f"{result.outcome}  {result.root_cause[:80]}",
        flush=True,
    )
    if result.outcome != "completed":
        states = collections.Counter(f"{r.state}: {r.where}" for r in result.ranks)
        print(f"    reason: {result.reason}")
        for where, count in states.most_common(8):
            print(f"    {count:>4} ranks {where}")
    return str(result.outcome)


if __name__ == "__main__":
    main()
