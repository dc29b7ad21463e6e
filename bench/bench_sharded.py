"""Sharded script-world benchmark: an unmodified FSDP2 + DCP torchrun script as a ddpfaults script world vs the same
script under plain ``torchrun --standalone``, side by side.

Run:  python bench/bench_sharded.py [--repeat 5] [--world-size 4]
Both sides run ``tests/support/scripts/fsdp_dcp_train.py`` (FSDP2 on a 1-D CPU mesh, DataLoader, SGD, ``dcp.save``,
``dcp.load``, a closing barrier), interleaved so both see the same machine load; prints the medians and the script
world's wall time as a ratio of plain torchrun's measured in the same run (the issue's bound: at most 0.5x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from ddpfaults import run_script

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "support", "scripts", "fsdp_dcp_train.py"
)


def script_world(n: int) -> float:
    """Wall seconds of one script world, which must complete."""
    started = time.perf_counter()
    result = run_script(SCRIPT, world_size=n, timeout=120)
    assert result.outcome == "completed", result.report()
    return time.perf_counter() - started


def plain_torchrun(n: int, failures: list) -> float:
    """Wall seconds of ``torchrun --standalone --nproc-per-node=n`` on the script; a run that does not exit 0 is
    counted in ``failures`` (its exit code and the tail of its output), not dropped: its time is a run's time."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        failures.append((done.returncode, (done.stdout + done.stderr)[-2000:]))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args()
    n = args.world_size
    script_world(n)  # start the fork server first: its one-off start-up is not a world's cost
    ours, theirs, failures = [], [], []
    for _ in range(args.repeat):
        ours.append(script_world(n))
        theirs.append(plain_torchrun(n, failures))
    for code, tail in failures[:1]:
        print(f"plain torchrun exited {code} in {len(failures)} of {args.repeat} runs; the first's output ends:")
        print(tail)
    base, cost = statistics.median(theirs), statistics.median(ours)
    print(f"{n}-rank plain torchrun (fsdp_dcp_train.py):   median {base:.3f} s over {args.repeat}")
    print(f"{n}-rank ddpfaults script world (same script): median {cost:.3f} s over {args.repeat}")
    print(f"script world / plain torchrun: {cost / base:.2f}x (bound: 0.5x)")


if __name__ == "__main__":
    main()
