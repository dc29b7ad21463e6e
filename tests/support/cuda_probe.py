"""Run by tests/rank/test_cuda_on_cpu.py in a child process: install the CUDA mapping for 4 local GPUs, make the calls
a GPU script makes, and print what each gave as one JSON object (the refusals with their messages)."""

import io
import json
import sys

import torch

from ddpfaults.rank import cuda_on_cpu

cuda_on_cpu.install(4)
seen = {}


def refused(name, call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the probe reports whatever it was
        seen[name] = f"{type(exc).__name__}: {exc}"
    else:
        seen[name] = None


torch.cuda.set_device(2)
seen["available"] = [torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.current_device()]
with torch.cuda.device(3):
    seen["in_device_context"] = torch.cuda.current_device()
seen["after_device_context"] = torch.cuda.current_device()
refused("set_device_out_of_range", lambda: torch.cuda.set_device(4))
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
seen["memory"] = [torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()]
seen["devices"] = {
    "factory": str(torch.zeros(2, device="cuda:1").device),
    "factory_index": str(torch.ones(2, device=0).device),
    "factory_device_object": str(torch.randn(2, device=torch.device("cuda", 3)).device),
    "tensor": str(torch.tensor([1.0], device="cuda").device),
    "new_zeros": str(torch.zeros(1).new_zeros(3, device="cuda").device),
    "module_factory": str(torch.nn.Linear(2, 2, device="cuda").weight.device),
    "module_cuda": str(torch.nn.Linear(2, 2).cuda().weight.device),
    "module_to": str(torch.nn.Linear(2, 2).to("cuda:1").weight.device),
    "to_positional": str(torch.zeros(1).to("cuda", torch.float64).device),
    "pin_memory_factory": str(torch.empty(2, pin_memory=True).device),
}
x = torch.zeros(3)
moved, to_moved, pinned = x.cuda(), x.to("cuda"), x.pin_memory()
moved.add_(1)
to_moved.add_(2)
seen["copies"] = {"cuda_copies": x.sum().item() == 0 and moved.sum().item() == 3, "to_copies": to_moved is not x}
seen["pin_memory_is_self"] = pinned is x
seen["is_cuda"] = moved.is_cuda
seen["accelerator"] = [str(torch.accelerator.current_accelerator()), torch.accelerator.is_available()]
torch.accelerator.set_device_index(1)
with torch.accelerator.device_index(3):
    inside = torch.accelerator.current_device_index()
seen["accelerator_index"] = [torch.accelerator.device_count(), inside, torch.accelerator.current_device_index()]
torch.accelerator.synchronize()
seen["accelerator_stream_capturing"] = torch.accelerator.current_stream().is_capturing()
seen["device_module"] = torch.get_device_module() is torch.cuda
seen["module_to_index"] = str(torch.nn.Linear(2, 2).to(1).weight.device)
seen["tensor_to_index"] = str(torch.ones(1).to(0).device)
model = torch.nn.Linear(2, 1).to(1)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.ones(1, 2, device=1)).sum().backward()
optimizer.step()  # the graph-capture check asks torch.accelerator for its current stream
seen["adamw_stepped"] = optimizer.state[model.weight]["step"].item()
seen["cpu_to_cpu_is_self"] = x.to("cpu") is x
buffer = io.BytesIO()
torch.save({"w": torch.ones(2)}, buffer)
buffer.seek(0)
seen["map_location"] = str(torch.load(buffer, map_location="cuda:3")["w"].device)
with torch.autocast("cuda", dtype=torch.float16):
    seen["autocast_dtype"] = str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype)
    seen["autocast_enabled"] = [torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")]
with torch.cuda.amp.autocast():  # the deprecated spelling, still in many trainers
    seen["cuda_amp_autocast_dtype"] = str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype)
scaler = torch.amp.GradScaler("cuda")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.ones(3, 2)).sum()
scaled = scaler.scale(loss)
seen["scaled_by"] = scaled.item() / loss.item()
scaled.backward()
scaler.step(optimizer)
scaler.update()
seen["scaler"] = [scaler.is_enabled(), scaler._device, scaler.get_scale()]
torch.manual_seed(5)
state = torch.cuda.get_rng_state()
torch.cuda.manual_seed_all(7)
seen["rng"] = [torch.equal(state, torch.get_rng_state()), torch.cuda.initial_seed() == 5]
seen["names"] = [torch.cuda.get_device_name(), torch.cuda.is_bf16_supported()]

side, start, end = torch.cuda.Stream(), torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with torch.cuda.stream(side):
    start.record()
    side.wait_stream(torch.cuda.current_stream())
    end.record()
torch.cuda.current_stream().wait_event(end)
end.synchronize()
seen["streams"] = [
    side.query(),
    start.elapsed_time(end) >= 0,
    torch.cuda.default_stream() is torch.cuda.current_stream(),
]
refused("external_stream", lambda: torch.cuda.ExternalStream(0))
refused("graph", lambda: torch.cuda.CUDAGraph())
refused("graphed", lambda: torch.cuda.make_graphed_callables(model, (torch.ones(1, 2),)))
refused("nccl", lambda: torch.cuda.nccl.all_reduce([torch.ones(1)]))
refused("capability", lambda: torch.cuda.get_device_capability(0))
seen["properties"] = [torch.cuda.get_device_properties(0).name, torch.cuda.get_device_properties(0).total_memory > 0]
refused("unmapped", lambda: torch.cuda.utilization())
refused("process_group_nccl", lambda: torch.distributed.ProcessGroupNCCL.Options())
seen["record_stream"] = x.record_stream(side)
from torch.utils import cpp_extension  # noqa: E402 - imported after the mapping, as a script would

refused("kernel", lambda: cpp_extension.load_inline("k", "int f();", cuda_sources="__global__ void k() {}"))
refused("cuda_extension", lambda: cpp_extension.CUDAExtension("k", ["k.cu"]))
seen["isinstance_stream"] = isinstance(object(), torch.cuda.Stream)
json.dump(seen, sys.stdout)
