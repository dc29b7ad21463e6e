"""``TornCheckpointWrite`` at the file on disk, whatever wrote it, in real worlds: the buffer-then-``open`` trainer
(``scripts/buffer_ckpt.py``, and as a rank function: ``torch.save`` into memory, then ``open(path, "wb")``; no
``torch.save`` or ``torch.load`` of a path) has its checkpoint held torn while the other ranks read it back with
``open``. Readers that do not synchronise with the writer read the torn file and crash, as under torchrun; readers
behind a barrier read the whole file; an atomic writer (temp file + ``os.replace``) is held before the rename, so its
readers read the old checkpoint and the world completes. A checkpoint ``numpy.save`` writes is torn the same way for a
reader's ``numpy.load``. The root cause names the writer, from the fault's records (the ranks that raised read the file
it held torn). A trainer set up by ``init_device_mesh`` alone, whose writer's next act after its save is DDP's own
collectives (no Python call issues them: ``scripts/mesh_ckpt.py``), is torn at the fault's step the same way."""

import os
import re

import pytest

import ddpfaults
import rankfns
import restartfns
from ddpfaults.faults import TornCheckpointWrite
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.rank.checkpoint import HANDSHAKE_LIMIT
from processes import WORLD_GUARD

pytestmark = pytest.mark.usefixtures("own_cwd")

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "scripts")
BUFFER = os.path.join(SCRIPTS, "buffer_ckpt.py")
MESH = os.path.join(SCRIPTS, "mesh_ckpt.py")
STEP = 2  # the step whose checkpoint is torn and read back (ckpt.pt of step 1 is on disk before it)
STEPS = 4
HELD = re.compile(
    r"held the writer of (?P<name>\S+) with (?P<half>\d+) of (?P<size>\d+) bytes on disk \((?P<path>.*)\) until every "
    r"reader had moved on \((?P<readers>.*)\), then wrote the rest$"
)


def _torn(form: str, world_size: int, *, sync: str, atomic: bool = False):
    """The trainer (``ckpt.pt`` written through ``open``, in place or ``atomic``) with its checkpoint of step
    :data:`STEP` torn, read back by every other rank at once (``sync="none"``) or after a barrier."""
    options = {"steps": STEPS, "fixed_name": True, "atomic": atomic, "reload_at": STEP, "reload_sync": sync}
    # a script's steps are counted by its optimizer: the save after iteration i's ``opt.step()`` is in its step i + 1
    step = STEP + 1 if form == "script" else STEP
    run = {"world_size": world_size, "faults": [TornCheckpointWrite(writer=0, step=step)], "startup": WORLD_GUARD}
    if form == "script":
        argv = ["--ckpt", "{run_dir}/c", "--steps", str(STEPS), "--fixed-name", "--reload-at", str(STEP)]
        argv += ["--reload-sync", sync] + ["--atomic"] * atomic
        return ddpfaults.run_script(BUFFER, argv, **run)
    return ddpfaults.run_world(restartfns.buffer_ckpt, kwargs=options, **run)


def _held(result) -> re.Match:
    """The writer's fired record, parsed (exactly one fired on rank 0)."""
    writer = [f for f in result.fired if f.rank == 0]
    assert len(writer) == 1, result.report()
    held = HELD.match(writer[0].how)
    assert held and int(held["half"]) == int(held["size"]) // 2 > 0, writer[0].how
    return held


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_readers_that_do_not_wait_for_the_writer_read_its_checkpoint_torn_and_crash(form, world_size):
    result = _torn(form, world_size, sync="none")
    readers = list(range(1, world_size))
    assert result.outcome == "crashed" and result.root_rank == 0, result.report()
    assert result.cause.kind == "torn_file" and result.cause.step == (STEP + 1 if form == "script" else STEP)
    # a half zip read from a buffer: torch's reader seeks before its start, or finds no central directory
    assert "negative seek value" in result.root_cause or "central directory" in result.root_cause, result.report()
    held = _held(result)
    assert (held["name"], held["readers"]) == ("ckpt.pt", f"rank(s) {', '.join(map(str, readers))} read it torn")
    assert held["path"].endswith("/ckpt.pt"), held["path"]
    read = {f.rank: f.how for f in result.fired if f.rank != 0}
    expected = (
        f"read ckpt.pt with {held['half']} of {held['size']} bytes on disk ({held['path']}) while the writer held it"
    )
    assert read == {r: expected for r in readers}, result.report()


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("sync", "atomic", "name"), [("barrier", False, "ckpt.pt"), ("none", True, "ckpt.pt.tmp")])
def test_readers_behind_a_barrier_or_of_an_atomic_save_never_read_it_torn(form, world_size, sync, atomic, name):
    """Behind a barrier the readers wait in it while the writer holds ``ckpt.pt`` torn and read it whole after; an
    atomic save is held as ``ckpt.pt.tmp`` before its rename, and readers that do not wait read the old ``ckpt.pt``."""
    result = _torn(form, world_size, sync=sync, atomic=atomic)
    assert result.outcome == "completed", result.report()
    held = _held(result)
    assert (held["name"], held["readers"]) == (name, "no reader read it torn"), held.string
    assert [f.rank for f in result.fired] == [0], result.report()  # no reader read it torn


def test_a_checkpoint_numpy_writes_is_torn_for_a_reader_numpy_loads_it_with():
    """``numpy.save``/``numpy.load`` (no torch in the checkpoint's path): the reader's ``np.load`` reads the file with
    half its bytes on disk and fails."""
    result = ddpfaults.run_world(
        rankfns.numpy_checkpoint, world_size=2, faults=[TornCheckpointWrite(writer=0, step=1)], startup=WORLD_GUARD
    )
    assert result.outcome == "crashed" and result.root_rank == 0, result.report()
    held = _held(result)
    assert (held["name"], held["readers"]) == ("weights.npy", "rank(s) 1 read it torn"), held.string
    on_disk = f"{held['half']} of {held['size']} bytes on disk ({held['path']})"
    read = [f.how for f in result.fired if f.rank == 1]
    assert read == [f"read weights.npy with {on_disk} while the writer held it"], result.report()
    assert "could only read 120 elements" in result.root_cause, result.report()  # 960 of 2048 bytes of data: 120 floats


def _mesh(form: str, world_size: int, sync: str):
    """``scripts/mesh_ckpt.py``'s trainer with the checkpoint of its iteration 1 (its optimizer's step 2) torn, read
    back by every other rank after that iteration, at once or after a barrier."""
    run = {"world_size": world_size, "faults": [TornCheckpointWrite(writer=0, step=2)], "startup": WORLD_GUARD}
    options = {"steps": 3, "reload_at": 1, "reload_sync": sync}
    if form == "script":
        argv = ["--ckpt", "{run_dir}/c", "--steps", "3", "--reload-at", "1", "--reload-sync", sync]
        return ddpfaults.run_script(MESH, argv, step_clock="optimizer", **run)
    return ddpfaults.run_world(restartfns.mesh_ckpt, kwargs=options, **run)


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_mesh_trainer_whose_writer_goes_on_into_ddp_s_own_collectives_is_torn_at_the_fault_s_step(form, world_size):
    """The writer's next act after ``open(...).write`` is DDP's forward broadcast (issued in C++): its file is complete
    there (the flight recorder's count moved), torn at step 2, not as step 3 starts; the readers, loading at once,
    read it torn and raise, and the root cause names the writer."""
    result = _mesh(form, world_size, "none")
    readers = list(range(1, world_size))
    assert result.outcome == "crashed" and result.root_rank == 0, result.report()
    assert result.cause.kind == "torn_file" and result.cause.step == 2, result.report()
    assert {f.rank: f.step for f in result.fired} == dict.fromkeys(range(world_size), 2), result.report()
    held = _held(result)
    assert (held["name"], held["readers"]) == ("ckpt.pt", f"rank(s) {', '.join(map(str, readers))} read it torn")
    assert f"{format_ranks(readers)} read {held['path']} and raised" in result.root_cause, result.report()
    assert result.elapsed < HANDSHAKE_LIMIT, result.report()  # no handshake waited out its limit


@pytest.mark.parametrize("form", ["script", "function"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_mesh_trainer_whose_readers_wait_at_a_barrier_reads_the_whole_file(form, world_size):
    result = _mesh(form, world_size, "barrier")
    assert result.outcome == "completed", result.report()
    held = _held(result)
    assert (held["name"], held["readers"]) == ("ckpt.pt", "no reader read it torn"), held.string
    assert [(f.rank, f.step) for f in result.fired] == [(0, 2)], result.report()
    assert result.elapsed < HANDSHAKE_LIMIT, result.report()
