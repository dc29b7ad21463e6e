"""Issue 51: the README's test command (``python -m pytest -n 3``) at this tree and at a base commit, in one run.

Run:  python bench/bench_tests.py [--base b18b9bd] [--repeat 1]
The base commit (default: where issue 51's work began) is checked out into a temporary worktree and run with
``PYTHONPATH`` set to it (its ranks inherit it: they run its code); this tree is run as it is. The two alternate
(base, head, base, head...) so a change of the machine's load falls on both. Prints each run's wall seconds and
summary line, the medians, and head's ratio against the base (goal: head <= 180 s on a quiet 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile

from bench_suite import timed_pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = "b18b9bdd425b848e6ff456365c11faaf6d0f342b"  # main when issue 51's work began (428 s then on a fresh clone)


def run_tests(tree: str) -> tuple[float, str]:
    """Wall seconds of the README's test command in ``tree``, and its summary line."""
    return timed_pytest(["-n", "3", "-q", "-p", "no:cacheprovider"], tree, {**os.environ, "PYTHONPATH": tree})


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=BASE, help="the commit to compare against")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpfaults-bench-base-") as scratch:
        base = os.path.join(scratch, "base")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", base, args.base], check=True)
        try:
            walls: dict[str, list[float]] = {"base": [], "head": []}
            for _ in range(args.repeat):
                for name, tree in (("base", base), ("head", ROOT)):
                    wall, summary = run_tests(tree)
                    walls[name].append(wall)
                    print(f"{name}: {wall:.1f} s  {summary}", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], check=False)
    base_median, head_median = (statistics.median(walls[k]) for k in ("base", "head"))
    print(f"median: base {args.base[:7]} {base_median:.1f} s, head {head_median:.1f} s  [goal: head <= 180 s]")
    print(f"ratio head/base: {head_median / base_median:.2f}x")


if __name__ == "__main__":
    main()
