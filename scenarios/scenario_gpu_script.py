"""A trainer written for GPUs, run unmodified on CPU ranks with ``cuda_on_cpu`` (docs/scripts.md): the empty-batch
failure as the GPU script a team ships (``set_device``, ``.cuda()``, nccl, ``device_ids``, ``pin_memory``, autocast
and ``GradScaler`` on "cuda"). Its verdicts are the CPU script's (``scenario_scripts.py``):

- ``naive``: the empty rank ``continue`` s past its step, runs out of batches a step early and exits; its peers, in
  their last gradient all_reduce, get "Connection closed by peer". The verdict names rank 1.
- ``fixed``: the empty batch still runs forward and backward with a zero loss; every replica ends equal.
- ``side_stream``: the fixed trainer copying its batches on a side CUDA stream: a stream is the CPU's one synchronous
  order under the mapping (the copy is done when it returns, the wait has nothing to wait for), so it completes as the
  fixed one does.
"""

import ddpfaults
from _checks import REPLICAS_EQUAL, SAFE_STALL, expect
from ddpfaults.faults import EmptyBatch

empty_batch_gpu = ddpfaults.script_scenario(
    "scripts/train_gpu.py",
    name="empty_batch_gpu_script",
    world_size=4,
    cuda_on_cpu=True,
    faults=[EmptyBatch(rank=1, step=1)],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant("naive", argv=["--strategy", "naive"], expect=expect("crashed on rank 1")),
        ddpfaults.variant("fixed", argv=["--strategy", "fixed"], expect=expect("completed", REPLICAS_EQUAL)),
        ddpfaults.variant(
            "side_stream",
            argv=["--strategy", "fixed", "--side-stream"],
            expect=expect("completed"),  # the fixed variant checks the replicas; this one runs under torchrun too
        ),
    ],
)
