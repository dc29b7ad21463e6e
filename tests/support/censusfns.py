"""The rank side of the CUDA mapping's census (tests/rank/test_cuda_census.py): inside a rank with ``cuda_on_cpu``,
call every entry of :func:`ddpfaults.rank.cuda_on_cpu.census`: a mapped one must answer, a refused one must raise
``UnmappableCudaCall`` naming this file's line, never torch's own error."""

import contextlib

import torch

from ddpfaults.errors import UnmappableCudaCall
from ddpfaults.rank import cuda_on_cpu


def _calls(n):
    """How to call the entries that need arguments (the others are called with none), by census name."""
    state = torch.get_rng_state()
    t = torch.ones(2)
    return {
        "torch.cuda.set_device": lambda f: f(0),
        "torch.cuda.device": lambda f: _open(f(0)),
        "torch.cuda.device_of": lambda f: _open(f(t)),
        "torch.cuda.set_rng_state": lambda f: f(state),
        "torch.cuda.set_rng_state_all": lambda f: f([state] * n),
        "torch.cuda.manual_seed": lambda f: f(0),
        "torch.cuda.manual_seed_all": lambda f: f(0),
        "torch.cuda.set_per_process_memory_fraction": lambda f: f(0.5),
        "torch.cuda.get_device_properties": lambda f: f(0).total_memory,
        "torch.accelerator.set_device_index": lambda f: f(0),
        "torch.accelerator.set_device_idx": lambda f: f(0),
        "torch.accelerator.device_index": lambda f: _open(f(0)),
        "Tensor.to": lambda f: f(t, 0),
        "Tensor.type": lambda f: f(t, "torch.cuda.FloatTensor"),
        "Tensor.new_tensor": lambda f: f(t, [1.0], device="cuda"),
        "Tensor.new_empty": lambda f: f(t, (2,), device="cuda"),
        "Tensor.new_zeros": lambda f: f(t, (2,), device="cuda:0"),
        "Tensor.new_ones": lambda f: f(t, (2,), device=0),
        "Tensor.new_full": lambda f: f(t, (2,), 1.0, device="cuda"),
        "Tensor.new_empty_strided": lambda f: f(t, (2,), (1,), device="cuda"),
        "Tensor.record_stream": lambda f: f(t, None),
        "Module.to": lambda f: f(torch.nn.Linear(2, 2), 0),
        "Module.to_empty": lambda f: f(torch.nn.Linear(2, 2), device="cuda"),
    }


def _on(*args):
    """A call of its function with ``args`` alone (the instance of a method)."""
    return lambda f: f(*args)


def _open(context):
    with context:
        return True


def _target(name):
    owner, attribute = name.rsplit(".", 1)
    where = {"torch.cuda": torch.cuda, "torch.accelerator": torch.accelerator, "Tensor": torch.Tensor}
    return getattr(where.get(owner, torch.nn.Module), attribute)


def call_every_entry(ctx):
    """``{name: (how, outcome)}``: outcome "answered", "refused at <line>" or the error the call raised."""
    found = cuda_on_cpu.census()
    calls = _calls(ctx.world_size)
    outcomes = {}
    for name, (how, _) in sorted(found.items()):
        target = _target(name)
        if name in calls:
            call = calls[name]
        elif name.startswith("Tensor."):
            call = _on(torch.ones(2))
        elif name.startswith("Module."):
            call = _on(torch.nn.Linear(2, 2))
        else:
            call = _on()
        try:
            with contextlib.redirect_stdout(None):
                call(target)
        except UnmappableCudaCall as exc:
            outcomes[name] = (how, "refused at " + str(exc).split("(called at ", 1)[-1].split(")", 1)[0])
        except Exception as exc:  # noqa: BLE001 - the census reports whatever a call raised
            outcomes[name] = (how, f"{type(exc).__name__}: {exc}")
        else:
            outcomes[name] = (how, "answered")
    return outcomes
