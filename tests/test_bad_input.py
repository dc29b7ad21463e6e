"""Bad input, refused before any world starts: one case per row of ``docs/bad-input.md``, matched by its id.

Each case provokes the refusal the way a user would write the input (an API call, a scenario declaration, a
``ddpfaults(...)`` marker or an option in a pytest run, a ``python -m ddpfaults`` command) and checks the error
type, that the message names the source and the bad value, that nothing started (no world for an API call or a
command, no test for a pytest session), and that the table's row says the same (where, error type, and every
piece of its abridged message). A row without a case, or a case without a row, fails ``test_table_and_cases_agree``.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import ddpfaults
from ddpfaults import Expect, RunSpec, run_script, run_world, scenario, script_scenario, variant
from ddpfaults.engine.launcher import LocalWorld
from ddpfaults.faults import (
    AsyncSaveKilled,
    CheckpointNotVisible,
    DroppedLink,
    EmptyBatch,
    OutOfMemory,
    Preempt,
    RankCrash,
    RankKilled,
    SkippedCollective,
    SlowLink,
    TornDcpWrite,
)
from ddpfaults.plugin import DDPWorld
from ddpfaults.report.document import write_document
from pluginruns import isolate
from processes import EVENT_GUARD

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad-input.md"
WHERE = ("API", "declaration", "marker", "option", "CLI", "torchrun")


# -- rank functions the cases name (module level: they could be pickled, but no world ever runs them) -------------


def takes_ctx(ctx):
    """A rank function taking only its context."""
    return ctx.rank


def takes_nothing():
    """Not a rank function: it does not take the context."""
    return 0


def takes_fake(ctx, fake):
    """A rank function with one required keyword."""
    return fake


TOUCH = '''
import os


def touch(ctx):
    """Leave a file next to this module: proof that a rank ran."""
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"ran{ctx.rank}"), "w").close()
'''
RAN = """
def test_ran():
    open("ran", "w").close()
"""
TORCHRUN_CASES = """
import ddpfaults
from ddpfaults.faults import RankKilled


@ddpfaults.scenario(world_size=2, variants=[
    ddpfaults.variant("late_fault", faults=[RankKilled(rank=1, step=2, attempt=2)]),
    ddpfaults.variant("resume_checked", check_resume=True, faults=[RankKilled(rank=1, step=2)]),
    ddpfaults.variant("one_restart", max_restarts=1),
])
def train(ctx):
    \"\"\"Never run: each variant is refused under torchrun.\"\"\"
"""
SCRIPT = "support/scripts/plain_train.py"  # relative to this file, as a script scenario's script is


# -- what a case observes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """What happened to an input: the error type's name (None: nothing refused it), the message, and whether a world
    (for a pytest session: a test) started before the refusal."""

    error: str | None
    message: str
    started: bool = False


class _WorldStarted(Exception):
    pass


class Env:
    """Where a case provokes its refusal: in this process (a world starting is caught by a spy on
    ``LocalWorld.run``), in a pytest session run in this process (pytester: a refused input starts nothing, and a
    world that did start would meet the same spy), or in a ``python -m ddpfaults`` subprocess."""

    def __init__(self, tmp_path: Path, monkeypatch, request):
        self.tmp, self.monkeypatch, self.request = tmp_path, monkeypatch, request
        self.worlds: list = []

        def spy(world):
            self.worlds.append(world)
            raise _WorldStarted("a world started")

        monkeypatch.setattr(LocalWorld, "run", spy)

    def path(self, name: str) -> Path:
        """An empty file under the case's temp dir."""
        (self.tmp / name).write_text("")
        return self.tmp / name

    def mkdir(self, name: str) -> Env:
        """This env, with a directory ``name`` under its temp dir."""
        (self.tmp / name).mkdir()
        return self

    def file(self, name: str, text: str) -> Env:
        """This env, with a file ``name`` holding ``text`` under its temp dir."""
        (self.tmp / name).write_text(text)
        return self

    def setenv(self, name: str, value: str) -> Env:
        """This env, with an environment variable set for the case."""
        self.monkeypatch.setenv(name, value)
        return self

    def api(self, call: Callable, *args, **kwargs) -> Refusal:
        """``call(*args, **kwargs)`` in this process."""
        try:
            call(*args, **kwargs)
        except Exception as exc:
            return Refusal(type(exc).__name__, str(exc), bool(self.worlds))
        return Refusal(None, "", bool(self.worlds))

    def declare(self, decorator, fn) -> Refusal:
        """A scenario declaration: ``decorator(fn)`` (what ``@decorator`` does)."""
        return self.api(decorator, fn)

    def pytest(self, *args: str, files: dict | None = None, env: dict | None = None, ini: str = "") -> Refusal:
        """``pytest -p ddpfaults ARGS`` in this process, in a dir holding ``files`` and a test that leaves ``ran``."""
        pytester = self.request.getfixturevalue("pytester")
        isolate(pytester, self.monkeypatch, test_ran=RAN, **(files or {}))
        for name, value in (env or {}).items():
            self.monkeypatch.setenv(name, value)
        if ini:
            pytester.makeini(f"[pytest]\n{ini}\n")
        (pytester.path / "reports").mkdir()
        (pytester.path / "locked").mkdir(mode=0o500)  # not writable (except for root)
        (pytester.path / "afile").write_text("")
        result = pytester.runpytest_inprocess("-p", "ddpfaults", *args)
        out, err = result.stdout.str(), result.stderr.str()
        started = (pytester.path / "ran").exists()
        if result.ret == pytest.ExitCode.USAGE_ERROR:
            return Refusal("UsageError", err.strip(), started)
        found = re.search(r"^(?:\S+: )?(\w+Error): ", out, re.M)  # a collection error's one-line report
        if result.ret == pytest.ExitCode.INTERRUPTED and found:
            return Refusal(found.group(1), out, started)
        return Refusal(None, out + err, started)

    def cli(self, *args: str) -> Refusal:
        """``python -m ddpfaults ARGS`` in the case's temp dir (holding ``touch.py``, whose ranks leave files)."""
        (self.tmp / "touch.py").write_text(TOUCH)
        proc = subprocess.run(
            [sys.executable, "-m", "ddpfaults", *args],
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=EVENT_GUARD,
        )
        started = any(self.tmp.glob("ran*"))
        found = re.match(r"ddpfaults: error: (\w+): ", proc.stderr)
        if proc.returncode == 2 and found and not proc.stdout:
            return Refusal(found.group(1), proc.stderr.strip(), started)
        return Refusal(None, proc.stdout + proc.stderr, started)

    def torchrun(self, variant: str, max_restarts: int, **environ: str) -> Refusal:
        """``torchrun --max-restarts N -m ddpfaults.launch scenario_tr.py::train[variant]``'s rank 0, in this process
        with torchrun's environment (no torchrun: the refusal comes before the worker touches its store)."""
        from ddpfaults.torchrun.worker import main as worker_main

        (self.tmp / "scenario_tr.py").write_text(TORCHRUN_CASES)
        torchrun_env = {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": "29999",
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            **environ,
        }
        for name, value in torchrun_env.items():
            self.monkeypatch.setenv(name, value)
        mask, stderr = signal.pthread_sigmask(signal.SIG_BLOCK, []), io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                code = worker_main([f"{self.tmp / 'scenario_tr.py'}::train[{variant}]"])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # the worker blocks torchrun's signals first
        found = re.match(r"ddpfaults: error: (\w+): ", stderr.getvalue())
        if code == 2 and found:
            return Refusal(found.group(1), stderr.getvalue().strip())
        return Refusal(None, stderr.getvalue(), True)

    def report(self) -> str:
        """A valid report document (no worlds) to render."""
        return write_document(self.tmp / "report.json", [])


@dataclass(frozen=True)
class Row:
    """One refused input: its id in the table, where it is refused, the error type, what the message must name (the
    source and the bad value), and how to provoke it."""

    id: str
    where: str
    error: str
    names: tuple
    provoke: Callable[[Env], Refusal]


def _marked(marker: str) -> dict:
    return {"test_marked": f"import pytest\n\n\n@pytest.mark.ddpfaults({marker})\ndef test_marked():\n    pass\n"}


SCENARIO_MARKED = """
import pytest
import ddpfaults


@pytest.mark.ddpfaults(world_size=0)
@ddpfaults.scenario()
def marked(ctx):
    pass
"""

ROWS = [
    # -- run_world / run_script --------------------------------------------------------------------------------------
    Row(
        "run-world-size-zero",
        "API",
        "InvalidWorldSize",
        ("world_size", "got 0"),
        lambda e: e.api(run_world, takes_ctx, world_size=0),
    ),
    Row(
        "run-timeout-zero",
        "API",
        "InvalidTimeout",
        ("timeout", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.api(run_world, takes_ctx, world_size=2, timeout=0),
    ),
    Row(
        "run-startup-zero",
        "API",
        "InvalidTimeout",
        ("startup", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.api(run_world, takes_ctx, world_size=2, startup=0),
    ),
    Row(
        "run-world-size-beyond-the-machine",
        "API",
        "InvalidWorldSize",
        ("world_size=1000000 is more than this machine can hold: at most", "per rank"),
        lambda e: e.api(run_world, takes_ctx, world_size=1_000_000),
    ),
    Row(
        "run-stall-zero",
        "API",
        "InvalidTimeout",
        ("stall", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.api(run_world, takes_ctx, world_size=2, stall=0),
    ),
    Row(
        "run-stall-not-below-timeout",
        "API",
        "InvalidTimeout",
        ("stall (5 s)", "timeout (5 s)"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.api(run_world, takes_ctx, world_size=2, timeout=5, stall=5),
    ),
    Row(
        "run-seed-out-of-range",
        "API",
        "ConfigError",
        ("seed", "got 18446744073709551616"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, seed=2**64),
    ),
    Row(
        "run-backend-nccl",
        "API",
        "UnknownBackend",
        ("backend 'nccl'",),
        lambda e: e.api(run_world, takes_ctx, world_size=2, backend="nccl"),
    ),
    Row(
        "run-max-restarts-negative",
        "API",
        "ConfigError",
        ("max_restarts must be an int >= 0", "got -1"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, max_restarts=-1),
    ),
    Row(
        "run-check-resume-not-bool",
        "API",
        "ConfigError",
        ("check_resume must be true or false", "got 'yes'"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, check_resume="yes"),
    ),
    Row(
        "run-cuda-on-cpu-not-bool",
        "API",
        "ConfigError",
        ("cuda_on_cpu must be true or false", "got 'yes'"),
        lambda e: e.api(run_script, e.path("train.py"), world_size=2, cuda_on_cpu="yes"),
    ),
    Row(
        "run-peer-failure-unknown",
        "API",
        "UnknownPeerFailure",
        ("peer_failure", "got 'hang'"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, peer_failure="hang"),
    ),
    Row(
        "run-start-method-unknown",
        "API",
        "UnknownStartMethod",
        ("start_method", "got 'thread'"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, start_method="thread"),
    ),
    Row(
        "run-threads-zero",
        "API",
        "ConfigError",
        ("threads", "got 0"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, threads=0),
    ),
    Row(
        "run-reuse-not-bool",
        "API",
        "ConfigError",
        ("reuse", "got 'yes'"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, reuse="yes"),
    ),
    Row(
        "run-reuse-environment",
        "API",
        "ConfigError",
        ("DDPFAULTS_REUSE", "'maybe'"),
        lambda e: e.setenv("DDPFAULTS_REUSE", "maybe").api(run_world, takes_ctx, world_size=2),
    ),
    Row(
        "run-spec-not-a-runspec",
        "API",
        "ConfigError",
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        ("spec", "{'timeout': 5}"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.api(run_world, takes_ctx, world_size=2, spec={"timeout": 5}),
    ),
    Row(
        "run-fn-lambda",
        "API",
        "FunctionNotRunnable",
        ("<lambda>",),
        lambda e: e.api(run_world, lambda ctx: 0, world_size=2),
    ),
    Row("run-fn-not-callable", "API", "FunctionNotRunnable", ("42",), lambda e: e.api(run_world, 42, world_size=2)),
    Row(
        "run-fn-extra-arg",
        "API",
        "InvalidArguments",
        ("takes_ctx(ctx)", "takes_ctx(ctx, 1)", "too many positional arguments"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, args=(1,)),
    ),
    Row(
        "run-fn-no-ctx",
        "API",
        "InvalidArguments",
        ("takes_nothing()", "takes_nothing(ctx)", "too many positional arguments"),
        lambda e: e.api(run_world, takes_nothing, world_size=2),
    ),
    Row(
        "run-fn-unknown-kwarg",
        "API",
        "InvalidArguments",
        ("takes_fake(ctx, fake)", "fak=1"),
        lambda e: e.api(run_world, takes_fake, world_size=2, kwargs={"fak": 1}),
    ),
    Row(
        "run-kwargs-not-mapping",
        "API",
        "InvalidArguments",
        ("kwargs must be a mapping", "[1, 2]"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, kwargs=[1, 2]),
    ),
    Row(
        "run-args-not-sequence",
        "API",
        "InvalidArguments",
        ("args must be a list or tuple", "'ab'"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, args="ab"),
    ),
    Row(
        "run-flight-recorder-dir-is-a-file",
        "API",
        "ConfigError",
        ("flight_recorder_dir", "afile", "it is a file, not a directory"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, flight_recorder_dir=e.path("afile")),
    ),
    Row(
        "script-argv-string",
        "API",
        "ConfigError",
        ("argv", "'--lr 0.1'"),
        lambda e: e.api(run_script, e.path("train.py"), "--lr 0.1", world_size=2),
    ),
    Row(
        "script-cwd-missing",
        "API",
        "ConfigError",
        ("cwd", "nowhere"),
        lambda e: e.api(run_script, "train.py", world_size=2, cwd=e.tmp / "nowhere"),
    ),
    Row(
        "run-cwd-missing",
        "API",
        "ConfigError",
        ("run_world: cwd", "nowhere", "is not a directory"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, cwd=e.tmp / "nowhere"),
    ),
    Row(
        "fixture-run-a-path",
        "API",
        "FunctionNotRunnable",
        ("ddp_world.run runs a rank function; 'train.py' is a path", "ddp_world.run_script('train.py'"),
        lambda e: e.api(DDPWorld(None).run, "train.py", world_size=2),
    ),
    Row(
        "script-step-clock-unknown",
        "API",
        "ConfigError",
        ("step_clock", "got 'epoch'"),
        lambda e: e.api(run_script, e.path("train.py"), world_size=2, step_clock="epoch"),
    ),
    Row(
        "script-not-found",
        "API",
        "ScriptError",
        ("script", "no_train.py", "not found"),
        lambda e: e.api(run_script, "no_train.py", world_size=2, cwd=e.tmp),
    ),
    Row(
        "script-path-and-module",
        "API",
        "ScriptError",
        ("exactly one", "module='train'"),
        lambda e: e.api(run_script, e.path("train.py"), module="train", world_size=2),
    ),
    Row(
        "script-module-not-a-name",
        "API",
        "ScriptError",
        ("module must be a module name", "got 3"),
        lambda e: e.api(run_script, module=3, world_size=2),
    ),
    # -- scenario declarations -------------------------------------------------------------------------------------
    Row(
        "scenario-world-size-zero",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "world_size", "got 0"),
        lambda e: e.declare(scenario(world_size=0), takes_ctx),
    ),
    Row(
        "scenario-timeout-zero",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "timeout", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.declare(scenario(timeout=0), takes_ctx),
    ),
    Row(
        "scenario-stall-zero",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "stall", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.declare(scenario(stall=0), takes_ctx),
    ),
    Row(
        "scenario-stall-not-below-timeout",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "stall (5 s)", "timeout (3 s)"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.declare(scenario(timeout=3, stall=5), takes_ctx),
    ),
    Row(
        "scenario-peer-failure-unknown",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "peer_failure", "got 'hang'"),
        lambda e: e.declare(scenario(peer_failure="hang"), takes_ctx),
    ),
    Row(
        "scenario-fn-no-ctx",
        "declaration",
        "ScenarioError",
        ("scenario takes_nothing", "takes_nothing(ctx)"),
        lambda e: e.declare(scenario(), takes_nothing),
    ),
    Row(
        "scenario-kwargs-unbound",
        "declaration",
        "ScenarioError",
        ("scenario takes_fake", "fak=1", "missing a required argument: 'fake'"),
        lambda e: e.declare(scenario(kwargs={"fak": 1}), takes_fake),
    ),
    Row(
        "scenario-kwargs-not-mapping",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "kwargs must be a mapping", "[1, 2]"),
        lambda e: e.declare(scenario(kwargs=[1, 2]), takes_ctx),
    ),
    Row(
        "scenario-name-empty",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "name", "got ''"),
        lambda e: e.declare(scenario(name=""), takes_ctx),
    ),
    Row(
        "scenario-not-module-level",
        "declaration",
        "ScenarioError",
        ("scenario <lambda>", "module-level function"),
        lambda e: e.declare(scenario(), lambda ctx: 0),
    ),
    Row(
        "scenario-expect-text",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "expect 'finished'", "'completed', 'hung', 'crashed', 'timed out'"),
        lambda e: e.declare(scenario(expect="finished"), takes_ctx),
    ),
    Row(
        "scenario-expect-rank-outside-world",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "rank 2", "world of 2 ranks"),
        lambda e: e.declare(scenario(world_size=2, expect="crashed on rank 2"), takes_ctx),
    ),
    Row(
        "scenario-variants-not-a-list",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "variants must be a list", "Variant(name='v'"),
        lambda e: e.declare(scenario(variants=variant("v")), takes_ctx),
    ),
    Row(
        "variant-world-size-zero",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "variant v", "world_size", "got 0"),
        lambda e: e.declare(scenario(world_size=2, variants=[variant("v", world_size=0)]), takes_ctx),
    ),
    Row(
        "variant-timeout-zero",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "variant v", "timeout", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.declare(scenario(variants=[variant("v", timeout=0)]), takes_ctx),
    ),
    Row(
        "variant-kwargs-not-mapping",
        "declaration",
        "ScenarioError",
        ("scenario takes_fake", "variant v", "kwargs must be a mapping", "[1, 2]"),
        lambda e: e.declare(scenario(variants=[variant("v", kwargs=[1, 2])]), takes_fake),
    ),
    Row(
        "variant-kwargs-unbound",
        "declaration",
        "ScenarioError",
        ("scenario takes_fake", "variant naive", "fak='x'"),
        lambda e: e.declare(scenario(variants=[variant("naive", kwargs={"fak": "x"})]), takes_fake),
    ),
    Row(
        "variant-name-not-a-word",
        "declaration",
        "ScenarioError",
        ("variant name", "'two words'"),
        lambda e: e.api(variant, "two words"),
    ),
    Row(
        "variant-names-repeat",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "variant names repeat", "['v', 'v']"),
        lambda e: e.declare(scenario(variants=[variant("v"), variant("v")]), takes_ctx),
    ),
    Row(
        "script-scenario-not-found",
        "declaration",
        "ScenarioError",
        ("scenario no_train", "'no_train.py' not found"),
        lambda e: e.api(script_scenario, "no_train.py"),
    ),
    Row(
        "script-scenario-step-clock-unknown",
        "declaration",
        "ScenarioError",
        ("scenario plain_train", "step_clock", "got 'epoch'"),
        lambda e: e.api(script_scenario, SCRIPT, step_clock="epoch"),
    ),
    Row(
        "script-scenario-argv-string",
        "declaration",
        "ScenarioError",
        ("scenario plain_train", "argv", "'--lr 0.1'"),
        lambda e: e.api(script_scenario, SCRIPT, argv="--lr 0.1"),
    ),
    Row(
        "script-scenario-cwd-missing",
        "declaration",
        "ScenarioError",
        ("scenario plain_train", "cwd", "nowhere", "is not a directory"),
        lambda e: e.api(script_scenario, SCRIPT, cwd="nowhere"),
    ),
    Row(
        "script-scenario-single-fault",
        "declaration",
        "ScenarioError",
        ("scenario plain_train", "faults must be a list of faults", "wrap it in a list"),
        lambda e: e.api(script_scenario, SCRIPT, faults=EmptyBatch(rank=1, step=1)),
    ),
    Row(
        "script-scenario-variant-kwargs",
        "declaration",
        "ScenarioError",
        ("scenario plain_train", "variant v", "{'lr': 1}", "argv"),
        lambda e: e.api(script_scenario, SCRIPT, variants=[variant("v", kwargs={"lr": 1})]),
    ),
    Row(
        "expect-rank-negative",
        "declaration",
        "ScenarioError",
        ("expect: rank", "got -1"),
        lambda e: e.api(Expect, "crashed", rank=-1),
    ),
    Row(
        "expect-flag-not-bool",
        "declaration",
        "ScenarioError",
        ("expect: values_equal", "got 'yes'"),
        lambda e: e.api(Expect, "completed", values_equal="yes"),
    ),
    Row(
        "expect-values-equal-not-completed",
        "declaration",
        "ScenarioError",
        ("expect: values_equal compares the ranks of a world that completed", "expected to be crashed"),
        lambda e: e.api(Expect, "crashed", values_equal=True),
    ),
    Row(
        "scenario-single-fault",
        "declaration",
        "ScenarioError",
        ("scenario takes_ctx", "faults must be a list of faults", "wrap it in a list: faults=[RankCrash("),
        lambda e: e.declare(scenario(faults=RankCrash(rank=1, step=2)), takes_ctx),
    ),
    Row(
        "expect-check-not-callable",
        "declaration",
        "ScenarioError",
        ("expect: each check", "got 'replicas equal'"),
        lambda e: e.api(Expect, "completed", checks=["replicas equal"]),
    ),
    Row(
        "expect-resume-cause-unknown",
        "declaration",
        "ScenarioError",
        ("expect: resume_cause must be one of", "got 'rng_state'"),
        lambda e: e.api(Expect, "completed", resume_cause="rng_state"),
    ),
    Row(
        "expect-resume-equivalent-and-cause",
        "declaration",
        "ScenarioError",
        ("resume_equivalent=True cannot go with a resume_cause or resume_step",),
        lambda e: e.api(Expect, "completed", resume_equivalent=True, resume_step=3),
    ),
    # -- fault plans and faults ------------------------------------------------------------------------------------
    Row(
        "fault-attempt-negative",
        "API",
        "FaultError",
        ("RankKilled: attempt must be a non-negative int", "got -1"),
        lambda e: e.api(RankKilled, rank=1, step=2, attempt=-1),
    ),
    Row(
        "fault-attempt-beyond-restarts",
        "API",
        "FaultError",
        ("RankKilled(rank=1, step=2, attempt=1) acts in attempt 1", "max_restarts=0 never reaches"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults=[RankKilled(rank=1, step=2, attempt=1)]),
    ),
    Row(
        "fault-preempt-two-steps",
        "API",
        "FaultError",
        ("Preempt: step must be one step", "got [2, 3]"),
        lambda e: e.api(Preempt, step=[2, 3]),
    ),
    Row(
        "fault-preempt-grace-not-positive",
        "API",
        "FaultError",
        ("Preempt: grace must be a positive finite number of seconds", "got 0"),
        lambda e: e.api(Preempt, step=2, grace=0),
    ),
    Row(
        "fault-preempt-sigkill",
        "API",
        "FaultError",
        ("Preempt: signal SIGKILL cannot be a preemption notice", "RankKilled"),
        lambda e: e.api(Preempt, step=2, signal=signal.SIGKILL),
    ),
    Row(
        "fault-plan-single-fault",
        "API",
        "FaultError",
        ("faults must be a list of faults", "RankCrash(rank=1, step=2"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults=RankCrash(rank=1, step=2)),
    ),
    Row(
        "fault-plan-string",
        "API",
        "FaultError",
        ("faults must be a list of faults", "got str"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults="[EmptyBatch(rank=1, step=1)]"),
    ),
    Row(
        "fault-plan-none",
        "API",
        "FaultError",
        ("faults must be a list of faults", "got None"),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults=None),
    ),
    Row(
        "fault-plan-not-a-fault",
        "API",
        "FaultError",
        ("faults[1] is None",),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults=[EmptyBatch(rank=1, step=1), None]),
    ),
    Row(
        "fault-rank-beyond-world",
        "API",
        "FaultError",
        ("rank 5", "world of 4"),
        lambda e: e.api(run_world, takes_ctx, world_size=4, faults=[EmptyBatch(rank=5, step=1)]),
    ),
    Row(
        "fault-plan-conflict-ends",
        "API",
        "FaultError",
        ("faults[0] RankCrash(", "conflict on rank 1 at step 2"),
        lambda e: e.api(
            run_world, takes_ctx, world_size=2, faults=[RankCrash(rank=1, step=2), RankKilled(rank=1, step=2)]
        ),
    ),
    Row(
        "fault-plan-conflict-one-event",
        "API",
        "FaultError",
        ("conflict on rank 1 at step 2", "both empty the batch"),
        lambda e: e.api(
            run_world, takes_ctx, world_size=2, faults=[EmptyBatch(rank=1, step=2), EmptyBatch(rank=1, step=2)]
        ),
    ),
    Row(
        "fault-positional-arguments",
        "API",
        "FaultArgumentError",
        ("RankCrash", "keyword-only"),
        lambda e: e.api(RankCrash, 1, 2),
    ),
    Row(
        "fault-unknown-argument",
        "API",
        "FaultArgumentError",
        ("EmptyBatch", "'steps'"),
        lambda e: e.api(EmptyBatch, rank=1, steps=2),
    ),
    Row(
        "fault-step-negative",
        "API",
        "FaultError",
        ("EmptyBatch", "got -1"),
        lambda e: e.api(EmptyBatch, rank=1, step=-1),
    ),
    Row(
        "fault-op-unknown",
        "API",
        "FaultError",
        ("SkippedCollective", "'allreduce'"),
        lambda e: e.api(SkippedCollective, rank=1, step=1, op="allreduce"),
    ),
    Row(
        "fault-signal-does-not-kill",
        "API",
        "FaultError",
        ("RankKilled", "SIGCHLD"),
        lambda e: e.api(RankKilled, rank=1, step=1, signal=signal.SIGCHLD),
    ),
    Row(
        "fault-slow-link-delay-not-positive",
        "API",
        "FaultError",
        ("SlowLink: delay must be a positive finite number of seconds", "got 0"),
        lambda e: e.api(SlowLink, rank=1, step=1, op="all_reduce", delay=0),
    ),
    Row(
        "fault-link-op-unknown",
        "API",
        "FaultError",
        (
            "DroppedLink: op must be None, 'ddp_bucket', one of 'fsdp_all_gather', 'fsdp_reduce_scatter', 'dcp' or a "
            "torch.distributed collective",
            "'allreduce'",
        ),
        lambda e: e.api(DroppedLink, rank=1, step=1, op="allreduce"),
    ),
    Row(
        "fault-crash-op-unknown",
        "API",
        "FaultError",
        ("RankKilled: op must be None, 'ddp_bucket', one of 'fsdp_all_gather'", "got 'reduce_scatter_fsdp'"),
        lambda e: e.api(RankKilled, rank=1, step=1, op="reduce_scatter_fsdp"),
    ),
    Row(
        "fault-dcp-part-unknown",
        "API",
        "FaultError",
        ("TornDcpWrite: part must be one of 'shard', 'metadata'", "got 'data'"),
        lambda e: e.api(TornDcpWrite, writer=1, step=1, part="data"),
    ),
    Row(
        "fault-dcp-killed-not-bool",
        "API",
        "FaultError",
        ("TornDcpWrite: killed must be True or False", "got 'yes'"),
        lambda e: e.api(TornDcpWrite, writer=1, step=1, killed="yes"),
    ),
    Row(
        "fault-dcp-step-missing",
        "API",
        "FaultArgumentError",
        ("TornDcpWrite: missing a required argument: 'step'",),
        lambda e: e.api(TornDcpWrite, writer=1),
    ),
    Row(
        "fault-dcp-writer-negative",
        "API",
        "FaultError",
        ("AsyncSaveKilled: writer must be a non-negative int (a rank)", "got -1"),
        lambda e: e.api(AsyncSaveKilled, writer=-1, step=1),
    ),
    Row(
        "fault-dcp-rank-missing",
        "API",
        "FaultArgumentError",
        ("CheckpointNotVisible: missing a required argument: 'rank'",),
        lambda e: e.api(CheckpointNotVisible, step=2),
    ),
    Row(
        "fault-dcp-plan-conflict",
        "API",
        "FaultError",
        (
            "TornDcpWrite(writer=1, step=1) and faults[1] AsyncSaveKilled(writer=1, step=1) conflict",
            "on rank 1 at step 1",
        ),
        lambda e: e.api(
            run_world,
            takes_ctx,
            world_size=2,
            faults=[TornDcpWrite(writer=1, step=1), AsyncSaveKilled(writer=1, step=1)],
        ),
    ),
    Row(
        "fault-out-of-memory-rank-beyond-world",
        "API",
        "FaultError",
        ("OutOfMemory(rank=2, step=1): rank 2 does not exist in a world of 2 ranks",),
        lambda e: e.api(run_world, takes_ctx, world_size=2, faults=[OutOfMemory(rank=2, step=1)]),
    ),
    Row(
        "cli-faults-slow-link-delay",
        "CLI",
        "FaultError",
        ("ddpfaults: error: FaultError: SlowLink: delay must be a positive finite number of seconds", "got -1"),
        lambda e: e.cli(
            "run", "touch.py:touch", "--world-size", "2", "--faults", "[SlowLink(rank=1, step=1, delay=-1)]"
        ),
    ),
    Row(
        "cli-faults-single-fault",
        "CLI",
        "FaultError",
        ("--faults 'RankCrash(rank=1, step=2)'", "wrap it in a list: --faults '[RankCrash(rank=1, step=2)]'"),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--faults", "RankCrash(rank=1, step=2)"),
    ),
    Row(
        "cli-cwd-for-a-function",
        "CLI",
        "DDPFaultsError",
        ("--cwd is for scripts",),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--cwd", "."),
    ),
    Row(
        "fault-variant-single-fault",
        "declaration",
        "ScenarioError",
        ("variant naive", "EmptyBatch(rank=1, step=1)"),
        lambda e: e.api(variant, "naive", faults=EmptyBatch(rank=1, step=1)),
    ),
    # -- the ddpfaults(...) marker ----------------------------------------------------------------------------------
    Row(
        "marker-world-size-zero",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "world_size", "got 0"),
        lambda e: e.pytest(files=_marked("world_size=0")),
    ),
    Row(
        "marker-timeout-zero",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "timeout", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.pytest(files=_marked("timeout=0")),
    ),
    Row(
        "marker-stall-zero",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "stall", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.pytest(files=_marked("stall=0")),
    ),
    Row(
        "marker-unknown-keyword",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "unknown keyword 'wrold_size'"),
        lambda e: e.pytest(files=_marked("wrold_size=2")),
    ),
    Row(
        "marker-faults",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "faults are not a marker setting", "ddp_world.run(fn, faults=[...])"),
        lambda e: e.pytest(files=_marked("faults=[]")),
    ),
    Row(
        "marker-positional",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "keywords only", "(2,)"),
        lambda e: e.pytest(files=_marked("2")),
    ),
    Row(
        "marker-timeout-below-stall",
        "marker",
        "MarkerError",
        ("test_marked.py::test_marked", "timeout (1 s)", "timeout from the marker", "stall from default"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.pytest(files=_marked("timeout=1")),
    ),
    Row(
        "marker-on-a-scenario",
        "marker",
        "MarkerError",
        ("scenario_marked.py::marked", "world_size", "got 0"),
        lambda e: e.pytest(files={"scenario_marked": SCENARIO_MARKED}),
    ),
    # -- options (command line, environment, ini) -----------------------------------------------------------------
    Row(
        "option-world-size-zero",
        "option",
        "UsageError",
        ("DDPFAULTS_WORLD_SIZE", "'0'"),
        lambda e: e.pytest(env={"DDPFAULTS_WORLD_SIZE": "0"}),
    ),
    Row(
        "option-timeout-zero",
        "option",
        "UsageError",
        ("--ddpfaults-timeout", "'0'"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.pytest("--ddpfaults-timeout=0"),
    ),
    Row(
        "option-timeout-not-a-number",
        "option",
        "UsageError",
        ("--ddpfaults-timeout", "'abc'"),
        lambda e: e.pytest("--ddpfaults-timeout=abc"),
    ),
    Row(
        "option-stall-not-below-timeout",
        "option",
        "UsageError",
        ("stall 5 s (from --ddpfaults-stall)", "timeout 3 s (from DDPFAULTS_TIMEOUT)"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.pytest("--ddpfaults-stall=5", env={"DDPFAULTS_TIMEOUT": "3"}),
    ),
    Row(
        "option-seed-out-of-range",
        "option",
        "UsageError",
        ("--ddpfaults-seed", "'18446744073709551616'"),
        lambda e: e.pytest("--ddpfaults-seed=18446744073709551616"),
    ),
    Row(
        "option-peer-failure-unknown",
        "option",
        "UsageError",
        ("ini option ddpfaults_peer_failure", "'explode'"),
        lambda e: e.pytest(ini="ddpfaults_peer_failure = explode"),
    ),
    Row(
        "option-report-is-a-directory",
        "option",
        "UsageError",
        ("--ddpfaults-report", "'reports'", "it is a directory"),
        lambda e: e.pytest("--ddpfaults-report=reports"),
    ),
    Row(
        "option-html-is-a-directory",
        "option",
        "UsageError",
        ("--ddpfaults-html", "'reports'", "it is a directory"),
        lambda e: e.pytest("--ddpfaults-html=reports"),
    ),
    Row(
        "option-trace-parent-is-a-file",
        "option",
        "UsageError",
        ("--ddpfaults-trace", "'afile/trace.json'", "afile is a file, not a directory"),
        lambda e: e.pytest("--ddpfaults-trace=afile/trace.json"),
    ),
    Row(
        "option-flight-recorder-is-a-file",
        "option",
        "UsageError",
        ("DDPFAULTS_FLIGHT_RECORDER", "'afile'", "it is a file, not a directory"),
        lambda e: e.pytest(env={"DDPFAULTS_FLIGHT_RECORDER": "afile"}),
    ),
    Row(
        "option-report-not-writable",
        "option",
        "UsageError",
        ("--ddpfaults-report", "'locked/worlds.json'", "is not writable"),
        lambda e: e.pytest("--ddpfaults-report=locked/worlds.json"),
    ),
    Row(
        "option-two-reports-one-file",
        "option",
        "UsageError",
        ("--ddpfaults-trace and --ddpfaults-report", "'worlds.json'"),
        lambda e: e.pytest("--ddpfaults-report=worlds.json", "--ddpfaults-trace=worlds.json"),
    ),
    Row(
        "option-show-not-a-bool",
        "option",
        "UsageError",
        ("--ddpfaults-show", "'maybe'", "true or false"),
        lambda e: e.pytest("--ddpfaults-show=maybe"),
    ),
    Row(
        "option-scenario-files-empty",
        "option",
        "UsageError",
        ("--ddpfaults-scenario-files", "' '"),
        lambda e: e.pytest("--ddpfaults-scenario-files= "),
    ),
    # -- python -m ddpfaults ----------------------------------------------------------------------------------------
    Row(
        "cli-world-size-zero",
        "CLI",
        "InvalidWorldSize",
        ("world_size", "got 0"),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "0"),
    ),
    Row(
        "cli-max-restarts-negative",
        "CLI",
        "ConfigError",
        ("max_restarts must be an int >= 0", "got -1"),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--max-restarts", "-1"),
    ),
    Row(
        "cli-timeout-zero",
        "CLI",
        "InvalidTimeout",
        ("timeout", "got 0"),
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--timeout", "0"),
    ),
    Row(
        "cli-json-is-a-directory",
        "CLI",
        "ReportFileError",
        ("--json", "'out'", "it is a directory"),
        lambda e: e.mkdir("out").cli("run", "touch.py:touch", "--world-size", "2", "--json", "out"),
    ),
    Row(
        "cli-kwargs-not-a-dict",
        "CLI",
        "DDPFaultsError",
        ("--kwargs '[1, 2]'", "expected a dict"),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--kwargs", "[1, 2]"),
    ),
    Row(
        "cli-kwargs-unbound",
        "CLI",
        "InvalidArguments",
        ("touch.touch(ctx)", "steps=3", "unexpected keyword argument 'steps'"),
        lambda e: e.cli("run", "touch.py:touch", "--world-size", "2", "--kwargs", "{'steps': 3}"),
    ),
    Row(
        "cli-function-file-missing",
        "CLI",
        "DDPFaultsError",
        ("function 'missing.py:fn'", "file 'missing.py' not found"),
        lambda e: e.cli("run", "missing.py:fn", "--world-size", "2"),
    ),
    Row(
        "cli-function-name-missing",
        "CLI",
        "DDPFaultsError",
        ("function 'touch.py:nope'", "touch has no attribute 'nope'"),
        lambda e: e.cli("run", "touch.py:nope", "--world-size", "2"),
    ),
    Row(
        "cli-function-file-fails-to-import",
        "CLI",
        "ScenarioError",
        ("broken.py failed to import", "ModuleNotFoundError", "no_such_module_here"),
        lambda e: e.file("broken.py", "import no_such_module_here\n").cli("run", "broken.py:fn", "--world-size", "2"),
    ),
    Row(
        "cli-function-module-missing",
        "CLI",
        "DDPFaultsError",
        ("function 'no_such_pkg:fn'", "No module named 'no_such_pkg'"),
        lambda e: e.cli("run", "no_such_pkg:fn", "--world-size", "2"),
    ),
    Row(
        "cli-html-output-is-a-directory",
        "CLI",
        "ReportFileError",
        ("the page", "'out'", "it is a directory"),
        lambda e: e.mkdir("out").cli("html", e.report(), "-o", "out"),
    ),
    Row(
        "cli-trace-output-parent-is-a-file",
        "CLI",
        "ReportFileError",
        ("the trace", "afile/t.json", "afile is a file, not a directory"),
        lambda e: e.cli("trace", e.report(), "-o", str(e.path("afile")) + "/t.json"),
    ),
    # -- torchrun ... -m ddpfaults.launch ---------------------------------------------------------------------------
    Row(
        "torchrun-fault-attempt-beyond-restarts",
        "torchrun",
        "FaultError",
        ("train[late_fault]", "attempt=2", "max_restarts=1 never reaches"),
        lambda e: e.torchrun("late_fault", 1),
    ),
    Row(
        "torchrun-max-restarts-disagree",
        "torchrun",
        "ConfigError",
        ("train[one_restart]", "max_restarts=1", "--max-restarts 0"),
        lambda e: e.torchrun("one_restart", 0),
    ),
    Row(
        "torchrun-check-resume",
        "torchrun",
        "ConfigError",
        ("train[resume_checked]", "resume check", "python -m ddpfaults matrix"),
        lambda e: e.torchrun("resume_checked", 0),
    ),
    Row(
        "torchrun-restarts-without-agent-store",
        "torchrun",
        "ConfigError",
        ("train[one_restart]", "--max-restarts 1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"),
        lambda e: e.torchrun("one_restart", 1, TORCHELASTIC_USE_AGENT_STORE="False"),
    ),
]

# -- the table --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRow:
    """One row of docs/bad-input.md."""

    id: str
    input: str
    where: str
    error: str
    message: str


def table() -> list[TableRow]:
    """Every row of every table in docs/bad-input.md whose first cell is an id (words joined by hyphens)."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 5 and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", cells[0]):
            rows.append(TableRow(*(c.strip("`") for c in cells)))
    return rows


def test_table_and_cases_agree():
    """Every row of the table has a case here and every case a row; ids are unique; each row's place is one of
    WHERE and says what its case says."""
    rows, cases = table(), {row.id: row for row in ROWS}
    ids = [r.id for r in rows]
    assert len(set(ids)) == len(ids), f"ids repeat in {DOC.name}: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert len(cases) == len(ROWS), "case ids repeat"
    assert sorted(set(ids) - set(cases)) == [], f"rows of {DOC.name} without a case in {__file__}"
    assert sorted(set(cases) - set(ids)) == [], f"cases without a row in {DOC.name}"
    for row in rows:
        assert row.where in WHERE, row
        assert (row.where, row.error) == (cases[row.id].where, cases[row.id].error), row


@pytest.fixture
def env(tmp_path, monkeypatch, request):
    """Where a case runs (see :class:`Env`)."""
    return Env(tmp_path, monkeypatch, request)


@pytest.mark.parametrize("case", ROWS, ids=[row.id for row in ROWS])
def test_bad_input_is_refused_before_anything_starts(case, env):
    if case.id == "option-report-not-writable" and os.geteuid() == 0:
        pytest.skip("root writes in a directory of mode 0o500: nothing to refuse")
    refusal = case.provoke(env)
    assert refusal.error == case.error, refusal.message
    for name in case.names:
        assert name in refusal.message, (name, refusal.message)
    assert not refusal.started, f"something started before the refusal: {refusal.message}"
    documented = {row.id: row for row in table()}[case.id]
    for piece in documented.message.split("…"):
        assert piece.strip() in refusal.message, (piece, refusal.message)


def test_the_doc_is_linked_from_the_readme():
    assert "docs/bad-input.md" in (DOC.parents[1] / "README.md").read_text()


# -- what is not refused, and the checks' own logic ------------------------------------------------------------------


def test_zero_is_a_value_none_is_unset():
    """None leaves a setting to the defaults; 0 is a value (and refused where it is not valid)."""
    declared = scenario(world_size=None, timeout=None, stall=None)(takes_ctx).__ddpfaults_scenario__
    assert declared.cases()[0].resolve(RunSpec(world_size=3)).spec.world_size == 3
    assert ddpfaults.spec.check_declared(world_size=None, seed=0) == {"seed": 0}


def test_callables_without_a_signature_are_accepted():
    """A builtin whose signature inspect cannot read is not refused (the call itself will tell)."""
    with pytest.raises(ValueError):
        inspect.signature(max)
    assert ddpfaults.spec.check_call(max, (1,), {}) == ((1,), {})


def test_a_missing_report_folder_is_created_not_refused(tmp_path):
    """Missing folders on the way to a report are no problem: every writer creates them."""
    assert ddpfaults.spec.output_problem(tmp_path / "new" / "deeper" / "worlds.json") is None
    assert ddpfaults.spec.output_problem(tmp_path / "new" / "fr", directory=True) is None


def test_an_unwritable_folder_is_named(tmp_path, monkeypatch):
    """The reason names the nearest existing folder when it is not writable (os.access stands in for a user
    without the permission: the tests may run as root, who may write anywhere)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(tmp_path) else real(p, mode))
    assert ddpfaults.spec.output_problem(tmp_path / "a" / "worlds.json") == f"the directory {tmp_path} is not writable"
    assert ddpfaults.spec.output_problem(tmp_path, directory=True) == "the directory is not writable"


def test_show_takes_true_or_false_and_the_flag_alone_means_true(pytester, monkeypatch):
    """--ddpfaults-show, --ddpfaults-show=true and --ddpfaults-show=false all parse (the help says true or false)."""
    isolate(
        pytester,
        monkeypatch,
        test_show="""
from ddpfaults.plugin import SETTINGS


def test_show(request):
    print("SHOW", request.config.stash[SETTINGS].show)
""",
    )
    seen = {}
    for args in ((), ("--ddpfaults-show",), ("--ddpfaults-show=true",), ("--ddpfaults-show=false",)):
        result = pytester.runpytest_inprocess("-p", "ddpfaults", "-s", *args)
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
        seen[args] = re.search(r"SHOW (\w+)", result.stdout.str()).group(1)
    assert list(seen.values()) == ["False", "True", "True", "False"]
    help_text = pytester.runpytest_inprocess("-p", "ddpfaults", "--help").stdout.str()
    assert "--ddpfaults-show=[BOOL]" in help_text and "true or false" in help_text
