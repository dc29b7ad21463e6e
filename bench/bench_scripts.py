"""Script-world benchmark: an unmodified torchrun script vs the same training as a cold ``run_world`` function.

Run:  python bench/bench_scripts.py [--repeat 5] [--world-size 4]
Both sides train the same model on the same data (``tests/support/scripts/plain_train.py`` and
``worlds.plain_train``) in fresh (cold) worlds; prints the medians and the script world's cost as a ratio of
the cold ``run_world`` world measured in the same run (the issue's bound: at most 2x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import worlds  # noqa: E402
from ddpfaults import run_script, run_world  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(HERE), "tests", "support", "scripts", "plain_train.py")


def timed(run) -> float:
    """Wall seconds of one world, which must complete."""
    started = time.perf_counter()
    result = run()
    assert result.outcome == "completed", result.report()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args()
    n = args.world_size
    timed(lambda: run_world(worlds.one_all_reduce, world_size=n, reuse=False))  # start the fork server first
    cold, script = [], []
    for _ in range(args.repeat):  # interleaved, so both sides see the same machine load
        cold.append(timed(lambda: run_world(worlds.plain_train, world_size=n, reuse=False)))
        script.append(timed(lambda: run_script(SCRIPT, world_size=n)))
    base, cost = statistics.median(cold), statistics.median(script)
    print(f"{n}-rank cold run_world world (plain_train): median {base:.3f} s over {args.repeat}")
    print(f"{n}-rank script world (plain_train.py):        median {cost:.3f} s over {args.repeat}")
    print(f"script world / cold run_world world: {cost / base:.2f}x (bound: 2x)")


if __name__ == "__main__":
    main()
