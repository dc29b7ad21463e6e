"""P3: the whole built-in scenario suite under pytest, without and with pytest-xdist.

Run:  python bench/bench_suite.py [--repeat 1]
Times `pytest -p ddpfaults scenarios/` with -n 0 and -n 2 (wall time of the whole
pytest process, fork server start included), warm worlds on (default) and off, and prints the
ratio against the -n 0 run measured here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_pytest(args: list[str], cwd: str, env: dict, coverage: str | None = None) -> tuple[float, str]:
    """Wall seconds of one ``python -m pytest`` run with ``args`` in ``cwd``, and its summary line (and a line per
    failed test); ``coverage``: an rcfile to run it under ``coverage run`` with."""
    measure = ["-m", "coverage", "run", f"--rcfile={coverage}"] if coverage else []
    t0 = time.perf_counter()
    command = [sys.executable, *measure, "-m", "pytest", *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
    failures = [line.split(" - ")[0] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return wall, "\n  ".join([lines[-1] if lines else done.stdout[-300:], *failures])


def run_suite(workers: int, reuse: bool, **environ: str | None) -> tuple[float, str]:
    """Wall seconds of one pytest run of the built-in scenarios, and its summary line; ``environ`` sets (or, with
    None, removes) environment variables of the run."""
    env = {**os.environ, "DDPFAULTS_REUSE": "1" if reuse else "0", **environ}
    env = {k: v for k, v in env.items() if v is not None}
    args = ["-p", "ddpfaults", "scenarios/", "-q", "-n", str(workers), "-p", "no:randomly"]
    return timed_pytest(args, ROOT, env)


def main() -> None:
    """Run the suite benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print("P3 built-in scenario suite (pytest -p ddpfaults scenarios/), wall seconds  [goal <= 45 s]")
    baseline = None
    for reuse in (True, False):
        for workers in (0, 2):
            walls = []
            for _ in range(args.repeat):
                wall, summary = run_suite(workers, reuse)
                walls.append(wall)
            best = min(walls)
            baseline = baseline or best
            print(
                f"   -n {workers}  warm worlds {'on ' if reuse else 'off'}  {best:6.1f} s  "
                f"({best / baseline:.2f}x the -n 0 warm run)  {summary.strip()}"
            )


if __name__ == "__main__":
    main()
