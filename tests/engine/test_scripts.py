"""Script worlds: an unmodified torchrun script on real gloo ranks, faults at torch's seams, judged like run_world."""

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from cli import ddpfaults_cli
from ddpfaults import Outcome, RankState, run_script
from ddpfaults.engine import census
from ddpfaults.engine.scripts import copy_cwd, world_directory
from ddpfaults.errors import ConfigError, ScriptError
from ddpfaults.faults import DeviceMismatch, EmptyBatch, RankCrash, RankKilled, SkippedCollective, UnevenInputs
from processes import EVENT_GUARD, WORLD_GUARD

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
PLAIN = os.path.join(SCRIPTS, "plain_train.py")
BAD = os.path.join(SCRIPTS, "bad_scripts.py")


def _no_survivors(result):
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []


def test_ranks_see_what_torchrun_gives_a_worker(tmp_path):
    result = run_script(os.path.join(SCRIPTS, "probe.py"), [str(tmp_path)], world_size=3, cwd=tmp_path)
    assert result.outcome == Outcome.COMPLETED, result.report()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    ports = {s["env"]["MASTER_PORT"] for s in seen}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for r, s in enumerate(seen):
        env = s["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["ROLE_RANK"], env["GROUP_RANK"]) == (str(r), str(r), str(r), "0")
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("3", "3", "3")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["TORCHELASTIC_RUN_ID"] and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert s["argv"] == [os.path.join(SCRIPTS, "probe.py"), str(tmp_path)]
        assert s["name"] == "__main__" and s["cwd"] == str(tmp_path) and s["path0"] == SCRIPTS
        assert s["world"] == [r, 3]
    assert [r.state for r in result.ranks] == [RankState.FINISHED] * 3  # sys.exit(0) is success
    _no_survivors(result)


def test_plain_script_completes_and_counts_optimizer_steps(tmp_path):
    checkpoint = tmp_path / "model.pt"
    result = run_script(PLAIN, ["--checkpoint", str(checkpoint)], world_size=2)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert checkpoint.exists()
    assert [r.last_step for r in result.ranks] == [4, 4]  # 4 optimizer steps: steps 0..3 began, then step 4
    steps = [e for e in result.ranks[0].events if e["k"] == "step"]
    assert [e["step"] for e in steps] == [0, 1, 2, 3, 4] and {e["clock"] for e in steps} == {"optimizer"}
    assert result.step_clock == "optimizer" and "steps counted by: optimizer" in result.report()
    assert any(c.note.startswith("DDP gradient bucket") for c in result.ranks[0].collectives)
    _no_survivors(result)


def test_scripts_that_free_ddp_after_destroying_their_group_never_deadlock():
    """plain_train.py destroys its group, then main() returns and frees its DDP model. ~ProcessGroupGloo used to
    deadlock there (the main thread joins a gloo thread holding the GIL that thread waits for): 8 of 10 fork-server
    worlds hung before destroyed groups were kept referenced (seams.keep_destroyed_groups)."""
    # fixed: a short stall a completing world must not trip: load never makes every rank wait (starved = computing)
    outcomes = [run_script(PLAIN, world_size=4, stall=5, timeout=WORLD_GUARD).outcome for _ in range(6)]
    assert outcomes == [Outcome.COMPLETED] * 6


def test_a_skipped_ddp_bucket_in_a_plain_script_names_the_rank_that_skipped():
    result = run_script(PLAIN, world_size=3, faults=[SkippedCollective(rank=1, step=1, op="ddp_bucket")])
    assert result.outcome != Outcome.COMPLETED and result.root_rank == 1, result.report()
    assert "DDP gradient bucket" in result.divergence.describe()
    _no_survivors(result)


def test_a_skip_without_op_in_a_plain_ddp_script_never_fires_and_names_op_ddp_bucket():
    """plain_train.py's steps have DDP's gradient buckets only: a SkippedCollective without op finds nothing to skip,
    and its never-fired message says which op would."""
    result = run_script(PLAIN, world_size=2, faults=[SkippedCollective(rank=1, step=2)], require_faults_fire=False)
    assert result.outcome == Outcome.COMPLETED and result.fired == [], result.report()
    (unfired,) = result.unfired
    assert unfired.finished == (1,) and "give op='ddp_bucket' to skip one" in unfired.describe()


def test_a_world_in_a_fresh_directory_replays_in_a_fresh_one_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with world_directory() as fresh:
        result = run_script(PLAIN, ["--checkpoint", "model.pt"], world_size=2, cwd=fresh)
        assert os.listdir(fresh) == ["model.pt"]
    assert result.outcome == Outcome.COMPLETED and not os.path.exists(fresh) and os.listdir(tmp_path) == []
    assert f"{PLAIN} --world-size 2" in result.replay and ' --cwd "$(mktemp -d)" ' in result.replay


def test_the_resume_check_s_copy_holds_the_files_a_run_may_write_and_links_what_it_only_reads(tmp_path):
    """A project directory as users have it: its data, a git repository, a virtual environment, caches. The copy's
    files are its own (rewritten in place, the original stays); history and environment are links to the originals
    (read as they are, never copied); caches are left out."""
    project = tmp_path / "project"
    for folder in ("data", ".git/objects", "venv/lib", "pkg/__pycache__", ".pytest_cache"):
        (project / folder).mkdir(parents=True)
    (project / "data" / "train.bin").write_bytes(b"tokens")
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (project / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"pyc")
    (project / "pkg" / "m.py").write_text("x = 1\n")
    copy = tmp_path / "copy"
    copy_cwd(str(project), str(copy))
    (copy / "data" / "train.bin").write_bytes(b"rewritten")
    assert (project / "data" / "train.bin").read_bytes() == b"tokens"
    assert (copy / "pkg" / "m.py").read_text() == "x = 1\n"
    assert os.readlink(copy / ".git") == str(project / ".git") and (copy / ".git" / "HEAD").is_file()
    assert os.readlink(copy / "venv") == str(project / "venv")
    assert not (copy / "pkg" / "__pycache__").exists() and not (copy / ".pytest_cache").exists()


def test_a_world_given_a_directory_replays_from_any_directory(tmp_path, capsys, monkeypatch):
    """The replay line of a world run in a directory it was given (a pytest test's temporary one) names that
    directory absolutely: run from another directory it reruns the same world there (it once carried a --cwd
    relative to where the test ran, which led nowhere from anywhere else). The line is split as a shell would and
    run in this process."""
    workdir, elsewhere = tmp_path / "work", tmp_path / "elsewhere" / "deeper"
    workdir.mkdir(), elsewhere.mkdir(parents=True)
    result = run_script(PLAIN, ["--checkpoint", "model.pt"], world_size=2, cwd=str(workdir))
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert f" --cwd {workdir} " in result.replay, result.replay
    os.remove(workdir / "model.pt")
    program, *argv = shlex.split(result.replay)
    assert program == "python" and argv[:2] == ["-m", "ddpfaults"], result.replay
    replayed = ddpfaults_cli(capsys, monkeypatch, *argv[2:], cwd=elsewhere)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert (workdir / "model.pt").exists() and os.listdir(elsewhere) == []


def test_naive_empty_batch_names_the_rank_that_left_early():
    """Ground truth (plain torchrun, see test_plain_torchrun_ground_truth): the empty rank skips a step, so it
    runs out of batches first, destroys its process group and exits 0; its peers, still in their last gradient
    all_reduce, crash with "Connection closed by peer". The report must blame the rank that left, not its peers."""
    result = run_script(PLAIN, world_size=4, faults=[EmptyBatch(rank=1, step=1)])
    assert result.outcome == Outcome.CRASHED, result.report()
    assert result.ranks[1].state == RankState.FINISHED
    # gloo tells a peer "Connection closed by peer" or, racing the exit, "Connection reset by peer"
    assert all(result.ranks[r].collateral and "by peer" in result.ranks[r].error for r in (0, 2, 3)), result.report()
    assert result.root_rank == 1, result.report()
    assert result.divergence is not None and result.divergence.odd_ranks == (1,)
    assert [f.rank for f in result.fired] == [1] and "changed DataLoader batch 1" in result.fired[0].how
    assert "--faults '[EmptyBatch(rank=1, step=1)]'" in result.replay and "run " + os.path.relpath(PLAIN)
    _no_survivors(result)


def test_fixed_empty_batch_completes():
    result = run_script(PLAIN, ["--strategy", "fixed"], world_size=4, faults=[EmptyBatch(rank=1, step=1)])
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [r.last_step for r in result.ranks] == [4] * 4
    assert len(result.fired) == 1


def test_step_faults_act_on_the_optimizer_clock_and_the_dataloader_clock():
    crashed = run_script(PLAIN, world_size=2, faults=[RankCrash(rank=1, step=2)])
    assert crashed.outcome == Outcome.CRASHED and crashed.root_rank == 1
    assert crashed.ranks[1].error == "RuntimeError: injected crash" and crashed.ranks[1].last_step == 2
    assert crashed.ranks[1].site.startswith("plain_train.py:"), crashed.ranks[1].site  # at the user's optimizer.step()
    by_batch = run_script(PLAIN, world_size=2, faults=[RankCrash(rank=0, step=3)], step_clock="dataloader")
    assert by_batch.root_rank == 0 and by_batch.ranks[0].last_step == 3
    assert {e.get("clock") for e in by_batch.ranks[0].events if e["k"] == "step"} == {"dataloader"}
    _no_survivors(by_batch)


def test_rank_killed_is_reported_as_died():
    result = run_script(PLAIN, world_size=3, faults=[RankKilled(rank=2, step=1)])
    assert result.outcome == Outcome.CRASHED and result.root_rank == 2, result.report()
    assert result.ranks[2].state == RankState.DIED and "SIGKILL" in result.ranks[2].error
    _no_survivors(result)


def test_device_mismatch_and_uneven_inputs_act_at_the_seams():
    device = run_script(PLAIN, world_size=2, faults=[DeviceMismatch()])
    assert device.outcome == Outcome.CRASHED
    assert all("device_ids and output_device arguments only work" in r.error for r in device.ranks if not r.collateral)
    assert "device_ids=[" in device.fired[0].how
    # 3 ranks: with 2, "rank 0 finished" and "rank 1 called one more all_reduce" are symmetric evidence
    uneven = run_script(PLAIN, world_size=3, faults=[UnevenInputs(rank=0, batches=2)])
    assert uneven.outcome != Outcome.COMPLETED and uneven.root_rank == 0, uneven.report()
    assert "stopped a DataLoader iterator after 2 batch(es)" in uneven.fired[0].how
    _no_survivors(uneven)


@pytest.mark.parametrize(
    "what, outcome, expected",
    [
        ("raise_at_import", Outcome.CRASHED, "ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
        ("no_process_group", Outcome.CRASHED, "without initialising a process group"),
        ("init_twice", Outcome.CRASHED, "trying to initialize the default process group twice"),
        ("exit_status", Outcome.CRASHED, "exited with status 3: giving up: bad configuration"),
        ("exit_message", Outcome.CRASHED, "exited by its own choice: Unable to locate sufficient gpus to run this"),
    ],
)
def test_misbehaving_scripts_get_a_verdict_naming_the_cause(what, outcome, expected):
    result = run_script(BAD, [what], world_size=2, timeout=WORLD_GUARD)
    assert result.outcome == outcome, result.report()
    assert expected in result.root_cause, result.report()
    if what in ("raise_at_import", "exit_message"):  # the script's line, never ddpfaults' own
        assert result.ranks[0].site.startswith("bad_scripts.py:") and "bad_scripts.py:" in result.root_cause
    _no_survivors(result)


def test_wrong_argv_is_a_verdict_quoting_argparse():
    result = run_script(PLAIN, ["--no-such-option"], world_size=2)
    assert result.outcome == Outcome.CRASHED
    assert (
        "exited with status 2" in result.root_cause and "unrecognized arguments: --no-such-option" in result.root_cause
    )


def test_bad_input_is_refused_before_any_rank_starts(tmp_path):
    with pytest.raises(ScriptError, match="not found"):
        run_script(tmp_path / "missing.py", world_size=2)
    with pytest.raises(ScriptError, match="module 'no_such_pkg.train' not found"):
        run_script(module="no_such_pkg.train", world_size=2)
    with pytest.raises(ConfigError, match="argv must be a list of strings"):
        run_script(PLAIN, "--epochs 2", world_size=2)
    with pytest.raises(ConfigError, match="step_clock must be one of optimizer, dataloader"):
        run_script(PLAIN, world_size=2, step_clock="epoch")
    with pytest.raises(ScriptError, match="exactly one"):
        run_script(PLAIN, module="x", world_size=2)


def test_a_module_runs_as_python_dash_m(tmp_path):
    package = tmp_path / "mytrain"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(open(PLAIN).read())
    result = run_script(module="mytrain.train", argv=["--batches", "2"], world_size=2, cwd=tmp_path)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.function == "-m mytrain.train" and [r.last_step for r in result.ranks] == [2, 2]


def test_cli_runs_a_script_with_argv_after_the_dashes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "world.json"
    command = ["run", PLAIN, "--world-size", "3", "--faults", "[EmptyBatch(rank=1, step=1)]"]
    done = ddpfaults_cli(capsys, monkeypatch, *command, "--json", out, "--expect", "crashed", "--", "--batches", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "root cause: rank 1" in done.stdout and "expected crashed, observed crashed: OK" in done.stdout
    (world,) = json.loads(out.read_text())["worlds"]  # a report document (docs/report-schema.md)
    assert world["kwargs"] == "--batches 3" and world["expectation"]["held"] is True


def test_cli_refuses_code_in_faults():
    done = subprocess.run(
        [sys.executable, "-m", "ddpfaults", "run", PLAIN, "--faults", "[__import__('os').system('echo pwned')]"],
        capture_output=True,
        text=True,
        timeout=EVENT_GUARD,
    )
    assert done.returncode == 2 and "pwned" not in done.stdout
    assert "is not a fault constructor call" in done.stderr


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX only")
def test_concurrent_script_worlds_never_share_a_port(tmp_path):
    import concurrent.futures

    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    probe = os.path.join(SCRIPTS, "probe.py")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(
            # fixed: a long stall: no hang is expected; two worlds share the cores here
            pool.map(lambda d: run_script(probe, [str(d)], world_size=2, timeout=WORLD_GUARD, stall=10), dirs)
        )
    assert [r.outcome for r in results] == [Outcome.COMPLETED] * 2
    ports = [json.loads((d / "rank0.json").read_text())["env"]["MASTER_PORT"] for d in dirs]
    assert ports[0] != ports[1]


def test_schema_drift_drops_the_key_from_the_targets_the_dataloader_yields():
    """The toy set criterion's matcher reads every target's ``segment_mask``: dropped on rank 1 at step 1, that
    rank alone raises the field's ``KeyError: 'segment_mask'``."""
    from ddpfaults.faults import SchemaDrift
    from ddpfaults.scenario import builtin_dir

    script = os.path.join(builtin_dir(), "scripts", "train_empty_batch.py")
    result = run_script(script, world_size=3, faults=[SchemaDrift(key="segment_mask", rank=1, step=1)])
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    assert result.ranks[1].error == "KeyError: 'segment_mask'" and result.ranks[1].last_step == 1
    assert [f.rank for f in result.fired] == [1]


CONTAINER = os.path.join(SCRIPTS, "optimizer_container.py")


@pytest.mark.parametrize("world_size", [2, 4])
def test_an_optimizer_container_steps_the_clock_once_per_training_step(world_size):
    """A container that is itself an Optimizer and steps two inner ones: the outermost step() counts, once (a
    6-step run reached step 18, and a fault at step 4 fired in the second training step)."""
    result = run_script(CONTAINER, ["--steps", "6"], world_size=world_size)
    assert result.outcome == Outcome.COMPLETED and [r.last_step for r in result.ranks] == [6] * world_size
    crashed = run_script(CONTAINER, ["--steps", "6"], world_size=world_size, faults=[RankCrash(rank=1, step=4)])
    assert crashed.outcome == Outcome.CRASHED and crashed.root_rank == 1, crashed.report()
    assert crashed.ranks[1].last_step == 4 and [(f.rank, f.step) for f in crashed.fired] == [(1, 4)]
