"""P8: how long after a deadlock forms the verdict comes, proved from the record vs found by the stall rule.

Run:  python bench/bench_proof.py [--repeat 3] [-k pipeline_microbatches -k empty_batch ...]
Runs every built-in variant expected to hang (``python -m ddpfaults matrix`` lists them; ``-k``: those whose id
contains one of the given pieces) at the default stall
window (2 s, whatever the variant declares), alternately with the judge's deadlock proof on (the default) and off
(the private switch ``ddpfaults.judge.live.loop._PROVE``, this benchmark's only), and prints per case the seconds from
the deadlock forming to the verdict, each mode's median, and the ratio. Goal: <= 0.1 s with the proof.

The deadlock *forms* when the last rank takes its stand (``ddpfaults.judge.checks.fidelity.formed_at``, the soak's
measure too: entering the collective it waits in, finishing, failing, or for a collective only torch's flight
recorder saw, plain DDP's gradient buckets, when it issued it); measured the same way for both modes, from each
rank's own events and record, on the clock the verdict is stamped with. A variant the record cannot prove (e.g. two
ranks in one all_reduce of different sizes, or a broadcast whose root the record does not name) is judged by the
stall rule in both modes; it is listed as such.

Point-to-point deadlocks (the pipeline whose stage sends one microbatch fewer: the ranks wait in blocking sends and
receives, proved from each pair's message counts) are summed up apart, against the collective proofs of the same run
as their baseline (the machine's load average is printed beside: the latency is mostly the judge's polls and the
ranks' stack dumps, which a loaded machine delays).
"""

from __future__ import annotations

import argparse
import os
import statistics

from ddpfaults.judge.checks.fidelity import verdict_latency
from ddpfaults.judge.live import loop
from ddpfaults.judge.results import Outcome
from ddpfaults.scenario import discover
from ddpfaults.spec import PARAM, RunSpec

DEFAULT_STALL = PARAM["stall"].default
GOAL = 0.1
#: the built-in families whose deadlock is point-to-point (blocking sends and receives, no collective)
POINT_TO_POINT = ("pipeline_microbatches[",)


def run(case, prove: bool):
    """One run of ``case`` at the default stall window, the proof on or off."""
    loop._PROVE = prove
    try:
        return case.run(RunSpec(), fit=lambda spec: spec.replace(stall=DEFAULT_STALL))
    finally:
        loop._PROVE = True


def main() -> None:
    """Run the deadlock-proof latency benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("-k", dest="only", action="append", default=[], help="run the cases whose id contains this")
    args = parser.parse_args()
    cases = [c for c in discover() if c.expect.outcome == Outcome.HUNG]
    cases = [c for c in cases if not args.only or any(piece in c.id for piece in args.only)]
    load = os.getloadavg()[0]
    rows = []
    for case in cases:
        proved, stalled, reasons = [], [], set()
        for _ in range(args.repeat):
            on, off = run(case, True), run(case, False)
            for result in (on, off):
                if result.outcome != Outcome.HUNG:
                    raise SystemExit(f"{case.id}: expected hung, observed {result.outcome}: {result.root_cause}")
            proved.append(verdict_latency(on))
            stalled.append(verdict_latency(off))
            reasons.add("proof" if on.reason.startswith("deadlock proved") else "stall rule")
        how = "/".join(sorted(reasons)) + (" (p2p)" if case.id.startswith(POINT_TO_POINT) else "")
        rows.append((case.id, how, statistics.median(proved), statistics.median(stalled)))
    print(
        f"P8 deadlock to verdict over the built-in hung variants, stall {DEFAULT_STALL:g} s, medians of {args.repeat}"
    )
    print(f"   {'case':48} {'judged by':12} {'proof on':>9} {'proof off':>10} {'ratio':>7}")
    for name, how, on, off in rows:
        print(f"   {name:48} {how:12} {on:8.3f}s {off:9.3f}s {off / on:6.1f}x")
    provable = [r for r in rows if r[1].startswith("proof")]
    for label, chosen in (("proved", provable), ("every hung variant", rows)):
        if not chosen:
            continue
        on = statistics.median(r[2] for r in chosen)
        off = statistics.median(r[3] for r in chosen)
        worst = max(r[2] for r in chosen)
        print(
            f"   {label} ({len(chosen)} of {len(rows)}): median {on:.3f} s with the proof (max {worst:.3f} s) vs "
            f"{off:.3f} s by the stall rule alone: {off / on:.1f}x faster   [goal <= {GOAL:g} s]"
        )
    p2p = [r for r in rows if r[1] == "proof (p2p)"]
    collective = [r for r in rows if r[1] == "proof"]
    if p2p and collective:
        on, base = statistics.median(r[2] for r in p2p), statistics.median(r[2] for r in collective)
        print(
            f"   point-to-point proofs ({len(p2p)}): median {on:.3f} s from the last rank's wait to the verdict (max "
            f"{max(r[2] for r in p2p):.3f} s) vs {base:.3f} s for the collective proofs ({len(collective)}) of this "
            f"run: {on / base:.2f}x   [goal <= {GOAL:g} s; load average {load:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end]"
        )


if __name__ == "__main__":
    main()
