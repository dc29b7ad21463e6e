"""The CUDA mapping (``cuda_on_cpu``) in a child process: every call a GPU script makes gives the CPU's answer, and
what has no CPU meaning is refused naming the call and the line (worlds: tests/engine/test_cuda_on_cpu_worlds.py)."""

import json
import os
import subprocess
import sys

import pytest

from ddpfaults.rank.cuda_calls import maps
from processes import EVENT_GUARD

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "cuda_probe.py")


@pytest.fixture(scope="module")
def seen():
    done = subprocess.run([sys.executable, PROBE], capture_output=True, text=True, timeout=EVENT_GUARD)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_device_names_cuda_by_type_string_or_bare_index():
    assert [maps(d) for d in ("cuda", "cuda:1", " cuda :0", 0, 3)] == [True] * 5
    assert [maps(d) for d in ("cpu", "meta", None, True, 1.0, "cudax")] == [False] * 6


def test_torch_cuda_answers_as_on_one_gpu_per_local_rank(seen):
    assert seen["available"] == [True, 4, 2]  # installed for 4 local ranks; set_device(2) before
    assert seen["in_device_context"] == 3 and seen["after_device_context"] == 2
    assert "invalid device ordinal 4" in seen["set_device_out_of_range"]
    assert seen["memory"] == [0, 0, 0]
    assert seen["names"] == ["cpu (--cuda-on-cpu)", True]


def test_every_way_of_naming_a_cuda_device_gives_the_cpu(seen):
    assert seen["devices"] == dict.fromkeys(seen["devices"], "cpu") and len(seen["devices"]) == 10
    assert seen["map_location"] == "cpu"
    assert seen["is_cuda"] is False


def test_torch_accelerator_names_the_mapped_cuda_device_as_on_one_gpu_per_local_rank(seen):
    """Scripts that check torch.accelerator first (pytorch/examples' FSDP2, tensor parallelism) take their GPU path;
    the optimizers' graph-capture check finds the CPU's synchronous stream, never a CUDA runtime."""
    assert seen["accelerator"] == ["cuda", True]
    assert seen["accelerator_index"] == [4, 3, 1]
    assert seen["accelerator_stream_capturing"] is False and seen["device_module"] is True
    assert seen["module_to_index"] == "cpu" and seen["tensor_to_index"] == "cpu"
    assert seen["adamw_stepped"] == 1.0


def test_a_move_to_cuda_copies_as_on_a_gpu_and_pinning_is_a_no_op(seen):
    assert seen["copies"] == {"cuda_copies": True, "to_copies": True}
    assert seen["cpu_to_cpu_is_self"] and seen["pin_memory_is_self"]


def test_autocast_on_cuda_is_off_and_the_grad_scaler_scales_on_the_cpu(seen):
    assert seen["autocast_dtype"] == "torch.float32" and seen["cuda_amp_autocast_dtype"] == "torch.float32"
    assert seen["autocast_enabled"] == [False, False]
    assert seen["scaler"] == [True, "cpu", 65536.0] and seen["scaled_by"] == 65536.0


def test_cuda_seeding_leaves_the_cpu_generator_that_draws_every_number(seen):
    assert seen["rng"] == [True, True]


@pytest.mark.parametrize(
    ("name", "call", "why"),
    [
        ("external_stream", "torch.cuda.ExternalStream", "raw CUDA stream handle"),
        ("graph", "torch.cuda.CUDAGraph", "CUDA graphs"),
        ("graphed", "torch.cuda.make_graphed_callables", "CUDA graphs"),
        ("nccl", "torch.cuda.nccl.all_reduce", "NCCL"),
        ("process_group_nccl", "torch.distributed.ProcessGroupNCCL.Options", "NCCL"),
        ("capability", "torch.cuda.get_device_capability", "chooses its kernels and dtypes"),
        ("unmapped", "torch.cuda.utilization", "no CPU meaning"),
        ("kernel", "torch.utils.cpp_extension.load_inline (CUDA sources)", "custom CUDA kernel"),
        ("cuda_extension", "torch.utils.cpp_extension.CUDAExtension", "custom CUDA kernel"),
    ],
)
def test_what_has_no_cpu_meaning_is_refused_naming_the_call_and_the_line(seen, name, call, why):
    message = seen[name]
    assert message.startswith(f"UnmappableCudaCall: --cuda-on-cpu cannot map {call} (called at cuda_probe.py:")
    assert why in message and "run this script on a GPU" in message


def test_the_device_properties_a_trainer_logs_are_a_stand_in_saying_it_is_mapped(seen):
    assert seen["properties"] == ["cpu (--cuda-on-cpu)", True]


def test_streams_and_events_are_the_cpus_one_synchronous_order(seen):
    """A side stream, waits on it and events timing it: nothing to wait for, the CPU's time measured."""
    assert seen["streams"] == [True, True, True] and seen["record_stream"] is None


def test_a_stand_in_class_still_answers_isinstance(seen):
    assert seen["isinstance_stream"] is False
