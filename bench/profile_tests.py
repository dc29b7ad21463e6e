"""Issue 51: where the README's test command spends its CPU, by test file.

Run:  python bench/profile_tests.py [--top 25] [pytest args...]
Runs ``python -m pytest -n 3`` (or the arguments given) with the ``bench/cpu_profile_plugin.py`` plugin and prints, per
test file, the CPU seconds its tests spent in the xdist worker itself, in subprocesses (pytest sessions, CLI runs),
in the ranks the fork server reaped and in the fork server, with its worlds and rank slots; then the totals. The
wall time is about the CPU over the number of cores when the cores stay busy, so the CPU is what to cut.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile

from bench_suite import timed_pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("self", "children", "ranks", "fork_server")


def main() -> None:
    """Run the profile."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=25, help="files shown, by CPU")
    parser.add_argument("--tests", type=int, default=0, help="tests shown, by CPU (after the files)")
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="ddpfaults-profile-") as scratch:
        out = os.path.join(scratch, "cpu")
        env = {**os.environ, "CPU_PER_TEST_OUT": out, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), ROOT])}
        wall, summary = timed_pytest(
            [*(pytest_args or ["-n", "3", "-q"]), "-p", "no:cacheprovider", "-p", "cpu_profile_plugin"], ROOT, env
        )
        records = [json.loads(line) for path in glob.glob(out + ".*") for line in open(path)]
    by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for record in records:
        counts = by_file[record["id"].split("::")[0]]
        counts["tests"] += 1
        for key in (*PARTS, "worlds", "rank_slots"):
            counts[key] += record[key]
    print(f"{wall:.1f} s  {summary}")
    columns = ("CPU-s", "worker", "subproc", "ranks", "server")
    print(" ".join(f"{c:>7}" for c in columns), f"{'worlds':>6} {'slots':>6} {'tests':>5}  file")
    ranked = sorted(by_file.items(), key=lambda kv: -sum(kv[1][p] for p in PARTS))
    for name, c in ranked[: args.top]:
        cpu = sum(c[p] for p in PARTS)
        print(
            f"{cpu:7.1f} {c['self']:7.1f} {c['children']:7.1f} {c['ranks']:7.1f} {c['fork_server']:7.1f} "
            f"{c['worlds']:6d} {c['rank_slots']:6d} {c['tests']:5d}  {name}"
        )
    by_test = sorted(records, key=lambda r: -sum(r[p] for p in PARTS))
    for record in by_test[: args.tests]:
        parts = " ".join(f"{record[p]:7.1f}" for p in PARTS)
        print(f"{sum(record[p] for p in PARTS):7.1f} {parts} {record['worlds']:6d}  {record['id']}")
    total = collections.Counter()
    for c in by_file.values():
        total.update(c)
    print(
        f"{sum(total[p] for p in PARTS):7.1f} {total['self']:7.1f} {total['children']:7.1f} {total['ranks']:7.1f} "
        f"{total['fork_server']:7.1f} {total['worlds']:6d} {total['rank_slots']:6d} {total['tests']:5d}  total"
    )


if __name__ == "__main__":
    sys.exit(main())
