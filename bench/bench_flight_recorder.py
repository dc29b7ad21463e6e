"""P6: what torch's flight recorder costs the built-in scenario suite.

Run:  python bench/bench_flight_recorder.py [--repeat 3]
Times `pytest -p ddpfaults scenarios/` (-n 0, the wall time of the whole pytest process) with the flight
recorder on (the default: every rank records its collectives and dumps them at the end of each job) and off
(``TORCH_FR_BUFFER_SIZE=0``: the record is ddpfaults' own tracing), alternating, and prints the ratio of the
medians. Goal: at most 1.10.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_suite(recorder: bool) -> tuple[float, str]:
    """Wall seconds of one pytest run of the built-in scenarios, and its summary line."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    if not recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "0"
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ddpfaults", "scenarios/", "-q", "-p", "no:randomly"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    lines = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
    return wall, (lines[-1] if lines else done.stdout[-300:])


def main() -> None:
    """Run the flight-recorder cost benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    walls: dict = {True: [], False: []}
    summaries = {}
    run_suite(True)  # warm the disk cache: the first run pays for it, whichever it is
    for _ in range(args.repeat):
        for recorder in (False, True):
            wall, summaries[recorder] = run_suite(recorder)
            walls[recorder].append(wall)
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    print("P6 flight recorder cost on the built-in suite (pytest -p ddpfaults scenarios/, -n 0), wall seconds")
    print(f"   recorder off (TORCH_FR_BUFFER_SIZE=0)  median {off:5.2f} s  {walls[False]}  {summaries[False]}")
    print(f"   recorder on  (default)                 median {on:5.2f} s  {walls[True]}  {summaries[True]}")
    print(f"   ratio on/off  {on / off:.3f}   [goal <= 1.10]")


if __name__ == "__main__":
    main()
