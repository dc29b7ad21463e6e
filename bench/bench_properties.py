"""Property benchmark: examples per second of property 1 (tests/scenarios/test_properties.py) on 4-rank worlds.

Run:  python bench/bench_properties.py [--examples 30] [--repeat 9] [--launcher-threads N]
                                       [--mutant skip-criterion|no-joint-skip]

Runs the real property test (the fixed empty-batch strategy against its oracle) through Hypothesis with
``--examples`` generated examples (plus the test's explicit ones), derandomised, three times in the same run:

- one cold world per example and an oracle world per example (how the property first ran: every faulted world
  cold, ``reuse=False``, and the oracle a second 4-rank world, ``property_rankfns.reference_training``);
- data-only plans on a pooled world, still an oracle world per example;
- as it runs now: a pooled world per example and the oracle computed in this process, in a thread while the
  world's ranks train (``tests/support/ddp_oracle.py``, bit-equal to the oracle world; here each oracle world's
  digest is checked against it too; worlds still run one at a time).

Each prints examples/s with the time per example split into the faulted world, the oracle world, the in-process
oracle and the rest (Hypothesis, the test's own code). The world baseline, measured in the same run: one world
of the same trainer with a fault-free plan, with a one-fault plan on a warm world (the most a property that
runs one world per example can reach), and with a one-fault plan on a cold one. The load average is printed
with the figures: the machine is shared. ``--launcher-threads`` sets torch's threads in this process.

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
import threading
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


def _timed_worlds(test_module, log: list, mode: dict):
    """Wrap the test module's run_world and in-process oracle so every call's wall time is logged as
    (name, seconds); ``mode["cold"]``: a world with faults runs cold (``reuse=False``); ``mode["oracle_world"]``:
    every oracle is also computed by a reference world (logged as ``reference_training``), checked equal."""
    from ddpfaults.toy.models import state_digest
    from property_rankfns import reference_training

    original, oracle = test_module.run_world, test_module.oracle_state
    one_world_at_a_time = threading.Lock()  # the test computes its oracle in a thread, alongside its world

    def timed(fn, **kwargs):
        if mode["cold"] and kwargs.get("faults"):
            kwargs = {**kwargs, "reuse": False}
        with one_world_at_a_time:
            t0 = time.perf_counter()
            try:
                return original(fn, **kwargs)
            finally:
                log.append((fn.__name__, time.perf_counter() - t0))

    def timed_oracle(seed, cells, **kwargs):
        t0 = time.perf_counter()
        state = oracle(seed, cells, **kwargs)
        log.append(("oracle_state", time.perf_counter() - t0))
        if mode["oracle_world"]:
            with one_world_at_a_time:
                t0 = time.perf_counter()
                world = original(
                    reference_training,
                    world_size=kwargs["world_size"],
                    seed=seed,
                    stall=test_module.SAFE_STALL,
                    kwargs={"empty": cells, "steps": kwargs["steps"]},
                )
                log.append(("reference_training", time.perf_counter() - t0))
            assert {d for d, _ in world.values} == {state_digest(state)}, world.report()
        return state

    test_module.run_world, test_module.oracle_state = timed, timed_oracle


def baseline(repeat: int) -> tuple[float, float, float]:
    """Median wall time of the fixed trainer's world: fault-free plan (warm), one empty batch on a warm world
    (a data-only plan), one empty batch on a cold one."""
    from ddpfaults import run_world
    from ddpfaults.faults import EmptyBatch
    from scenario_empty_batch import empty_batch

    run_world(empty_batch, world_size=4, kwargs={"strategy": "fixed"})  # start the fork server, pool a world
    times: dict = {"warm": [], "faulted warm": [], "cold": []}
    for name, extra in (("warm", {}), ("faulted warm", {}), ("cold", {"reuse": False})):  # cold last: its
        for _ in range(repeat):  # teardown must not overlap a warm world's run
            faults = [] if name == "warm" else [EmptyBatch(rank=1, step=1)]
            t0 = time.perf_counter()
            result = run_world(empty_batch, world_size=4, kwargs={"strategy": "fixed"}, faults=faults, **extra)
            times[name].append(time.perf_counter() - t0)
            assert result.outcome == "completed" and result.warm == (name != "cold"), result.report()
    return tuple(statistics.median(times[name]) for name in ("warm", "faulted warm", "cold"))


def _load() -> str:
    """The machine's load average (1, 5, 15 minutes), as uptime prints it."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_property(property_test, worlds: list) -> tuple[float, Exception | None]:
    """Run the property once; its wall time and its failure (None if it held)."""
    worlds.clear()
    t0 = time.perf_counter()
    try:
        property_test()
        failure = None
    except Exception as exc:  # a failing property: the mutant was caught
        failure = exc
    return time.perf_counter() - t0, failure


ORACLES = ("reference_training", "oracle_state")


def _faulted(worlds: list) -> int:
    """How many faulted worlds (one per example) ran."""
    return len([n for n, _ in worlds if n not in ORACLES])


def split(label: str, wall: float, worlds: list) -> str:
    """``label: N examples in S s = R examples/s (per example: faulted world, oracle world, ...)``."""
    faulted = [t for name, t in worlds if name not in ORACLES]
    oracle = [t for name, t in worlds if name == "reference_training"]
    single = [t for name, t in worlds if name == "oracle_state"]
    examples = len(faulted)
    rest = wall - sum(faulted) - sum(oracle)
    return (
        f"{label}: {examples} examples in {wall:.2f} s = {examples / wall:.2f} examples/s "
        f"({wall / examples * 1000:.0f} ms each: faulted world {sum(faulted) / examples * 1000:.0f} ms, "
        f"oracle world {sum(oracle) / examples * 1000:.0f} ms ({len(oracle)} run), in-process oracle "
        f"{sum(single) / examples * 1000:.0f} ms while the world runs, the rest (the oracle's wait, Hypothesis, "
        f"the test) {rest / examples * 1000:.0f} ms)"
    )


def main() -> int:
    """Parse arguments, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=30, help="generated examples (explicit ones run too)")
    parser.add_argument("--repeat", type=int, default=9, help="runs of each baseline world")
    parser.add_argument("--launcher-threads", type=int, help="torch threads in this process (default: torch's)")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), help="plant a bug and show the shrunk counterexample")
    args = parser.parse_args()
    _load_profile(args.examples, bool(args.mutant))
    import test_properties
    import torch

    import ddp_oracle

    if args.launcher_threads:
        torch.set_num_threads(args.launcher_threads)
    worlds: list = []
    mode = {"cold": False, "oracle_world": False}
    _timed_worlds(test_properties, worlds, mode)
    property_test = test_properties.test_fixed_empty_batch_completes_bit_equal_to_the_oracle
    if args.mutant:
        test_properties.FIXED_EMPTY_BATCH = (_mutant(args.mutant), {"strategy": "fixed"})
        wall, failure = run_property(property_test, worlds)
        if failure is None:
            print(split("property 1", wall, worlds))
            print(f"the mutant {args.mutant} was NOT caught")
            return 1
        print(
            f"mutant {args.mutant}: property 1 failed after {_faulted(worlds)} faulted worlds "
            f"({wall:.1f} s, shrinking included)"
        )
        for line in getattr(failure, "__notes__", []):
            print(line)
        print(f"{type(failure).__name__}: {failure}")
        return 0

    print(f"{_load()}; torch threads in the launcher: {torch.get_num_threads()}")
    warm, faulted_warm, cold_world = baseline(args.repeat)
    print(
        f"baseline (median of {args.repeat}): fault-free plan {warm * 1000:.0f} ms (warm world), one-fault plan "
        f"{faulted_warm * 1000:.0f} ms on a warm world (data-only), {cold_world * 1000:.0f} ms on a cold one "
        f"= {1 / cold_world:.1f} cold worlds/s"
    )
    print(f"one warm world per example at most: {1 / faulted_warm:.1f} examples/s")
    rates = {}
    for label, cold, oracle_world in (
        ("cold worlds + oracle worlds", True, True),
        ("warm data-only worlds + oracle worlds", False, True),
        ("now: warm data-only worlds, in-process oracle", False, False),
    ):
        mode.update(cold=cold, oracle_world=oracle_world)
        ddp_oracle._BEFORE_STEP.clear()  # every run computes every oracle, from scratch
        wall, failure = run_property(property_test, worlds)
        if failure is not None:
            print(f"{label}: property 1 FAILED: {type(failure).__name__}: {failure}")
            return 1
        rates[label] = _faulted(worlds) / wall
        print(split(label, wall, worlds))
    first, warm, now = rates.values()
    print(f"speed-up {now / first:.1f}x over the first, {now / warm:.1f}x over warm worlds + oracle worlds; {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
