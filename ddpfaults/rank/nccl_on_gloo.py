"""``cuda_on_cpu``'s half for torch.distributed: NCCL runs on gloo, DDP's devices are dropped for a CPU module.

``init_process_group``/``new_group``/``new_subgroups``/``new_subgroups_by_enumeration`` given a backend naming nccl
get gloo, and their ``device_id`` is dropped; ``barrier(device_ids=...)`` is a plain barrier;
``init_device_mesh("cuda", ...)`` makes a CPU mesh (by every reference to it, FSDP2's default mesh's too), and every
group c10d makes, whatever door it came by, gets gloo (``_new_process_group_helper``); ``is_nccl_available()`` is
True; ``ProcessGroupNCCL`` and its ``Options`` are refused. ``DistributedDataParallel`` drops
``device_ids``/``output_device`` for a module on the CPU, outside the DDP seam (:mod:`ddpfaults.rank.seams`): a
``DeviceMismatch`` fault still hands the module an accelerator's index afterwards, which DDP refuses, as without the
mapping. FSDP2's reduce-scatter with a gradient divide factor
(``set_gradient_divide_factor``, as LLM trainers set it) uses NCCL's ``PREMUL_SUM``, which gloo refuses: it divides its
input by the factor and reduces with a sum, what ``PREMUL_SUM(1/factor)`` computes; its ``AVG`` is a sum divided by
the group's size afterwards (torch 2.8's gloo reduce-scatter summed where FSDP2 asked for ``AVG``).
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from ddpfaults.rank.cuda_calls import maps, refusing_class
from ddpfaults.rank.on_import import patch_on_import


def _gloo(backend):
    """gloo for a backend naming nccl, or for none given (torch's "undefined": on a CUDA build under the mapping, whose
    ``torch.cuda.is_available()`` is True, torch would pair the CPU's gloo with CUDA's nccl)."""
    if backend is None or (isinstance(backend, str) and ("nccl" in backend.lower() or backend.lower() == "undefined")):
        return "gloo"
    return backend


def _group_call(original, *, device_id: bool):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        given = bound.arguments
        if "backend" in given:
            given["backend"] = _gloo(given["backend"])
        if device_id and maps(given.get("device_id")):
            given.pop("device_id")
        return original(*bound.args, **bound.kwargs)

    return call


def _ddp_init(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, module, *args, **kwargs):
        bound = signature.bind_partial(self, module, *args, **kwargs)
        on_cpu = all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu:
            for name in ("device_ids", "output_device"):
                bound.arguments.pop(name, None)
        return original(*bound.args, **bound.kwargs)

    return __init__


def _barrier(original):
    @functools.wraps(original)
    def barrier(*args, **kwargs):
        kwargs.pop("device_ids", None)
        return original(*args, **kwargs)

    return barrier


def _init_device_mesh(original):
    @functools.wraps(original)
    def init_device_mesh(device_type, *args, **kwargs):
        return original("cpu" if maps(device_type) else device_type, *args, **kwargs)

    return init_device_mesh


def _divide_factors(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def divide_factors(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        pre, post, reduce_scatter_op, all_reduce_op = original(*args, **kwargs)
        divide, scale = 1.0, _premul_scale(reduce_scatter_op)
        if scale is not None:  # PREMUL_SUM(1/f) on NCCL: divide each input by f, then sum
            pre, reduce_scatter_op = (pre or 1.0) / scale, dist.ReduceOp.SUM
        for name, op in (("reduce_scatter_group", reduce_scatter_op), ("all_reduce_group", all_reduce_op)):
            if getattr(op, "op", op) == dist.ReduceOp.AVG and given.get(name) is not None:
                divide *= given[name].size()  # AVG: sum, then divide by the group's size
        if divide != 1.0:
            post = (post or 1.0) * divide
        if scale is not None or divide != 1.0:
            return pre, post, dist.ReduceOp.SUM, dist.ReduceOp.SUM
        return pre, post, reduce_scatter_op, all_reduce_op

    return divide_factors


def _premul_scale(op) -> float | None:
    """The scale of a ``PREMUL_SUM`` reduce op (``None`` for any other op)."""
    if getattr(op, "op", None) != dist.ReduceOp.PREMUL_SUM:  # AVG and SUM come as bare RedOpType
        return None
    return op.__getstate__()[1]


def _fsdp_reduce_ops(collectives) -> None:
    collectives._get_gradient_divide_factors = _divide_factors(collectives._get_gradient_divide_factors)


def install() -> None:
    """Patch torch.distributed (once: called by :func:`ddpfaults.rank.cuda_on_cpu.install`)."""
    for name, device_id in (
        ("init_process_group", True),
        ("new_group", True),
        ("new_subgroups", False),
        ("new_subgroups_by_enumeration", False),
    ):
        wrapped = _group_call(getattr(c10d, name), device_id=device_id)
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    c10d.barrier = dist.barrier = _barrier(c10d.barrier)
    dist.is_nccl_available = c10d.is_nccl_available = lambda: True
    refused_group = refusing_class(
        "ProcessGroupNCCL", "NCCL's process group and its options run on GPUs only", "torch.distributed."
    )
    refused_group.Options = refusing_class(
        "ProcessGroupNCCL.Options", "NCCL's options configure GPUs only", "torch.distributed."
    )
    dist.ProcessGroupNCCL = c10d.ProcessGroupNCCL = refused_group
    DistributedDataParallel.__init__ = _ddp_init(DistributedDataParallel.__init__)
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is not None:  # every group c10d makes, by whatever door (a DeviceMesh's own, FSDP2's default mesh)
        c10d._new_process_group_helper = _group_call(helper, device_id=True)
    import torch.distributed.device_mesh as device_mesh

    patch_on_import("torch.distributed.fsdp._fully_shard._fsdp_collectives", _fsdp_reduce_ops)
    original = device_mesh.init_device_mesh
    mapped = _init_device_mesh(original)
    for module in list(sys.modules.values()):  # every reference bound at import (FSDP2's default mesh holds one)
        if getattr(module, "__dict__", {}).get("init_device_mesh") is original:
            module.init_device_mesh = mapped
