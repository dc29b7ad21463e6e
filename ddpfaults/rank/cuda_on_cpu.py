"""``cuda_on_cpu``: a training script written for GPUs runs, unmodified, on the CPU of a rank.

Installed in a rank before the user's code runs (:func:`install`, once per process; a rank that had it is never
pooled for another job). What it maps, all at the Python level (no torch function mode: measured at 1.5-1.8x a
small model's step, since it sees every op; these patches see only the calls that name a device):

- ``torch.cuda``: ``is_available()`` is True and ``device_count()`` the local world size (``LOCAL_WORLD_SIZE``, as
  torchrun with one GPU per rank gives), so ``set_device(local_rank)`` is valid and libraries take their GPU path;
  ``set_device``/``current_device``/``device(i)`` keep an index; ``synchronize``, ``empty_cache``, the memory
  statistics (zero), seeding (the CPU generator draws every number) and the RNG state (the CPU's) are harmless.
- Devices: ``device="cuda…"`` (or a bare index) of torch's factory functions and ``Tensor.new_*``,
  ``Tensor.to``/``.cuda()`` (a copy, as a move to a GPU is), ``Module.to``/``.cuda()`` (a bare index too),
  ``torch.load``'s
  ``map_location`` give the CPU; ``pin_memory`` is a no-op.
- ``DistributedDataParallel``: ``device_ids``/``output_device`` are dropped for its CPU module (before faults
  act: ``DeviceMismatch`` still hands the module an accelerator's index, which DDP refuses as without the mapping).
- ``init_process_group``/``new_group``/``new_subgroups``: ``nccl`` runs on gloo; ``device_id`` is dropped;
  ``init_device_mesh("cuda", …)`` is a CPU mesh; ``barrier(device_ids=…)`` a plain barrier.
- ``torch.accelerator`` names the mapped CUDA device (``is_available()`` True, ``device_count()`` the local world
  size, the index and memory calls as ``torch.cuda``'s, ``current_stream()`` the CPU's synchronous order);
  ``torch.get_device_module()`` is ``torch.cuda``.
- ``autocast("cuda")`` is off (fp32 on the CPU: CPU bf16 autocast measured 2.3-4.8x slower, fp16 4-10x, on a
  two-layer MLP; docs/scripts.md) and ``GradScaler("cuda")`` is the CPU's GradScaler (it scales and unscales).

Streams and events are the CPU's one synchronous order (work is done when its call returns: waits and
synchronisation have nothing to do, an event's ``elapsed_time`` measures the CPU's time), and a trainer's start-up
metrics get stand-ins (``get_device_properties`` names the mapping and the memory the rank may use; the memory
statistics are 0). What would change the training's meaning, or has none on the CPU, is refused with
:class:`~ddpfaults.errors.UnmappableCudaCall` naming the call and the user's line: CUDA graphs, an external stream's raw
handle, ``get_device_capability`` (code picks its kernels by it), ``torch.cuda.nccl``, ``ProcessGroupNCCL`` (and its
options), custom CUDA kernels (``CUDAExtension``, ``cpp_extension.load``/``load_inline`` of CUDA sources), and every
other public callable of ``torch.cuda`` not mapped. :func:`census` lists every one on the installed torch.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ddpfaults.rank import nccl_on_gloo
from ddpfaults.rank.cuda_calls import CENSUS, CPU, OPTION, maps, marked, refuse, refusing, refusing_class
from ddpfaults.rank.on_import import patch_on_import

#: torch's functions that take ``device=`` (factories): the keyword is mapped, ``pin_memory=True`` dropped
FACTORIES = (
    "tensor as_tensor asarray zeros ones empty full rand randn randint randperm arange range linspace logspace eye "
    "zeros_like ones_like empty_like full_like rand_like randn_like randint_like empty_strided scalar_tensor "
    "tril_indices triu_indices sparse_coo_tensor sparse_csr_tensor normal bartlett_window blackman_window "
    "hamming_window hann_window kaiser_window from_file"
).split()
TENSOR_FACTORIES = ("new_tensor", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided")

#: what each refused ``torch.cuda`` name is, for the error
_GRAPHS = "CUDA graphs replay GPU kernels"
_CAPABILITY = "code chooses its kernels and dtypes by the capability: any answer would change what is trained"
_EXTERNAL = "an external stream is a raw CUDA stream handle: the CPU has none"
#: torch.cuda's classes the mapping stands in for (the others but exceptions are refused)
_STAND_IN_CLASSES = ("device", "device_of", "Stream", "StreamContext", "Event")
REFUSED = {
    "ExternalStream": _EXTERNAL,
    **dict.fromkeys(("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle"), _GRAPHS),
    "get_device_capability": _CAPABILITY,
}
#: ``torch.cuda`` functions mapped by :func:`_cuda_functions` (every other public function is refused)
_UNMAPPED_REASON = "it has no CPU meaning ddpfaults can give it"

_installed = False
_state = {"count": 1, "current": 0}


def installed() -> bool:
    """True once :func:`install` ran in this process (its patches stay: the rank is not reused)."""
    return _installed


def install(local_world_size: int) -> None:
    """Map CUDA to the CPU and NCCL to gloo in this process (once); ``local_world_size``: the GPUs a rank sees."""
    global _installed
    if _installed:
        return
    _installed = True
    _state["count"] = local_world_size
    _devices()
    _cuda_functions()
    _accelerator()
    nccl_on_gloo.install()
    _amp()
    _extensions()


# -- devices --------------------------------------------------------------------------------------------------------


def _device_kwargs(original):
    @functools.wraps(original)
    def call(*args, **kwargs):
        if maps(kwargs.get("device")):
            kwargs["device"] = CPU
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    return call


def _to(original):
    @functools.wraps(original)
    def to(self, *args, **kwargs):
        moved = False
        if args and maps(args[0]):
            args, moved = (CPU, *args[1:]), True
        if maps(kwargs.get("device")):
            kwargs["device"], moved = CPU, True
        result = original(self, *args, **kwargs)
        return result.clone() if moved and result is self else result  # a move to a GPU makes a copy

    return to


def _module_to(original):
    @functools.wraps(original)
    def to(self, *args, **kwargs):
        if args and maps(args[0]):
            args = (CPU, *args[1:])  # Module.to(local_rank): torch reads a bare index as the accelerator's
        if maps(kwargs.get("device")):
            kwargs["device"] = CPU
        return original(self, *args, **kwargs)

    return to


def _cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.cuda()`` under the mapping: a CPU copy, as a move to a GPU gives a copy."""
    return self.clone(memory_format=memory_format)


def _pin_memory(self, *args, **kwargs):
    """``Tensor.pin_memory()`` under the mapping: the tensor itself (nothing to pin for)."""
    return self


def _storage_cuda(self, device=None, non_blocking=False):
    """A storage's ``.cuda()`` under the mapping (a ``map_location`` function's): the storage itself."""
    return self


def _tensor_type(original):
    @functools.wraps(original)
    def type(self, dtype=None, non_blocking=False, **kwargs):
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            dtype = "torch." + dtype[len("torch.cuda.") :]
        return original(self, dtype, non_blocking, **kwargs)

    return type


def _load(original):
    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        if not callable(map_location):
            map_location = CPU  # a checkpoint a GPU wrote holds CUDA storages: every tensor comes to the CPU
        return original(f, map_location, *args, **kwargs)

    return load


def _devices() -> None:
    for name in FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _device_kwargs(getattr(torch, name)))
    for name in TENSOR_FACTORIES:
        wrapped = _device_kwargs(getattr(torch.Tensor, name))
        setattr(torch.Tensor, name, marked(wrapped, "mapped", "device='cuda…' (or an index) gives the CPU"))
    torch.Tensor.to = marked(_to(torch.Tensor.to), "mapped", "a CPU copy (for 'cuda…', an index, a CUDA device)")
    torch.nn.Module.to = marked(_module_to(torch.nn.Module.to), "mapped", "the CPU (for 'cuda…', an index)")
    marked(torch.nn.Module.cuda, "mapped", "the CPU (each tensor's .cuda() is a CPU copy)")
    marked(torch.nn.Module.to_empty, "mapped", "the CPU (its device= is mapped in torch.empty_like)")
    torch.Tensor.cuda = marked(_cuda, "mapped", "a CPU copy, as a move to a GPU copies")
    torch.Tensor.pin_memory = marked(_pin_memory, "mapped", "the tensor itself: nothing to pin for")
    torch.Tensor.type = marked(_tensor_type(torch.Tensor.type), "mapped", "'torch.cuda.XTensor' gives the CPU type")
    torch.Tensor.record_stream = marked(_nothing, "mapped", "does nothing: the CPU's one order keeps the tensor alive")
    torch.UntypedStorage.cuda = _storage_cuda
    torch.TypedStorage.cuda = _storage_cuda
    torch.load = torch.serialization.load = _load(torch.serialization.load)


class _Stream:
    """``torch.cuda.Stream`` (and the current and default stream) under the mapping: the CPU's one synchronous order.
    Work is done when its call returns, so waiting, recording and synchronising have nothing to do; nothing captures a
    CUDA graph (the optimizers' graph-capture check asks)."""

    device = CPU
    cuda_stream = 0

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority

    def wait_stream(self, stream) -> None:
        """Nothing to wait for: the CPU ran it already."""

    def wait_event(self, event) -> None:
        """Nothing to wait for: the CPU ran it already."""

    def record_event(self, event=None):
        """``event`` (a new one if None), recorded now."""
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """True: work on the CPU is done when its call returns."""
        return True

    def is_capturing(self) -> bool:
        """False: nothing captures a CUDA graph on the CPU."""
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


class _Event:
    """``torch.cuda.Event`` under the mapping: a point in the CPU's one order, its time kept for ``elapsed_time``."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kwargs):
        self._at = None

    def record(self, stream=None) -> None:
        """Marks now."""
        import time

        self._at = time.perf_counter()

    def wait(self, stream=None) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """True: done when recorded."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end) -> float:
        """Milliseconds from this event's record to ``end``'s, as CUDA's events measure."""
        return (end._at - self._at) * 1000.0


_DEFAULT_STREAM = _Stream()


def _stream_context(stream=None):
    """``torch.cuda.stream(s)`` / ``StreamContext(s)`` under the mapping: ``s`` while open (one order: no switch)."""
    return stream if stream is not None else _DEFAULT_STREAM


def _accelerator() -> None:
    """``torch.accelerator`` names the (mapped) CUDA device, as on a machine with one GPU per local rank: scripts
    that check ``is_available()``/``device_count()`` first (pytorch/examples' FSDP2, tensor parallelism, minGPT) take
    their GPU path. Its index and memory calls answer as ``torch.cuda``'s do; ``current_stream()`` is the CPU's
    synchronous order, so the optimizers' graph-capture check (``Optimizer._accelerator_graph_capture_health_check``)
    finds no capture without reaching a CUDA runtime. torch's own C-level choice of accelerator
    (``torch._C._get_accelerator``: FSDP2's default mesh, ``barrier``'s device) stays the CPU."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:  # torch < 2.6
        return
    cuda = torch.device("cuda")
    nothing, zero = _nothing, _zero
    mapped = {
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: cuda,
        "device_count": lambda: _state["count"],
        "set_device_index": _set_device,
        "set_device_idx": _set_device,
        "current_device_index": lambda: _state["current"],
        "current_device_idx": lambda: _state["current"],
        "device_index": _DeviceContext,
        "synchronize": nothing,
        "current_stream": lambda device=None: _DEFAULT_STREAM,
        "set_stream": nothing,
        "empty_cache": nothing,
        "empty_host_cache": nothing,
        "memory_stats": lambda *args, **kwargs: {},
        "get_memory_info": _mem_get_info,
        "reset_accumulated_memory_stats": nothing,
        "reset_peak_memory_stats": nothing,
    }
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        mapped[name] = zero
    for name, body in mapped.items():
        if hasattr(accelerator, name):
            stand_in = body if isinstance(body, type) else _own_function(name, body, "torch.accelerator")
            setattr(accelerator, name, marked(stand_in, "mapped", _SAID.get(name) or _said(body)))
    for name, reason in (("Graph", _GRAPHS), ("get_device_capability", _CAPABILITY)):
        if hasattr(accelerator, name):
            is_class = inspect.isclass(getattr(accelerator, name))
            setattr(accelerator, name, (refusing_class if is_class else refusing)(name, reason, "torch.accelerator."))
    original = torch.get_device_module

    @functools.wraps(original)
    def get_device_module(device=None):
        return torch.cuda if device is None else original(device)

    torch.get_device_module = get_device_module


# -- torch.cuda -----------------------------------------------------------------------------------------------------


def _index(device) -> int:
    if isinstance(device, torch.device):
        return device.index if device.index is not None else _state["current"]
    if isinstance(device, str):
        return torch.device(device).index or 0 if ":" in device else _state["current"]
    return _state["current"] if device is None else int(device)


def _set_device(device) -> None:
    """``torch.cuda.set_device`` under the mapping: remembers the index (``current_device()``), within the count."""
    index = _index(device)
    if not 0 <= index < _state["count"]:
        raise RuntimeError(f"CUDA error: invalid device ordinal {index} ({OPTION}: {_state['count']} device(s))")
    _state["current"] = index


class _DeviceContext:
    """``torch.cuda.device(i)`` / ``device_of(t)`` under the mapping: selects index ``i`` while open."""

    def __init__(self, device):
        self.index, self.previous = _index(device) if not isinstance(device, torch.Tensor) else None, None

    def __enter__(self):
        self.previous = _state["current"]
        if self.index is not None and self.index >= 0:
            _set_device(self.index)

    def __exit__(self, *exc):
        _state["current"] = self.previous
        return False


def _mem_get_info(device=None) -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _own_function(name: str, body, module: str = "torch.cuda"):
    """``body`` as a function of its own named ``module.name``: torch._dynamo's rules map torch's functions by
    identity, and refuse to import when one object stands under two names with different rules."""

    def mapped(*args, **kwargs):
        return body(*args, **kwargs)

    mapped.__name__, mapped.__qualname__, mapped.__module__ = name, name, module
    return mapped


def _nothing(*args, **kwargs) -> None:
    """A call with nothing to do on the CPU (no GPU work to wait for, no GPU memory to free or count)."""


def _zero(*args, **kwargs) -> int:
    """A GPU memory statistic: 0 bytes (the CPU holds no CUDA memory)."""
    return 0


def _said(body) -> str:
    """What a stand-in without a text of its own in :data:`_SAID` answers, for the census."""
    return {_nothing: "does nothing: no GPU work to wait for, free or reset", _zero: "0"}.get(body, "as on one GPU")


#: what the mapped calls answer, for the census and docs/scripts.md's table (by name; the others: :func:`_said`)
_SAID = {
    "is_available": "True",
    "is_initialized": "True",
    "current_accelerator": "the CUDA device",
    "device_count": "the local world size (LOCAL_WORLD_SIZE): one GPU per local rank",
    "current_device": "the index set_device kept",
    "current_device_index": "the index set_device_index kept",
    "current_device_idx": "the index set_device_index kept",
    "set_device": "keeps the index (past the count: CUDA's invalid device ordinal)",
    "set_device_index": "keeps the index (past the count: CUDA's invalid device ordinal)",
    "set_device_idx": "keeps the index (past the count: CUDA's invalid device ordinal)",
    "device_index": "selects the index while open",
    "current_stream": "the CPU's one synchronous order: never capturing, always done",
    "default_stream": "the CPU's one synchronous order: never capturing, always done",
    "set_stream": "does nothing: the CPU has one order",
    "stream": "the given stream while open (the CPU has one order: no switch)",
    "Stream": "a stream in the CPU's one synchronous order: waits and synchronize do nothing, query() is True",
    "Event": "a point in the CPU's one order: record() marks the time, elapsed_time() measures it, waits do nothing",
    "is_bf16_supported": "True",
    "is_current_stream_capturing": "False",
    "get_device_name": "'cpu (--cuda-on-cpu)'",
    "mem_get_info": "the machine's available and total memory",
    "get_memory_info": "the machine's available and total memory",
    "memory_stats": "{} (no CUDA memory)",
    "memory_summary": "a line saying there is no CUDA memory",
    "manual_seed": "nothing: the CPU generator draws every number (torch.manual_seed seeds it)",
    "manual_seed_all": "nothing: the CPU generator draws every number",
    "seed": "nothing: the CPU generator draws every number",
    "seed_all": "nothing: the CPU generator draws every number",
    "initial_seed": "the CPU generator's",
    "get_rng_state": "the CPU generator's state",
    "set_rng_state": "sets the CPU generator's state",
    "get_rng_state_all": "the CPU generator's state, once per device",
    "set_rng_state_all": "sets the CPU generator's state from the current device's",
    "get_device_properties": "a stand-in: name 'cpu (--cuda-on-cpu)', total_memory the memory the rank may use "
    "(available memory / local world size), major and minor 0, one multiprocessor (metrics only log them)",
}


def _device_properties(device=None):
    """``torch.cuda.get_device_properties`` under the mapping: what a trainer's metrics log at start-up (their numbers
    change nothing that is trained), answered for the CPU share a rank has (:data:`_SAID`)."""
    import types

    available, _ = _mem_get_info()
    return types.SimpleNamespace(
        name=f"cpu ({OPTION})",
        total_memory=available // max(_state["count"], 1),
        major=0,
        minor=0,
        multi_processor_count=1,
        is_integrated=False,
        is_multi_gpu_board=False,
    )


def _cuda_functions() -> None:
    cuda = torch.cuda
    originals = vars(cuda).copy()
    nothing, zero = _nothing, _zero
    mapped = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": nothing,
        "device_count": lambda: _state["count"],
        "current_device": lambda: _state["current"],
        "set_device": _set_device,
        "synchronize": nothing,
        "empty_cache": nothing,
        "ipc_collect": nothing,
        "is_bf16_supported": lambda *args, **kwargs: True,
        "is_current_stream_capturing": lambda: False,
        "get_device_name": lambda device=None: f"cpu ({OPTION})",
        "mem_get_info": _mem_get_info,
        "memory_stats": lambda *args, **kwargs: {},
        "memory_summary": lambda *args, **kwargs: f"{OPTION}: CUDA runs on the CPU; no CUDA memory to summarise",
        "set_per_process_memory_fraction": nothing,
        "manual_seed": nothing,  # the CPU generator draws every number; torch.manual_seed seeds it
        "manual_seed_all": nothing,
        "seed": nothing,
        "seed_all": nothing,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="cuda": torch.set_rng_state(new_state),
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(_state["count"])],
        "set_rng_state_all": lambda new_states: torch.set_rng_state(new_states[_state["current"]]),
        "get_device_properties": _device_properties,
        "current_stream": lambda device=None: _DEFAULT_STREAM,
        "default_stream": lambda device=None: _DEFAULT_STREAM,
        "set_stream": nothing,
        "stream": _stream_context,
    }
    for name in (
        "memory_allocated max_memory_allocated memory_reserved max_memory_reserved memory_cached max_memory_cached"
    ).split():
        mapped[name] = zero
    for name in (
        "reset_peak_memory_stats reset_max_memory_allocated reset_max_memory_cached reset_accumulated_memory_stats"
    ).split():
        mapped[name] = nothing
    for name, value in vars(cuda).copy().items():
        if name.startswith("_") or name in mapped or name in REFUSED or name in _STAND_IN_CLASSES:
            continue
        if not _defined_in(value, "torch.cuda") or (inspect.isclass(value) and issubclass(value, BaseException)):
            continue  # what it imported (typing's, functools'), and exceptions, which a script catches
        if inspect.isfunction(value):
            setattr(cuda, name, refusing(name, _UNMAPPED_REASON))
        elif inspect.isclass(value):  # the legacy tensor and storage types, memory pools, allocators
            setattr(cuda, name, refusing_class(name, _UNMAPPED_REASON))
    for name, value in mapped.items():
        setattr(cuda, name, marked(_own_function(name, value), "mapped", _SAID.get(name) or _said(value)))
    cuda.device = cuda.device_of = marked(_DeviceContext, "mapped", "selects the index while open")
    cuda.Stream = marked(_Stream, "mapped", _SAID["Stream"])
    cuda.StreamContext = marked(_stream_context, "mapped", _SAID["stream"])
    cuda.Event = marked(_Event, "mapped", _SAID["Event"])
    for name, reason in REFUSED.items():
        is_class = inspect.isclass(getattr(cuda, name, None))
        setattr(cuda, name, (refusing_class if is_class else refusing)(name, reason))
    nccl = "NCCL's own calls run on GPUs only"
    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "version", "unique_id"):
        setattr(cuda.nccl, name, refusing(f"nccl.{name}", nccl))
    for name, value in originals.items():  # torch._dynamo reads some at import (torch 2.15: use_mem_pool.__wrapped__)
        stand_in = getattr(cuda, name)
        if hasattr(value, "__wrapped__") and stand_in is not value and inspect.isfunction(stand_in):
            stand_in.__wrapped__ = value.__wrapped__


def _defined_in(value, module: str) -> bool:
    """True if ``value`` (a function or class) is ``module``'s own, not one it imported."""
    return (callable(value) and not inspect.ismodule(value)) and (getattr(value, "__module__", "") or "").startswith(
        module
    )


#: the device methods of Tensor and Module the census counts (those that name, or move to, a device)
DEVICE_METHODS = {
    torch.Tensor: ("to", "cuda", "pin_memory", "record_stream", "type", *TENSOR_FACTORIES),
    torch.nn.Module: ("to", "cuda", "to_empty"),
}


def census() -> dict[str, tuple[str, str]]:
    """Every public callable of ``torch.cuda`` and ``torch.accelerator`` that is theirs (not one they imported, nor
    an exception class a script catches), and the device methods of Tensor and Module (:data:`DEVICE_METHODS`), on
    this torch, after :func:`install`: ``{"torch.cuda.set_device": ("mapped", what it answers), ...}``, ``"refused"``
    with the reason, or ``"unclassified"`` (none may be: the census test calls each in a rank)."""
    found = {}
    for prefix, module in (("torch.cuda", torch.cuda), ("torch.accelerator", getattr(torch, "accelerator", None))):
        for name, value in sorted(vars(module or object).items()):
            if name.startswith("_") or inspect.ismodule(value):
                continue
            mark = getattr(value, CENSUS, None)
            if mark is None and not _defined_in(value, prefix):
                continue  # imported names (typing's Any, functools' lru_cache), never ours to map
            if mark is None and inspect.isclass(value) and issubclass(value, BaseException):
                continue  # an exception class: caught by a script, never called
            found[f"{prefix}.{name}"] = mark or ("unclassified", "")
    for cls, names in DEVICE_METHODS.items():
        for name in names:
            found[f"{cls.__name__}.{name}"] = getattr(getattr(cls, name), CENSUS, None) or ("unclassified", "")
    return found


# -- autocast and GradScaler ----------------------------------------------------------------------------------------


def _autocast_init(original):
    @functools.wraps(original)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if maps(device_type):
            device_type, enabled = "cpu", False  # fp32: CPU low-precision autocast is 2.3-10x slower
        original(self, device_type, dtype, enabled, cache_enabled)

    return __init__


def _scaler_init(original):
    @functools.wraps(original)
    def __init__(self, device="cuda", *args, **kwargs):
        original(self, "cpu" if maps(device) else device, *args, **kwargs)

    return __init__


def _amp() -> None:
    from torch.amp import autocast_mode, grad_scaler

    autocast_mode.autocast.__init__ = _autocast_init(autocast_mode.autocast.__init__)
    grad_scaler.GradScaler.__init__ = _scaler_init(grad_scaler.GradScaler.__init__)


# -- custom CUDA kernels --------------------------------------------------------------------------------------------

_KERNELS = "a custom CUDA kernel runs on a GPU only"


def _extensions() -> None:
    """Refuse CUDA kernels of ``torch.utils.cpp_extension`` (patched now if imported, else when it is: importing it
    takes 1.2 s, for setuptools)."""
    patch_on_import("torch.utils.cpp_extension", _refuse_cuda_kernels)


def _refuse_cuda_kernels(cpp_extension) -> None:
    def cuda_sources(sources) -> bool:
        sources = [sources] if isinstance(sources, str) else sources or []
        return any(str(s).endswith((".cu", ".cuh")) for s in sources)

    original_load, original_inline = cpp_extension.load, cpp_extension.load_inline

    @functools.wraps(original_load)
    def load(name, sources, *args, **kwargs):
        if cuda_sources(sources) or kwargs.get("with_cuda"):
            refuse("torch.utils.cpp_extension.load (CUDA sources)", _KERNELS)
        return original_load(name, sources, *args, **kwargs)

    @functools.wraps(original_inline)
    def load_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
        if cuda_sources or kwargs.get("with_cuda"):
            refuse("torch.utils.cpp_extension.load_inline (CUDA sources)", _KERNELS)
        return original_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    def cuda_extension(*args, **kwargs):
        refuse("torch.utils.cpp_extension.CUDAExtension", _KERNELS)

    cpp_extension.load, cpp_extension.load_inline, cpp_extension.CUDAExtension = load, load_inline, cuda_extension


def census_reference() -> str:
    """docs/cuda-census.md: the :func:`census` of this torch as a table (after :func:`install`), one row a call."""
    rows = [f"| `{name}` | {how} | {what.replace('|', '/')} |" for name, (how, what) in census().items()]
    counts = {how: sum(1 for h, _ in census().values() if h == how) for how in ("mapped", "refused")}
    return "\n".join(
        [
            "# The CUDA mapping's census (`--cuda-on-cpu`)",
            "",
            f"Generated on torch {torch.__version__.split('+')[0]} by",
            "`python -m ddpfaults.rank.cuda_on_cpu > docs/cuda-census.md` (tests/rank/test_cuda_census.py fails when",
            "it is stale). Every public callable of `torch.cuda` and `torch.accelerator` (their own: not what they",
            "import, nor the exception classes a script catches) and the device methods of `Tensor` and `Module`,",
            "each either **mapped** (what it answers on the CPU) or **refused** (`UnmappableCudaCall` naming the call",
            "and the script's line, and why). The census test calls every one inside a real rank, on the installed",
            "torch (CI: 2.8, 2.13 and 2.15).",
            f"{counts['mapped']} mapped, {counts['refused']} refused.",
            "",
            "| call | under the mapping | what it answers, or why it is refused |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    install(1)
    print(census_reference(), end="")
