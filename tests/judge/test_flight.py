"""Reading a flight-recorder dump (pure: hand-built dumps in the layout torch 2.13 writes)."""

from __future__ import annotations

from ddpfaults.judge.flight import collectives

FRAMES = [{"filename": "/home/u/train.py", "line": 31, "name": "train_step"}]


def entry(seq, sizes, *, created, retired, backend="gloo", completed_ns=None):
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "profiling_name": f"{backend}:all_reduce",
        "time_created_ns": created,
        "input_sizes": sizes,
        "frames": FRAMES,
        "state": "scheduled",
        "retired": retired,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": completed_ns,
    }


def test_a_collective_that_finished_before_an_earlier_one_is_done_and_times_are_kept():
    """Gloo runs a group's work on two threads: #2 (small) finished before #1 (big), so the group's
    last_completed is 1 although #2 is done (retired); #3 is still running. Each keeps its issue time."""
    dump = {
        "pg_status": {"0": {"last_enqueued_collective": 3, "last_completed_collective": 1}},
        "entries": [
            entry(1, [[2757]], created=1_000_100_000_000, retired=True),
            entry(2, [[9]], created=1_000_200_000_000, retired=True),
            entry(3, [[1]], created=1_000_300_000_000, retired=False),
        ],
    }
    found = collectives(dump, since_wall=1000.0, steps=[(1000.05, 0), (1000.25, 1)])
    assert [(c.seq, c.done, c.step, c.wall, c.wall_end) for c in found] == [
        (1, True, 0, 1000.1, None),
        (2, True, 0, 1000.2, None),
        (3, False, 1, 1000.3, None),
    ]
    assert found[0].site == "train.py:31 in train_step"


def test_other_backends_count_a_retired_entry_as_done_only_with_its_completion():
    """NCCL retires an entry that timed out too: without a completion time it is not done."""
    dump = {
        "pg_status": {"0": {"last_completed_collective": 0}},
        "entries": [
            entry(1, [[4]], created=1_000_100_000_000, retired=True, backend="nccl", completed_ns=1_000_150_000_000),
            entry(2, [[4]], created=1_000_200_000_000, retired=True, backend="nccl"),
        ],
    }
    found = collectives(dump, since_wall=None, steps=[])
    assert [(c.done, c.wall_end) for c in found] == [(True, 1000.15), (False, None)]


def test_a_collective_is_placed_in_its_step_by_sequence_number_not_by_the_recorders_clock():
    """Torch's approximate clock stamped #2 (made just after step 1 began, when the group had issued 1) before the
    step event's wall time: the sequence number still puts it in step 1. Without sequence numbers: by time."""
    dump = {
        "entries": [
            entry(1, [[1]], created=1_000_100_000_000, retired=True),
            entry(2, [[1]], created=1_000_199_999_000, retired=True),
        ],
        "pg_status": {"0": {"last_completed_collective": 2}},
    }
    with_seq = collectives(dump, since_wall=None, steps=[(1000.05, 0, 0), (1000.2, 1, 1)])
    assert [c.step for c in with_seq] == [0, 1]
    by_time = collectives(dump, since_wall=None, steps=[(1000.05, 0), (1000.2, 1)])
    assert [c.step for c in by_time] == [0, 0]


def _entry(*frames):
    return {"frames": [{"filename": path, "name": name, "line": 1} for path, name in frames]}


def test_a_recorded_collective_says_who_made_it():
    from ddpfaults.judge.flight import _maker

    torch_dir = "/venv/site-packages/torch"
    user = ("/home/me/train.py", "main")
    backward = (f"{torch_dir}/autograd/graph.py", "_engine_run_backward")
    assert _maker(_entry((f"{torch_dir}/distributed/distributed_c10d.py", "all_reduce"), user)) == "user"
    assert _maker(_entry(backward, user)) == "ddp_bucket"
    fsdp = f"{torch_dir}/distributed/fsdp/_fully_shard"
    # FSDP2 reduces in backward and gathers in its own _pre_forward: never DDP's
    assert _maker(_entry((f"{fsdp}/_fsdp_collectives.py", "foreach_reduce"), backward, user)) == "fsdp_reduce_scatter"
    gather = _entry((f"{fsdp}/_fsdp_collectives.py", "foreach_all_gather"), (f"{fsdp}/_fsdp_state.py", "_pre_forward"))
    assert _maker(gather) == "fsdp_all_gather"
    ddp_forward = _entry((f"{torch_dir}/nn/parallel/distributed.py", "_pre_forward"), user)
    assert _maker(ddp_forward) == "ddp_forward"
    assert _maker(_entry((f"{torch_dir}/distributed/checkpoint/utils.py", "scatter_object"), user)) == "dcp"
    tracing = ("/src/ddpfaults/rank/tracing.py", "_traced_call")
    own = _entry(tracing, ("/src/ddpfaults/faults/step.py", "on_step"), ("/src/ddpfaults/rank/job.py", "run_job"))
    assert _maker(own) == "ddpfaults"
    assert (
        _maker(_entry(tracing, ("/home/me/rankfns.py", "train"), ("/src/ddpfaults/rank/job.py", "run_job"))) == "user"
    )
    mapped = ("/src/ddpfaults/rank/nccl_on_gloo.py", "barrier")  # the user's barrier(device_ids=...), cuda_on_cpu
    assert _maker(_entry(tracing, mapped, ("/home/me/train.py", "main"), ("/src/ddpfaults/rank/job.py", "x"))) == "user"
    assert _maker(_entry(tracing, mapped, ("/src/ddpfaults/faults/step.py", "on_step"))) == "ddpfaults"
    toy = _entry(("/src/ddpfaults/toy/models.py", "_reduce_num_masks"), ("/src/ddpfaults/rank/job.py", "run_job"))
    assert _maker(toy) == "user"  # code ddpfaults ships for scenarios is the user's side


def test_a_record_cut_by_the_ring_buffer_keeps_the_jobs_collective_numbers():
    """Torch keeps the last TORCH_FR_BUFFER_SIZE entries: after 8136 collectives a 4000-entry record starts at record
    id 4136. A record that began empty with the job is numbered by record id (#4137 is the job's 4137th collective,
    not #1); one that did not (a warm rank that could not empty it) by position."""
    dump = {
        "pg_status": {"0": {"last_completed_collective": 8136}},
        "entries": [
            {**entry(seq, [[9]], created=1_000_000_000_000 + seq, retired=True), "record_id": seq - 1}
            for seq in (4137, 4138)
        ],
    }
    assert [c.seq for c in collectives(dump, since_wall=None, steps=[], fresh=True)] == [4137, 4138]
    assert [c.seq for c in collectives(dump, since_wall=None, steps=[], fresh=False)] == [1, 2]


def test_a_call_site_is_the_user_s_line_with_the_library_s_frame_beside_it():
    """events.call_site, the one rule the rank's tracing and the flight record's reader share."""
    from ddpfaults.events import call_site

    def machinery(path):
        return "/torch/" in path or path.startswith("<")

    lib = "/venv/lib/python3.11/site-packages/accelerate/utils/operations.py"
    frames = [
        ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
        (lib, 355, "_gpu_gather"),
        ("/venv/lib/python3.11/site-packages/accelerate/accelerator.py", 2500, "gather"),
        ("/home/me/train.py", 89, "main"),
        ("<frozen runpy>", 88, "_run_code"),
    ]
    assert call_site(frames, machinery) == "train.py:89 in main (via accelerate/utils/operations.py:355 in _gpu_gather)"
    assert call_site(frames[3:], machinery) == "train.py:89 in main"
    assert call_site(frames[:3], machinery) == "accelerate/utils/operations.py:355 in _gpu_gather"
    assert call_site(frames[:1], machinery) == "?"
