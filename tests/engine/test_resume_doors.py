"""The resume check in real worlds, with files met by every door (``open``, ``torch.load`` of a buffer, a pointer
file) and every step compared on its own: the buffer-then-``open`` trainer (``scripts/buffer_ckpt.py``, and as a rank
function) with an absolute checkpoint directory is refused as a baseline that began from the faulted run's
checkpoint, with ``{run_dir}`` (or ``ctx.shared_dir``) equivalent; each of its buggy resumes is named at its real
first difference; the tutorial's replayed epoch is named at its first replayed step though its zero gradients leave
the final state equal, and ``run --check-resume`` exits 1 on it; ``WriterKilledMidSave`` at the file the writer writes
through ``open`` tears the in-place checkpoint (every restart crashes loading it) and spares the atomic one."""

import os
import re

import pytest

import ddpfaults
import restartfns
from cli import ddpfaults_cli
from ddpfaults.faults import RankKilled, WriterKilledMidSave
from ddpfaults.judge.ranks import format_ranks
from pairwise import pairwise
from processes import WORLD_GUARD

pytestmark = pytest.mark.usefixtures("own_cwd")  # the resume check copies the working directory: a small one

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scripts")
BUFFER = os.path.join(SCRIPTS, "buffer_ckpt.py")
REPLAY = os.path.join(SCRIPTS, "replay_epoch.py")
KILL = [RankKilled(rank=1, step=5)]
# fixed: a long stall: no hang is expected; a restart's waits (a rank re-importing torch) are never one
STALL = 20
CHECK = {"faults": KILL, "max_restarts": 1, "check_resume": True, "stall": STALL, "startup": WORLD_GUARD}

#: each buggy resume of the trainer: its first difference (step, cause), killed at step 5 after 5 steps saved
BUGS = {
    "counter": (5, "samples_replayed"),
    "data": (5, "samples_replayed"),
    "rng": (5, "rng"),
    "scheduler": (6, "learning_rate"),
}


def _trainer(form: str, world_size: int, directory: str | None, **options):
    """The buffer-then-open trainer killed at step 5 and restarted once, checked; ``directory`` None: the run's own."""
    if form == "script":
        argv = ["--ckpt", directory or "{run_dir}/ckpt"]
        argv += [f"--{k}={v}" for k, v in options.items()]
        return ddpfaults.run_script(BUFFER, argv, world_size=world_size, **CHECK)
    kwargs = {"directory": directory, **options}
    return ddpfaults.run_world(restartfns.buffer_ckpt, world_size=world_size, kwargs=kwargs, **CHECK)


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_buffer_then_open_trainer_resumes_equivalent_in_its_own_directory_and_is_refused_in_a_shared_one(
    form, world_size, tmp_path
):
    own = _trainer(form, world_size, None)
    assert [a["outcome"] for a in own.attempts] == ["crashed", "completed"], own.report()
    assert own.resume["equivalent"] is True and own.resume["steps"] == 8, own.report()
    if form == "function":
        assert own.values == [5] * world_size, own.report()  # the restart resumed at step 5
    shared = str(tmp_path / "ckpt")
    refused = _trainer(form, world_size, shared)
    first = refused.resume["first_difference"]
    assert refused.resume["equivalent"] is None and first["cause"] == "shared_file", refused.report()
    assert first["detail"].startswith(
        f"the uninterrupted run began at step 8 from {shared}/ckpt_000008.pt, which the faulted run wrote"
    ), first["detail"]
    assert "{run_dir}" in first["detail"] and "resume not checked:" in refused.report()


@pytest.mark.parametrize(("bug", "world_size", "form"), pairwise(sorted(BUGS), [2, 4], ["script", "function"]))
def test_each_buggy_resume_of_the_buffer_then_open_trainer_is_named_at_its_real_first_difference(bug, world_size, form):
    result = _trainer(form, world_size, None, bug=bug)
    assert result.outcome == "completed", result.report()
    first = result.resume["first_difference"]
    assert result.resume["equivalent"] is False and (first["step"], first["cause"]) == BUGS[bug], result.report()
    assert first["attempt"] == 1 and 0 in first["ranks"], first


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_tutorial_s_replayed_epoch_is_named_at_its_first_replayed_step_though_the_final_state_is_equal(
    world_size, tmp_path
):
    result = ddpfaults.run_script(REPLAY, [], world_size=world_size, cwd=tmp_path, **CHECK)
    finding = result.resume
    first = finding["first_difference"]
    assert finding["final_identical"] and finding["equivalent"] is False, result.report()  # zero gradients
    assert (first["step"], first["cause"]) == (4, "samples_replayed"), result.report()
    assert "the batch the uninterrupted run consumed at step 0" in first["detail"]


def test_run_check_resume_exits_1_on_the_tutorial_s_replayed_epoch(tmp_path, capsys, monkeypatch):
    done = ddpfaults_cli(
        capsys, monkeypatch, "run", REPLAY, "--world-size", "2", "--max-restarts", "1", "--stall", STALL,
        "--cwd", tmp_path, "--faults", "[RankKilled(rank=1, step=5)]", "--check-resume",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "resume differs from step 4: rank 0 consumed at step 4 the batch" in done.stdout, done.stdout


def _killed_mid_save(form: str, world_size: int, atomic: bool):
    """The trainer writing ``ckpt.pt`` (in place, or ``atomic``) with its writer killed mid-save at step 6."""
    faults = {**CHECK, "faults": [WriterKilledMidSave(writer=0, step=6)], "world_size": world_size}
    if form == "script":
        return ddpfaults.run_script(BUFFER, ["--ckpt", "{run_dir}/c", "--fixed-name"] + ["--atomic"] * atomic, **faults)
    return ddpfaults.run_world(restartfns.buffer_ckpt, kwargs={"fixed_name": True, "atomic": atomic}, **faults)


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_writer_killed_mid_save_tears_the_in_place_checkpoint_and_spares_the_atomic_one(form, world_size):
    """``WriterKilledMidSave`` at the file its writer writes through ``open`` (no ``torch.save`` to a path): in place,
    every restart crashes loading the torn checkpoint, as under torchrun, and the writer of the torn file is the cause
    (it read "every rank raised ValueError: ..., a common cause, no rank at fault"); atomic, the kill comes before the
    rename and the run resumes from the last good checkpoint, equivalent."""
    torn = _killed_mid_save(form, world_size, atomic=False)
    assert [a["outcome"] for a in torn.attempts] == ["crashed", "crashed"], torn.report()
    assert torn.root_rank == 0 and torn.cause.kind == "torn_file" and torn.cause.ranks == (0,), torn.report()
    assert torn.root_cause.startswith(
        "rank 0 wrote a torn file at step 6 (WriterKilledMidSave(writer=0, step=6): in attempt 0, before the restart: "
        "SIGKILLed the writer mid-save of ckpt.pt after"
    ), torn.root_cause
    readers = format_ranks(range(world_size))
    assert f"; {readers} read {torn.fired[0].file} and raised " in torn.root_cause, torn.root_cause
    assert "negative seek value" in torn.root_cause or "central directory" in torn.root_cause, torn.report()
    written = re.match(r"SIGKILLed the writer mid-save of ckpt\.pt after (\d+) of (\d+) bytes were on disk \((.*)\)$",
                       torn.fired[0].how)  # fmt: skip
    assert written and int(written[1]) == int(written[2]) // 2 > 0, torn.fired
    assert written[3].endswith("/ckpt.pt"), torn.fired
    atomic = _killed_mid_save(form, world_size, atomic=True)
    assert [a["outcome"] for a in atomic.attempts] == ["crashed", "completed"], atomic.report()
    assert atomic.fired[0].how.startswith("SIGKILLed the writer mid-save of ckpt.pt.tmp after"), atomic.report()
    assert atomic.resume["equivalent"] is True, atomic.report()
