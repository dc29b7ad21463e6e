"""The resume check's copy of a script's working directory (each of its two runs works in a copy of its own).

Run:  python bench/bench_cwd_copy.py [--repeat 3] [--megabytes 100]
A working directory holding a data file of ``--megabytes`` MB and ``scripts/train_resume.py``; the resume check of
that script killed at step 3 and restarted once (``check_resume``, 2 ranks), in that directory, against the same
check in a directory holding the script alone: the difference is what copying the data costs (twice: one copy per
run). Also times :func:`ddpfaults.engine.scripts.copy_cwd` alone. Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from ddpfaults import run_script
from ddpfaults.engine.scripts import copy_cwd
from ddpfaults.faults import RankKilled

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios", "scripts")


def _world(directory: str) -> float:
    start = time.perf_counter()
    result = run_script(
        "train_resume.py",
        world_size=2,
        faults=[RankKilled(rank=1, step=3)],
        max_restarts=1,
        check_resume=True,
        cwd=directory,
        stall=30,
    )
    assert result.resume["equivalent"], result.report()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as bare, tempfile.TemporaryDirectory() as loaded:
        for directory in (bare, loaded):
            shutil.copy(os.path.join(SCRIPT, "train_resume.py"), directory)
        with open(os.path.join(loaded, "data.bin"), "wb") as f:
            f.write(os.urandom(args.megabytes << 20))
        copies = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as into:
                start = time.perf_counter()
                copy_cwd(loaded, into)
                copies.append(time.perf_counter() - start)
        without = statistics.median(_world(bare) for _ in range(args.repeat))
        with_data = statistics.median(_world(loaded) for _ in range(args.repeat))
    copy = statistics.median(copies)
    print(f"copy of a {args.megabytes} MB working directory: {copy:.3f} s (median of {args.repeat})")
    print(f"resume check, script alone: {without:.2f} s; with the {args.megabytes} MB file: {with_data:.2f} s")
    print(f"ratio: {with_data / without:.2f}x (two copies: {2 * copy / without:.2f}x of the check's time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
