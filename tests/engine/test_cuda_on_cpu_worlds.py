"""A trainer written for GPUs (set_device, .cuda(), nccl, device_ids, pin_memory, autocast and GradScaler on "cuda", a
CUDA map_location on resume) run unmodified with ``cuda_on_cpu`` on real gloo ranks: it trains as its CPU twin does,
and every fault is judged as on the twin."""

import json
import os

import pytest

import cudafns
from cli import ddpfaults_cli
from ddpfaults import Outcome, run_script, run_world
from ddpfaults.engine import census
from ddpfaults.faults import DeviceMismatch, EmptyBatch, RankKilled, SkippedCollective
from ddpfaults.judge.results import WorldResult

pytestmark = pytest.mark.usefixtures("own_cwd")  # the resume check copies the working directory: a small one

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
GPU_TRAIN = os.path.join(SCRIPTS, "gpu_train.py")
UNMAPPABLE = os.path.join(SCRIPTS, "unmappable.py")


def _digests(result):
    return [r.output.strip().splitlines()[-1].split("digest: ")[1] for r in result.ranks]


def _gpu_and_twin(world_size, argv=(), **settings):
    gpu = run_script(GPU_TRAIN, ["--style", "gpu", *argv], world_size=world_size, cuda_on_cpu=True, **settings)
    twin = run_script(GPU_TRAIN, ["--style", "cpu", *argv], world_size=world_size, **settings)
    for result in (gpu, twin):
        assert census.survivors([r.pid for r in result.ranks if r.pid]) == []
    return gpu, twin


def _verdict(result):
    """What the judge said, in the words that must not depend on the mapping."""
    divergence = result.divergence
    return (
        result.outcome,
        result.root_rank,
        [(r.state, r.collateral) for r in result.ranks],
        divergence and (divergence.index, divergence.odd_ranks, divergence.describe()),
        [(f.rank, f.step, f.how) for f in result.fired],
    )


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_gpu_trainer_completes_unmodified_and_trains_as_its_cpu_twin(world_size):
    gpu, twin = _gpu_and_twin(world_size, ["--epochs", "2"])
    assert gpu.outcome == twin.outcome == Outcome.COMPLETED, gpu.report()
    assert len(set(_digests(gpu))) == 1 and _digests(gpu) == _digests(twin)  # bit-equal replicas, bit-equal to twin
    assert [r.last_step for r in gpu.ranks] == [r.last_step for r in twin.ranks] == [8] * world_size
    assert all("peak CUDA memory 0.0 MiB on cpu (--cuda-on-cpu)" in r.output for r in gpu.ranks)
    assert "CUDA mapped to the CPU (cuda_on_cpu)" in gpu.report() and "CUDA mapped" not in twin.report()
    document = gpu.to_dict()
    assert document["cuda_on_cpu"] is True and twin.to_dict()["cuda_on_cpu"] is False
    assert WorldResult.from_dict(json.loads(gpu.to_json())).spec.cuda_on_cpu


def test_without_the_mapping_the_gpu_trainer_crashes_at_its_first_cuda_call():
    result = run_script(GPU_TRAIN, world_size=2)
    assert result.outcome == Outcome.CRASHED, result.report()
    assert all(r.site.startswith("gpu_train.py:") for r in result.ranks), [r.site for r in result.ranks]


@pytest.mark.parametrize(
    ("world_size", "fault", "argv"),
    [
        (4, EmptyBatch(rank=1, step=1), ["--strategy", "naive"]),
        (4, EmptyBatch(rank=1, step=1), ["--strategy", "fixed"]),
        (2, RankKilled(rank=1, step=2), []),
        (4, SkippedCollective(rank=2, step=1, op="ddp_bucket"), []),
    ],
    ids=["empty_batch_naive", "empty_batch_fixed", "rank_killed", "skipped_ddp_bucket"],
)
def test_a_fault_is_judged_through_the_mapping_as_on_the_cpu_twin(world_size, fault, argv):
    gpu, twin = _gpu_and_twin(world_size, argv, faults=[fault])
    assert _verdict(gpu) == _verdict(twin), f"{gpu.report()}\n\n=== CPU twin ===\n{twin.report()}"
    assert gpu.fired, gpu.report()
    if gpu.outcome != Outcome.COMPLETED:
        assert "--cuda-on-cpu true" in gpu.replay and "--cuda-on-cpu" not in twin.replay


def test_device_mismatch_keeps_its_meaning_through_the_mapping():
    """The mapping drops the trainer's own device_ids (its module is on the CPU) before faults act: DeviceMismatch
    still hands the CPU module an accelerator's index, and DDP refuses it as on the twin. Linger: every rank is
    refused, and one refused first must not close its sockets on a peer still finishing its gloo connections (there
    it fails "Connection closed by peer", collateral; seen once in a quiet run of the suite)."""
    gpu, twin = _gpu_and_twin(2, faults=[DeviceMismatch()], peer_failure="linger")
    assert gpu.outcome == twin.outcome == Outcome.CRASHED
    for result in (gpu, twin):
        assert all("device_ids and output_device arguments only work" in r.error for r in result.ranks), result.report()
        assert "device_ids=[" in result.fired[0].how


@pytest.mark.parametrize(("world_size", "rank", "step"), [(2, 1, 3), (4, 0, 5)])
def test_a_restart_resumes_through_the_mapping_and_the_resume_check_passes(world_size, rank, step):
    result = run_script(
        GPU_TRAIN,
        ["--resume", "--epochs", "2"],
        world_size=world_size,
        cuda_on_cpu=True,
        faults=[RankKilled(rank=rank, step=step)],
        max_restarts=1,
        check_resume=True,
        # fixed: a long stall: no hang is expected; a restart's rendezvous waits are never taken for one
        stall=10,
    )
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"], result.report()
    assert result.resume["equivalent"] and result.resume["steps"] == 8, result.report()


@pytest.mark.parametrize(
    ("call", "named"),
    [("graph", "torch.cuda.CUDAGraph"), ("external_stream", "torch.cuda.ExternalStream")],
)
def test_an_unmappable_call_crashes_every_rank_with_one_error_naming_it_and_the_line(call, named):
    # linger: a rank refused first must not close its sockets on a peer still joining the group (collateral there)
    result = run_script(UNMAPPABLE, ["--call", call], world_size=2, cuda_on_cpu=True, peer_failure="linger")
    assert result.outcome == Outcome.CRASHED, result.report()
    for r in result.ranks:
        assert r.error.startswith(f"UnmappableCudaCall: --cuda-on-cpu cannot map {named} (called at unmappable.py:")
        assert r.site.startswith("unmappable.py:")


def test_the_command_line_flag_alone_turns_the_mapping_on_and_the_json_says_so(tmp_path, capsys, monkeypatch):
    report = tmp_path / "world.json"
    done = ddpfaults_cli(
        capsys, monkeypatch, "run", GPU_TRAIN, "--world-size", "2", "--cuda-on-cpu", "--json", str(report)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CUDA mapped to the CPU (cuda_on_cpu)" in done.stdout
    (world,) = json.loads(report.read_text())["worlds"]
    assert world["cuda_on_cpu"] is True and world["outcome"] == "completed"


def test_a_rank_function_written_for_gpus_restarts_on_a_warm_standby_world():
    """A restart's next attempt runs on a standby world warmed up without the mapping (a rank that had it is never
    given another job); the attempt's own job maps CUDA."""
    result = run_world(
        cudafns.gpu_steps,
        world_size=2,
        cuda_on_cpu=True,
        faults=[RankKilled(rank=1, step=2)],
        max_restarts=1,
        # fixed: a long stall: no hang is expected; a restart's rendezvous waits are never taken for one
        stall=10,
    )
    assert result.outcome == Outcome.COMPLETED and len(result.attempts) == 2, result.report()
    assert result.attempts[1]["warm"], result.report()
    assert result.values == [("cpu", 2), ("cpu", 2)]


BARRIER_SCRIPT = """
import os
import torch.distributed as dist

dist.init_process_group("nccl")
dist.barrier(device_ids=[int(os.environ["LOCAL_RANK"])])
if dist.get_rank() == 0:
    dist.barrier(device_ids=[0])  # rank 0 alone: rank 1 leaves, and the barrier fails
"""


def test_the_users_own_barrier_is_the_users_through_the_mapping(tmp_path):
    """Under the mapping a user's ``barrier(device_ids=…)`` passes through ddpfaults' plain barrier on its way to
    torch: it is still the user's call (it was labelled ``barrier() [ddpfaults]``, the tag of an injected
    RankOnlyBarrier)."""
    (tmp_path / "barrier.py").write_text(BARRIER_SCRIPT)
    result = run_script(str(tmp_path / "barrier.py"), world_size=2, cuda_on_cpu=True, cwd=str(tmp_path))
    assert result.outcome == Outcome.CRASHED and result.root_rank == 0, result.report()
    barriers = [c for c in result.ranks[0].collectives if c.op == "barrier"]
    assert [c.maker for c in barriers] == ["user", "user"], result.report()
    assert "[ddpfaults]" not in result.report() and "barrier.py:" in result.divergence.describe(), result.report()


ACCELERATOR_TRAIN = os.path.join(SCRIPTS, "accelerator_train.py")


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_trainer_written_through_torch_accelerator_completes_with_equal_replicas(world_size):
    """torch.accelerator's check, set_device_index, get_default_backend_for_device, device_id, Module.to(int),
    device_ids, AdamW and synchronize (it exited "Unable to locate an accelerator": torch.accelerator named none)."""
    result = run_script(ACCELERATOR_TRAIN, world_size=world_size, cuda_on_cpu=True)
    assert result.outcome == Outcome.COMPLETED, result.report()
    sums = {r.output.strip().splitlines()[-1] for r in result.ranks}
    assert len(sums) == 1 and next(iter(sums)).startswith("weight sum"), result.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_with_its_default_mesh_and_a_gradient_divide_factor_trains_under_the_mapping(world_size):
    """FSDP2's default mesh is made through the reference to init_device_mesh it bound at its import, on the
    accelerator's device type: its groups get gloo at c10d's one chokepoint (on torch 2.8 they reached NCCL's options,
    refused)."""
    result = run_script(os.path.join(SCRIPTS, "fsdp_divide_factor.py"), world_size=world_size, cuda_on_cpu=True)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert all(r.output.strip().endswith("done") for r in result.ranks), result.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_with_a_gradient_divide_factor_reduces_with_a_sum_of_divided_gradients(world_size):
    """A divide factor other than the world size makes FSDP2 reduce with NCCL's PREMUL_SUM, which gloo refuses; under
    the mapping each rank divides and the ranks sum: twice the world size halves the average's gradients. The average
    (AVG, a sum then a division under the mapping: torch 2.8's gloo reduce-scatter summed) is a local model's."""
    average = run_world(cudafns.fsdp_gradient_sums, world_size=world_size, cuda_on_cpu=True)
    divided = run_world(cudafns.fsdp_gradient_sums, world_size=world_size, cuda_on_cpu=True, args=(2.0 * world_size,))
    assert average.outcome == divided.outcome == Outcome.COMPLETED, divided.report()
    for (sums, local), (halved, _) in zip(average.values, divided.values, strict=True):
        assert sums == pytest.approx(local, rel=1e-5)
        assert halved == pytest.approx([s / 2 for s in sums], rel=1e-5)
