"""The same scenario module under torchrun (gloo on localhost) and under the local engine: same verdicts."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
import torch

from ddpfaults.judge.results import Divergence
from ddpfaults.scenario import builtin_dir
from ddpfaults.spec import RunSpec
from ddpfaults.torchrun.worker import load_case
from ddpfaults.torchrun.worker import main as worker_main
from processes import EVENT_GUARD

pytestmark = pytest.mark.slow  # torchrun's own processes: run apart (pyproject.toml)

SCENARIO = textwrap.dedent('''
    """All-reduce steps that complete, hang or crash; rank 0 killed; rank 0 raising where completion is expected."""
    import os
    import signal

    import torch
    import torch.distributed as dist

    import ddpfaults
    from ddpfaults.faults import RankCrash, SkippedCollective

    CRASH = KeyError("segment_mask")


    # fixed: a long stall: the completing variant runs under torchrun's agent on a loaded machine
    @ddpfaults.scenario(stall=10.0, variants=[
        ddpfaults.variant("completes", expect="completed"),
        # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
        ddpfaults.variant("hangs", faults=[SkippedCollective(rank=1, step=2)], stall=1.0,
                          expect="hung on rank 1 in all_reduce"),
        ddpfaults.variant("crashes", faults=[RankCrash(rank=1, step=2, exc=CRASH)],
                          expect="crashed with KeyError on rank 1"),
        ddpfaults.variant("rank0_killed", kwargs={"kill": 0}, expect="crashed on rank 0"),
        ddpfaults.variant("rank0_raises_unexpected", faults=[RankCrash(rank=0, step=2, exc=CRASH)],
                          expect="completed"),
    ])
    def steps(ctx, steps=4, kill=None):
        """Every step all-reduces a tensor (on ctx.device: the CPU on gloo, the rank's GPU on NCCL)."""
        t = torch.ones(1, device=ctx.device)
        for step in range(steps):
            ctx.step(step)
            if ctx.rank == kill and step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
        return float(t)
''')

RESTARTED = textwrap.dedent('''
    """A checkpointing all-reduce loop under torchrun --max-restarts 1: killed and resumed; a fault of the restart
    only; a verdict reached before the last attempt; every rank killed at once."""
    import os
    import signal

    import torch
    import torch.distributed as dist

    import ddpfaults
    from ddpfaults.faults import RankCrash, RankKilled

    CRASH = KeyError("segment_mask")


    # fixed: a long stall: no hang is expected; a restart's rendezvous waits are never taken for one
    @ddpfaults.scenario(max_restarts=1, stall=10.0, variants=[
        ddpfaults.variant("killed", faults=[RankKilled(rank=1, step=2)], expect="completed"),
        ddpfaults.variant(
            "crash_in_restart",
            kwargs={"resume": False},
            faults=[RankCrash(rank=1, step=3, exc=CRASH), RankCrash(rank=0, step=1, exc=CRASH, attempt=1)],
            expect="crashed with KeyError on rank 0",
        ),
        ddpfaults.variant("unexpected", expect="crashed"),
        ddpfaults.variant("all_killed", kwargs={"kill_all": 2}, expect="completed"),
    ])
    def checkpointed(ctx, steps=4, resume=True, kill_all=None):
        """Every step all-reduces, then rank 0 saves the steps done into ctx.shared_dir; returns the step it resumed
        from (0: no checkpoint, or ``resume=False``). In attempt 0 at step ``kill_all``, rank 0 SIGKILLs every rank,
        itself last (as an OOM killer ending the job's cgroup does): no rank is left to judge the attempt."""
        path = os.path.join(ctx.shared_dir, "done")
        start = int(open(path).read()) if resume and os.path.exists(path) else 0
        pids = [None] * ctx.world_size
        dist.all_gather_object(pids, os.getpid())
        t = torch.ones(1)
        for step in range(start, steps):
            ctx.step(step)
            if ctx.rank == 0 and ctx.attempt == 0 and step == kill_all:
                for pid in sorted(pids, key=lambda pid: pid == os.getpid()):
                    os.kill(pid, signal.SIGKILL)
            dist.all_reduce(t)
            if ctx.rank == 0:
                with open(path + ".tmp", "w") as f:
                    f.write(str(step + 1))
                os.replace(path + ".tmp", path)
        return start
''')

NO_GPU = "NCCL needs CUDA GPUs: torch.cuda.is_available() is False on this machine"


@pytest.fixture
def scenario(tmp_path):
    """``spec(variant)``: the case spec of a variant of the scenario module written into ``tmp_path``."""
    path = tmp_path / "scenario_tr.py"
    path.write_text(SCENARIO)
    return lambda variant: f"{path}::steps[{variant}]"


def _survivors(markers) -> list[str]:
    """Live processes whose command line or environment mentions one of ``markers``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().decode(errors="replace")
            except OSError:
                environ = ""
        except OSError:
            continue
        if int(pid) != os.getpid() and any(m in cmdline or m in environ for m in markers):
            found.append(f"{pid}: {cmdline[:160]}")
    return found


def torchrun(tmp_path, nproc: int, spec: str, *extra: str, limit: float = EVENT_GUARD, restarts: int = 0):
    """Run ``spec`` under torchrun (c10d rendezvous on a free localhost port, ``--max-restarts restarts``); return
    (exit code, world, wall s).

    Afterwards no process of the run (agent, ranks, their children) nor its temp dirs may be left: the census.
    """
    run_id = f"ddpf-{uuid.uuid4().hex[:12]}"
    report = tmp_path / f"{run_id}.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        f"--rdzv-id={run_id}",
        f"--max-restarts={restarts}",
        f"--log-dir={tmp_path / 'torchelastic'}",  # else torchrun leaves a torchelastic_* dir in /tmp per run
        "-m",
        "ddpfaults.launch",
        spec,
        "--report",
        str(report),
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True
    )
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {limit} s:\n{output[-3000:]}")
    wall = time.monotonic() - started
    deadline = time.monotonic() + EVENT_GUARD  # a rank's stderr tee ends a moment after the rank
    while (left := _survivors([run_id])) and time.monotonic() < deadline:
        # fixed: the poll interval: the event ends the wait, this only spaces the looks
        time.sleep(0.05)
    assert not left, f"processes of the torchrun world survived it: {left}"
    dirs = [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("ddpfaults-torchrun-") and run_id in d]
    assert not dirs, f"the torchrun world left temp dirs behind: {dirs}"
    world = json.loads(report.read_text())["worlds"][0] if report.exists() else None
    assert world is not None, f"no report written (exit {proc.returncode}):\n{output[-3000:]}"
    world["_output"] = output
    return proc.returncode, world, wall


def _judged_as_locally(world: dict, spec: str, nproc: int) -> None:
    """The torchrun world's verdict, root-cause rank and first divergent collective are the local engine's for the
    same case (the same collective, call site, step and ranks; whether a call had completed depends on when it was
    read)."""
    local = load_case(spec).run(RunSpec(world_size=nproc))
    assert (world["outcome"], world["root_rank"]) == (str(local.outcome), local.root_rank), world["root_cause"]
    divergence = Divergence.from_dict(world["divergence"]) if world["divergence"] else None
    assert (divergence and divergence.describe()) == (local.divergence and local.divergence.describe())


#: each outcome once: completed and hung here, crashed in the rank-0 tests below (a crash of a rank that holds no
#: seat is the local engine's everyday case; under torchrun rank 0 raising is the one that can go wrong)
@pytest.mark.parametrize("nproc, variant", [(2, "completes"), (3, "hangs")])
def test_torchrun_verdict_matches_the_local_engine(tmp_path, scenario, nproc, variant):
    code, world, _ = torchrun(tmp_path, nproc, scenario(variant))
    assert code == 0, f"the verdict did not match the expectation:\n{world['_output'][-3000:]}"
    assert world["expectation"]["held"] is True and world["expectation"]["mismatches"] == []
    assert world["world_size"] == nproc and world["start_method"] == "torchrun"
    assert world["nodeid"].endswith(f"scenario_tr.py::steps[{variant}]")
    _judged_as_locally(world, scenario(variant), nproc)
    assert all(r["recorder"] == "flight recorder" for r in world["ranks"]), [r["recorder"] for r in world["ranks"]]
    ranks = world["ranks"]
    if variant == "completes":
        assert world["outcome"] == "completed" and [r["value"] for r in ranks] == [float(nproc**4)] * nproc
    else:
        assert world["outcome"] == "hung" and world["root_rank"] == 1
        assert world["reason"].startswith("deadlock proved"), world["reason"]  # rank 1 finished a collective short
        formed, verdict = world["events"]
        latency = verdict["t"] - formed["t"]  # from the deadlock forming (the last rank's stand) to the verdict
        assert formed["k"] == "deadlock" and latency < world["stall"], f"hang verdict {latency:.2f} s after it formed"
        for r in ranks:
            if r["rank"] != 1:
                assert r["state"] == "blocked" and "in all_reduce" in r["stack"] and "scenario_tr.py" in r["stack"]


def test_rank0_killed_is_still_judged(tmp_path, scenario):
    """rank 0 holds the judge's seat: killed, another rank takes the seat."""
    code, world, _ = torchrun(tmp_path, 2, scenario("rank0_killed"))
    assert world["outcome"] == "crashed" and world["root_rank"] == 0, world["root_cause"]
    assert world["ranks"][0]["state"] == "died" and world["ranks"][1]["collateral"]
    assert "takes over judging" in world["_output"]
    assert code != 0  # torchrun itself fails a world where a worker died by a signal, whatever the verdict


def test_rank0_raising_is_still_judged_and_an_unexpected_verdict_fails_torchrun(tmp_path, scenario):
    """rank 0 holds the judge's seat: raising, it keeps judging (the crash is its own, named; its peer's error is
    collateral), as the local engine judges the case; the verdict is not the expected one (``completed``), so the
    world fails torchrun with exit 1 and the report says why, as data."""
    code, world, _ = torchrun(tmp_path, 2, scenario("rank0_raises_unexpected"))
    assert world["outcome"] == "crashed" and world["root_rank"] == 0, world["root_cause"]
    assert world["ranks"][0]["error"] == "KeyError: 'segment_mask'" and not world["ranks"][0]["collateral"]
    assert world["ranks"][1]["collateral"] and "by peer" in world["ranks"][1]["error"], world["ranks"]
    _judged_as_locally(world, scenario("rank0_raises_unexpected"), 2)
    assert code == 1, world["_output"][-3000:]
    assert "expected completed, observed crashed: MISMATCH" in world["_output"]
    expectation = world["expectation"]
    assert expectation["held"] is False and expectation["text"] == "completed"
    assert [(m["kind"], m["expected"], m["observed"]) for m in expectation["mismatches"]] == [
        ("outcome", "completed", "crashed")
    ]


@pytest.fixture
def restarted(tmp_path):
    """``spec(variant)``: the case spec of a variant of the checkpointing scenario written into ``tmp_path``."""
    path = tmp_path / "scenario_restarted.py"
    path.write_text(RESTARTED)
    return lambda variant: f"{path}::checkpointed[{variant}]"


def _attempts(world: dict) -> list[tuple]:
    return [(a["attempt"], a["outcome"], a["steps"], a["fired"]) for a in world["attempts"]]


def test_a_killed_world_is_restarted_by_torchrun_and_resumes_from_its_checkpoint(tmp_path, restarted):
    """torchrun --max-restarts 1: attempt 0 (rank 1 killed at step 2) ends in a restart, attempt 1 resumes from the
    checkpoint attempt 0 left in ctx.shared_dir and completes; its report carries both attempts; torchrun exits 0;
    nothing is left behind (the shared dir goes with the last attempt)."""
    code, world, _ = torchrun(tmp_path, 2, restarted("killed"), restarts=1)
    output = world["_output"]
    assert code == 0, output[-3000:]
    assert "attempt 0: crashed; torchrun restarts the world" in output
    assert _attempts(world) == [
        (0, "crashed", [2, 2], ["RankKilled(rank=1, step=2) fired on rank 1 at step 2 (on_step)"]),
        (1, "completed", [3, 3], []),
    ]
    assert world["attempts"][0]["root_rank"] == 1 and "killed by SIGKILL" in world["attempts"][0]["root_cause"]
    assert world["outcome"] == "completed" and world["expectation"]["held"] is True
    assert [r["value"] for r in world["ranks"]] == [2, 2]  # both ranks of attempt 1 resumed at step 2
    assert [f["fault"] for f in world["fired"]] == ["RankKilled(rank=1, step=2)"] and world["unfired"] == []
    assert "--max-restarts 1" in world["replay"]


def test_a_fault_of_attempt_1_acts_in_the_restart_only(tmp_path, restarted):
    """RankCrash(rank=0, step=1, attempt=1): attempt 0 passes step 1 (rank 1 crashes at step 3), the restart
    crashes on rank 0 at step 1; the last attempt's verdict is the world's, as expected (exit 0)."""
    code, world, _ = torchrun(tmp_path, 2, restarted("crash_in_restart"), restarts=1)
    assert code == 0, world["_output"][-3000:]
    crash = "exc=KeyError('segment_mask')"
    assert _attempts(world) == [
        (0, "crashed", [3, 3], [f"RankCrash(rank=1, step=3, {crash}) fired on rank 1 at step 3 (on_step)"]),
        (1, "crashed", [1, 1], [f"RankCrash(rank=0, step=1, {crash}, attempt=1) fired on rank 0 at step 1 (on_step)"]),
    ]
    assert [a["root_rank"] for a in world["attempts"]] == [1, 0]
    assert (world["outcome"], world["root_rank"]) == ("crashed", 0) and world["unfired"] == []
    assert [r["value"] for r in world["ranks"]] == [None, None]


def test_a_verdict_before_the_last_attempt_is_the_worlds(tmp_path, restarted):
    """Attempt 0 completes where a crash was expected: its verdict is the world's (exit 1, so torchrun restarts:
    the restart's workers end at once with the same code, running nothing)."""
    code, world, _ = torchrun(tmp_path, 2, restarted("unexpected"), restarts=1)
    output = world["_output"]
    assert code == 1, output[-3000:]
    assert _attempts(world) == [(0, "completed", [3, 3], [])]
    assert world["expectation"]["held"] is False
    assert output.count("expected crashed, observed completed: MISMATCH") == 1
    assert output.count("ddpfaults: the world's verdict came before attempt 1 (exit 1)") == 1


def test_an_attempt_that_left_no_verdict_is_reported_as_such(tmp_path, restarted):
    """Every rank of attempt 0 SIGKILLed at once: no rank lives to judge it, so its judge stores no verdict and
    torchrun restarts the world on the dead workers alone. The last attempt resumes from the checkpoint and
    completes; attempt 0 is reported crashed with no verdict: no root cause, rank, steps or seconds."""
    code, world, _ = torchrun(tmp_path, 2, restarted("all_killed"), restarts=1)
    output = world["_output"]
    assert code == 0, output[-3000:]
    assert "torchrun restarts the world" not in output  # attempt 0 was never judged
    assert _attempts(world) == [(0, "crashed", [], []), (1, "completed", [3, 3], [])]
    lost = world["attempts"][0]
    assert (lost["reason"], lost["root_rank"], lost["seconds"]) == ("no verdict in torchrun's store", None, None)
    assert lost["root_cause"].startswith("no verdict: attempt 0 left none in torchrun's store"), lost["root_cause"]
    assert f"  attempt 0: crashed; {lost['root_cause']}\n" in output
    assert world["outcome"] == "completed" and world["root_rank"] is None and world["expectation"]["held"] is True
    assert [r["value"] for r in world["ranks"]] == [2, 2]  # attempt 1 resumed after attempt 0's steps 0 and 1
    assert world["fired"] == [] and world["unfired"] == []


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scripts")


def script_case(tmp_path, name: str, script: str, fault: str, **settings) -> str:
    """The spec of a case written into ``tmp_path``: ``tests/support/scripts/<script>`` under ``fault`` (its source
    text), expected to complete, with a 10 s stall and ``settings``."""
    given = "".join(f"{key}={value!r}, " for key, value in settings.items())
    path = tmp_path / f"scenario_{name}.py"
    path.write_text(
        f"import ddpfaults\nfrom ddpfaults.faults import {fault.split('(')[0]}\n\n"
        # fixed: a long stall: no hang is expected; torchrun restarts a killed rank, which is no hang
        f"{name} = ddpfaults.script_scenario({os.path.join(SCRIPTS, script)!r}, name={name!r}, stall=10.0, {given}"
        f"faults=[{fault}], expect='completed')\n"
    )
    return f"{path}::{name}"


def test_a_killed_script_is_restarted_on_a_fresh_process_group_store(tmp_path):
    """A script case (tests/support/scripts/resume_loop.py, checkpointing into its working directory: torchrun's)
    killed at step 3 and restarted: its own env:// init_process_group gets the attempt's store, not the dead
    attempt's addresses (pytorch#135712), and it resumes from its checkpoint."""
    case = script_case(tmp_path, "loop", "resume_loop.py", "RankKilled(rank=1, step=3)", max_restarts=1)
    code, world, _ = torchrun(tmp_path, 2, case, restarts=1)
    output = world["_output"]
    assert code == 0, output[-3000:]
    assert [(a["outcome"], a["root_rank"]) for a in world["attempts"]] == [("crashed", 1), ("completed", None)]
    assert output.count("restart 1 port") == 2 and (tmp_path / "ckpt.pt").exists()
    assert world["attempts"][1]["steps"] in ([3, 3], [2, 2])  # 3 optimizer steps left after the checkpoint, not 6


def test_a_preempted_script_that_saves_with_dcp_is_reported_as_saved(tmp_path):
    """Preempt under torchrun: the notice reaches the script's own SIGTERM handler (the worker holds SIGTERM for
    torchrun's agent), every rank saves with dcp.save (tests/support/scripts/dcp_on_notice.py, unmodified), and the
    report's preemption says who got the notice, handled it and saved, from the ``saved`` events DCP's hook records
    in torchrun's workers."""
    case = script_case(tmp_path, "notice", "dcp_on_notice.py", "Preempt(step=2, grace=20)")
    code, world, _ = torchrun(tmp_path, 2, case)
    output = world["_output"]
    assert code == 0, output[-3000:]
    saves = [[(e["step"], e["file"]) for e in r["events"] if e["k"] == "saved"] for r in world["ranks"]]
    # the optimizer clock's step 2 starts in the script's loop step 1: that step's all-reduce carries the notice
    assert saves == [[(2, "ckpt-1")]] * 2, saves
    assert (tmp_path / "ckpt-1" / ".metadata").is_file() and output.count("saved ckpt-1") == 2
    assert all(e["k"] != "terminated" for r in world["ranks"] for e in r["events"])  # not taken for torchrun's
    assert world["preemption"] == {
        "fault": "Preempt(step=2, grace=20)",
        "step": 2,
        "notified": [0, 1],
        "handled": [0, 1],
        "saved": [0, 1],
        "killed_after_grace": [],
        "last_checkpoint_step": 2,
        "steps_lost": 0,
    }, world["preemption"]
    assert "saved after the notice by 0, 1" in output


def test_a_preempted_attempt_is_requeued_by_torchrun_and_its_preemption_kept(tmp_path):
    """Preempt with torchrun --max-restarts 1, as a scheduler requeues a preempted job: attempt 0 gets the notice at
    step 2, every rank saves with dcp.save and stops, and the attempt ends in a restart though no rank failed;
    attempt 1 (no notice: the fault acts in attempt 0) trains its 6 steps; the report keeps attempt 0's preemption."""
    case = script_case(tmp_path, "requeued", "dcp_on_notice.py", "Preempt(step=2, grace=20)", max_restarts=1)
    code, world, _ = torchrun(tmp_path, 2, case, restarts=1)
    output = world["_output"]
    assert code == 0, output[-3000:]
    assert [(a["attempt"], a["outcome"], a["steps"]) for a in world["attempts"]] == [
        (0, "completed", [2, 2]),
        (1, "completed", [6, 6]),
    ]
    preempted = world["attempts"][0]["preemption"]
    assert (preempted["handled"], preempted["saved"], preempted["steps_lost"]) == ([0, 1], [0, 1], 0), preempted
    assert world["attempts"][1]["preemption"] is None and world["outcome"] == "completed"
    assert output.count("saved ckpt-1") == 2  # attempt 0's ranks; attempt 1 was never notified


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the NCCL tests below run instead")
def test_nccl_without_cuda_is_a_clear_error(scenario, monkeypatch, capsys):
    """The worker's own entry point (in this process: the error comes before any process group or thread; the
    signal mask it sets first is restored) refuses NCCL without CUDA with exit code 2 and one line saying why."""
    torchrun_env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "29999",
    }
    for name, value in torchrun_env.items():
        monkeypatch.setenv(name, value)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        code = worker_main([scenario("completes"), "--backend", "nccl"])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert code == 2
    assert "--backend nccl needs CUDA GPUs, but torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("variant", ["completes", "hangs", "crashes"])
def test_nccl_verdicts(tmp_path, scenario, variant):
    """NCCL on one GPU per rank (unverified here: no GPU). NCCL collectives are asynchronous and NCCL peers of a
    failed rank wait rather than fail, so a hang may only be found at the timeout and a crash may judge hung."""
    nproc = min(2, torch.cuda.device_count())
    if nproc < 2:
        pytest.skip("NCCL tests need 2 GPUs")
    # fixed: NCCL's hang may only end at the timeout: 30 s (needs 2 GPUs: untested here)
    _, world, _ = torchrun(tmp_path, nproc, scenario(variant), "--backend", "nccl", "--timeout", "30")
    assert world["backend"] == "nccl"
    expected = {"completes": ("completed",), "hangs": ("hung",), "crashes": ("crashed", "hung")}[variant]
    assert world["outcome"] in expected, world["root_cause"]
    if variant == "crashes":
        assert world["root_rank"] == 1 and world["ranks"][1]["error"] == "KeyError: 'segment_mask'"


def test_a_script_scenario_runs_under_torchrun_as_locally(tmp_path):
    """A script case: torchrun's own worker environment reaches the unmodified script (the worker keeps it), the
    seams and the optimizer step clock work there, and the verdict equals the local script world's."""
    spec = os.path.join(builtin_dir(), "scenario_scripts.py") + "::empty_batch_script[early_return]"
    code, world, _ = torchrun(tmp_path, 2, spec)
    assert code == 0, f"the verdict did not match the expectation:\n{world['_output'][-3000:]}"
    _judged_as_locally(world, spec, 2)
    assert (world["outcome"], world["root_rank"]) == ("crashed", 1)
    assert "Expected to have finished reduction" in world["root_cause"]
    assert [f["rank"] for f in world["fired"]] == [1] and "DataLoader batch" in world["fired"][0]["how"]


def test_a_gpu_trainer_runs_under_torchrun_with_the_mapping_and_is_judged_as_locally(tmp_path):
    """scenario_gpu_script.py declares cuda_on_cpu: the torchrun worker maps CUDA in each rank as the local engine
    does (the GPU trainer copies its batches on a side CUDA stream, the CPU's one order, and trains to equal
    replicas), and its report says the mapping was on."""
    spec = os.path.join(builtin_dir(), "scenario_gpu_script.py::empty_batch_gpu_script[side_stream]")
    code, world, _ = torchrun(tmp_path, 2, spec)
    assert world["cuda_on_cpu"] is True and world["outcome"] == "completed", world["_output"][-3000:]
    assert code == 0 and world["expectation"]["held"], world["_output"][-3000:]
    _judged_as_locally(world, spec, 2)
