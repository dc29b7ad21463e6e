"""Property benchmark: examples per second of property 1 (tests/scenarios/test_properties.py) on 4-rank worlds.

Run:  python bench/bench_properties.py [--examples 30] [--repeat 5] [--mutant skip-criterion|no-joint-skip]

Runs the real property test (the fixed empty-batch strategy against its oracle) through Hypothesis with
``--examples`` generated examples (plus the test's explicit ones), derandomised, and prints examples/s
with the time split into the faulted world, the oracle world and the rest. The baseline, measured in
the same run: one world of the same trainer with a fault-free plan (warm, as a fault-free world is
pooled) and with a one-fault plan (cold: a faulted world never reuses a pooled one).

``--mutant`` plants a bug in a *copy* of the fixed strategy (the scenario module is not touched),
runs the property on it and prints the shrunk counterexample Hypothesis reports:

- ``skip-criterion``: the fixed strategy's empty rank takes the early-return shortcut instead of the
  criterion (so it skips the criterion's ``num_masks`` all_reduce);
- ``no-joint-skip``: the step on which every rank is empty is no longer skipped together (every rank
  trains on fake targets): it completes, but the parameters leave the oracle's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the property test module (tests/scenarios/test_properties.py), the helpers it imports (tests/support, which
# pytest's pythonpath option provides under pytest) and the built-in scenarios (scenarios/, plain modules)
for _directory in ("scenarios", os.path.join("tests", "support"), os.path.join("tests", "scenarios")):
    sys.path.insert(0, os.path.join(ROOT, _directory))

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

MUTANTS = {
    "skip-criterion": (
        '        if is_empty and strategy != "fixed":\n',
        "        if is_empty:  # MUTANT: the fixed empty rank skips the criterion\n",
    ),
    "no-joint-skip": (
        "                continue  # every rank skips together",
        "                pass  # MUTANT: no joint skip",
    ),
}


def _load_profile(examples: int, mutant: bool) -> None:
    """A derandomised profile with ``examples`` examples, loaded before the test module reads it (for a
    mutant: generated examples only, so the counterexample is one Hypothesis found and shrank)."""
    phases = [Phase.generate, Phase.shrink] if mutant else list(Phase)
    settings.register_profile(
        "bench",
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        report_multiple_bugs=False,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile("bench")


def _mutant(name: str):
    """The scenario's empty_batch with ``name``'s bug planted, loaded from a temp copy of its module."""
    import scenario_empty_batch

    with open(scenario_empty_batch.__file__) as f:
        source = f.read()
    old, new = MUTANTS[name]
    if source.count(old) != 1:
        sys.exit(
            f"cannot plant {name}: the line {old.strip()!r} is not in {scenario_empty_batch.__file__} exactly once"
        )
    path = os.path.join(tempfile.mkdtemp(prefix="ddpfaults-mutant-"), f"mutant_{name.replace('-', '_')}.py")
    with open(path, "w") as f:
        f.write(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.empty_batch


def _timed_worlds(test_module, log: list):
    """Wrap the test module's run_world so every world's wall time is logged as (function name, seconds)."""
    original = test_module.run_world

    def timed(fn, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(fn, **kwargs)
        finally:
            log.append((fn.__name__, time.perf_counter() - t0))

    test_module.run_world = timed


def baseline(repeat: int) -> tuple[float, float]:
    """Median wall time of the fixed trainer's world: fault-free plan (warm), one empty batch (cold)."""
    from ddpfaults import run_world
    from ddpfaults.faults import EmptyBatch
    from scenario_empty_batch import empty_batch

    run_world(empty_batch, world_size=4, kwargs={"strategy": "fixed"})  # start the fork server, pool a world
    warm, cold = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_world(empty_batch, world_size=4, kwargs={"strategy": "fixed"})
        warm.append(time.perf_counter() - t0)
        assert result.outcome == "completed" and result.warm, result.report()
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_world(
            empty_batch, world_size=4, kwargs={"strategy": "fixed"}, reuse=False, faults=[EmptyBatch(rank=1, step=1)]
        )
        cold.append(time.perf_counter() - t0)
        assert result.outcome == "completed", result.report()
    return statistics.median(warm), statistics.median(cold)


def main() -> int:
    """Parse arguments, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=30, help="generated examples (explicit ones run too)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each baseline world")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), help="plant a bug and show the shrunk counterexample")
    args = parser.parse_args()
    _load_profile(args.examples, bool(args.mutant))
    import test_properties

    worlds: list = []
    _timed_worlds(test_properties, worlds)
    if args.mutant:
        test_properties.FIXED_EMPTY_BATCH = (_mutant(args.mutant), {"strategy": "fixed"})
    else:
        warm, cold = baseline(args.repeat)
        print(
            f"baseline (median of {args.repeat}): fault-free plan {warm * 1000:.0f} ms (warm world), "
            f"one-fault plan {cold * 1000:.0f} ms (cold world) = {1 / cold:.1f} worlds/s"
        )

    property_test = test_properties.test_fixed_empty_batch_completes_bit_equal_to_the_oracle
    t0 = time.perf_counter()
    try:
        property_test()
        failure = None
    except Exception as exc:  # a failing property: the mutant was caught
        failure = exc
    wall = time.perf_counter() - t0
    faulted = [t for name, t in worlds if name != "reference_training"]
    oracle = [t for name, t in worlds if name == "reference_training"]
    examples = len(faulted)
    if failure is None:
        rest = wall - sum(faulted) - sum(oracle)
        print(
            f"property 1: {examples} examples in {wall:.2f} s = {examples / wall:.2f} examples/s "
            f"({wall / examples * 1000:.0f} ms each: faulted world {statistics.mean(faulted) * 1000:.0f} ms, "
            f"oracle world {statistics.mean(oracle) * 1000:.0f} ms, single-process oracle + Hypothesis "
            f"{rest / examples * 1000:.0f} ms)"
        )
        if args.mutant:
            print(f"the mutant {args.mutant} was NOT caught")
            return 1
        return 0
    print(f"mutant {args.mutant}: property 1 failed after {examples} faulted worlds ({wall:.1f} s, shrinking included)")
    for line in getattr(failure, "__notes__", []):
        print(line)
    print(f"{type(failure).__name__}: {failure}")
    return 0 if args.mutant else 1


if __name__ == "__main__":
    sys.exit(main())
