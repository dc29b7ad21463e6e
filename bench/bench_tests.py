"""Issue 51: the README's test command (``python -m pytest -n 3``) at this tree and at a base commit, in one run.

Run:  python bench/bench_tests.py [--base b18b9bd] [--repeat 1] [--coverage [--keep DIR]]
The base commit (default: where issue 51's work began) and this tree's HEAD are each checked out into a temporary
worktree and run with ``PYTHONPATH`` set to it (its ranks inherit it: they run its code), every run from a tree
without bytecode caches, as on a fresh clone (the suite writes them as it goes). The two alternate (base, head, base,
head...) so a change of the machine's load falls on both. Prints each run's wall seconds and
summary line, the medians, and head's ratio against the base (goal: head <= 180 s on a quiet 2-core machine).

``--coverage`` runs each tree once under coverage.py instead (every process measured: the xdist workers, the fork
servers' ranks, the subprocesses the tests start) and prints the line coverage of each tree's ``ddpfaults/``: the
suite may get faster, never by covering less. Its times are not the suite's (measuring slows every process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_suite import timed_pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = "b18b9bdd425b848e6ff456365c11faaf6d0f342b"  # main when issue 51's work began (428 s then on a fresh clone)


def run_tests(tree: str) -> tuple[float, str]:
    """Wall seconds of the README's test command in ``tree``, and its summary line."""
    return timed_pytest(["-n", "3", "-q", "-p", "no:cacheprovider"], tree, {**os.environ, "PYTHONPATH": tree})


#: coverage.py's settings for one tree (``{source}``: its package, ``{data}``: where the processes write)
COVERAGE_RC = """[run]
source = {source}
parallel = true
concurrency = multiprocessing, thread
patch = subprocess, _exit
data_file = {data}/.coverage
"""


def covered(tree: str, scratch: str, name: str, keep: str | None) -> tuple[float, str]:
    """The README's test command in ``tree`` under coverage.py: (percent of ``tree/ddpfaults`` lines run, summary);
    ``keep``: a folder to write coverage.py's JSON report into, as ``<name>.json``."""
    data = os.path.join(scratch, f"coverage-{name}")
    os.makedirs(data)
    rcfile = os.path.join(data, "coveragerc")
    with open(rcfile, "w") as f:
        f.write(COVERAGE_RC.format(source=os.path.join(tree, "ddpfaults"), data=data))
    env = {**os.environ, "PYTHONPATH": tree, "COVERAGE_RCFILE": rcfile}
    _, summary = timed_pytest(["-n", "3", "-q", "-p", "no:cacheprovider"], tree, env, coverage=rcfile)
    subprocess.run([sys.executable, "-m", "coverage", "combine", "-q", f"--rcfile={rcfile}"], cwd=tree, check=True)
    if keep:
        report = os.path.join(os.path.abspath(keep), f"{name}.json")
        subprocess.run([sys.executable, "-m", "coverage", "json", "-q", "-o", report, f"--rcfile={rcfile}"], cwd=tree)
    done = subprocess.run(
        [sys.executable, "-m", "coverage", "report", "--format=total", "--precision=2", f"--rcfile={rcfile}"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip()), summary


def _drop_caches(tree: str) -> None:
    """Remove every ``__pycache__`` directory under ``tree`` (bytecode and pytest's rewritten tests)."""
    for folder, dirs, _ in os.walk(tree):
        if "__pycache__" in dirs:
            shutil.rmtree(os.path.join(folder, "__pycache__"))
            dirs.remove("__pycache__")


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=BASE, help="the commit to compare against")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--coverage", action="store_true", help="line coverage of each tree instead of its time")
    parser.add_argument("--keep", help="with --coverage: a folder for each tree's JSON report (base.json, head.json)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpfaults-bench-base-") as scratch:
        base, head = os.path.join(scratch, "base"), os.path.join(scratch, "head")
        for tree, commit in ((base, args.base), (head, "HEAD")):
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, commit], check=True)
        try:
            if args.coverage:
                percents = {}
                for name, tree in (("base", base), ("head", head)):
                    percents[name], summary = covered(tree, scratch, name, args.keep)
                    print(f"{name}: {percents[name]:.2f}% of ddpfaults/ lines  {summary}", flush=True)
                print(f"coverage: base {args.base[:7]} {percents['base']:.2f}%, head {percents['head']:.2f}%")
                return
            walls: dict[str, list[float]] = {"base": [], "head": []}
            for _ in range(args.repeat):
                for name, tree in (("base", base), ("head", head)):
                    _drop_caches(tree)
                    wall, summary = run_tests(tree)
                    walls[name].append(wall)
                    print(f"{name}: {wall:.1f} s  {summary}", flush=True)
        finally:
            for tree in (base, head):
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
    base_median, head_median = (statistics.median(walls[k]) for k in ("base", "head"))
    print(f"median: base {args.base[:7]} {base_median:.1f} s, head {head_median:.1f} s  [goal: head <= 180 s]")
    print(f"ratio head/base: {head_median / base_median:.2f}x")


if __name__ == "__main__":
    main()
