"""P6: what torch's flight recorder costs the built-in scenario suite.

Run:  python bench/bench_flight_recorder.py [--repeat 3]
Times `pytest -p ddpfaults scenarios/` (-n 0, the wall time of the whole pytest process) with the flight
recorder on (the default: every rank records its collectives and dumps them at the end of each job) and off
(``TORCH_FR_BUFFER_SIZE=0``: the record is ddpfaults' own tracing), alternating, and prints the ratio of the
medians. Goal: at most 1.10.
"""

from __future__ import annotations

import argparse
import statistics

import bench_suite


def run_suite(recorder: bool) -> tuple[float, str]:
    """Wall seconds of one pytest run of the built-in scenarios (-n 0, warm worlds on), and its summary line."""
    return bench_suite.run_suite(0, True, TORCH_FR_BUFFER_SIZE=None if recorder else "0")


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
