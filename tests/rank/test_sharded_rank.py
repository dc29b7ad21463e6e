"""The rank side's reading of FSDP2 and DCP: who made a collective, from the live stack (the tracing), and which ranks
a DCP ``CheckpointException`` names (the ``failed`` event)."""

from types import SimpleNamespace

from torch.distributed.checkpoint.api import CheckpointException

from ddpfaults.rank.dcp import failing_ranks
from ddpfaults.rank.tracing import _maker

TORCH = "/venv/site-packages/torch"


def _stack(*frames):
    """A frame chain, innermost first, of (path, function) pairs."""
    frame = None
    for path, name in reversed(frames):
        frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=path, co_name=name), f_back=frame)
    return frame


def test_the_tracing_tells_fsdp2s_and_dcps_calls_from_the_users():
    user = ("/home/me/train.py", "main")
    fsdp = f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_collectives.py"
    backward = (f"{TORCH}/autograd/graph.py", "_engine_run_backward")
    assert _maker(_stack((fsdp, "__call__"), (fsdp, "foreach_all_gather"), user)) == "fsdp_all_gather"
    assert _maker(_stack((fsdp, "foreach_reduce"), backward, user)) == "fsdp_reduce_scatter"
    assert _maker(_stack((f"{TORCH}/distributed/checkpoint/utils.py", "gather_object"), user)) == "dcp"
    # a user's collective inside backward (a hook) is the user's: DDP's buckets are told by ctx.ddp's hook, not here
    assert _maker(_stack(backward, user)) == "user"
    assert _maker(_stack(user)) == "user" and _maker(None) == "user"


def test_a_checkpoint_exception_names_the_ranks_that_failed():
    failures = {3: (OSError("torn"), None), 1: (OSError("torn"), None)}
    assert failing_ranks(CheckpointException("load", failures)) == [1, 3]
    try:
        try:
            raise CheckpointException("load", {2: (OSError("torn"), None)})
        except CheckpointException as exc:
            raise RuntimeError("resume failed") from exc
    except RuntimeError as wrapped:
        assert failing_ranks(wrapped) == [2]  # raised from one: its cause names them
    assert failing_ranks(RuntimeError("Connection closed by peer")) is None and failing_ranks(None) is None
