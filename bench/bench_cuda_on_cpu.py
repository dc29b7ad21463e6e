"""The CUDA mapping's cost: a GPU-written trainer with ``cuda_on_cpu`` vs its CPU twin without it, in one run.

Run:  python bench/bench_cuda_on_cpu.py [--repeat 7] [--world-size 4] [--epochs 4]
Both sides are ``tests/support/scripts/gpu_train.py``: ``--style gpu`` under the mapping (set_device, .cuda(), nccl,
device_ids, pin_memory, autocast and GradScaler on "cuda"), ``--style cpu`` without it (gloo, no devices, no pinning,
autocast off and the CPU's GradScaler: the same work), each a fresh script world, interleaved so both see the same
machine load. Prints the medians and the mapped world's cost as a ratio of its twin's (the issue's bound: at most
1.1x), and the same ratio for the training alone (the slowest rank's time from the process group up to its end,
from its events), which leaves out the start-up both sides share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ddpfaults import run_script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "support", "scripts")
GPU_TRAIN = os.path.join(SCRIPT, "gpu_train.py")


def timed(style: str, world_size: int, epochs: int) -> tuple[float, float]:
    """Wall seconds of one world, which must complete, and its slowest rank's training seconds (step 0 to end)."""
    started = time.perf_counter()
    result = run_script(
        GPU_TRAIN,
        ["--style", style, "--epochs", str(epochs), "--batches", "8"],
        world_size=world_size,
        cuda_on_cpu=style == "gpu",
    )
    wall = time.perf_counter() - started
    assert result.outcome == "completed", result.report()
    training = []
    for rank in result.ranks:
        first = next(e["t"] for e in rank.events if e["k"] == "step" and e["step"] == 0)
        last = next(e["t"] for e in reversed(rank.events) if e["k"] == "finished")
        training.append(last - first)
    return wall, max(training)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    n = args.world_size
    timed("cpu", n, 1)  # start the fork server first
    twin, mapped = [], []
    for _ in range(args.repeat):
        twin.append(timed("cpu", n, args.epochs))
        mapped.append(timed("gpu", n, args.epochs))
    base, cost = statistics.median(w for w, _ in twin), statistics.median(w for w, _ in mapped)
    base_train, cost_train = statistics.median(t for _, t in twin), statistics.median(t for _, t in mapped)
    steps, over = args.epochs * 8, f"over {args.repeat}"
    print(f"{n}-rank CPU twin world (gpu_train.py --style cpu, {steps} steps):      median {base:.3f} s {over}")
    print(f"{n}-rank GPU trainer with --cuda-on-cpu (--style gpu, {steps} steps): median {cost:.3f} s {over}")
    print(f"mapped / twin, whole world: {cost / base:.2f}x (bound: 1.1x)")
    print(f"mapped / twin, training alone: {cost_train / base_train:.2f}x ({cost_train:.3f} s vs {base_train:.3f} s)")


if __name__ == "__main__":
    main()
