"""The resume check's two runs must not share an output: did the uninterrupted run read what the faulted run wrote?

Each rank's capture records every file the job read, wrote, renamed or removed (:mod:`ddpfaults.rank.files`: a
record's ``files``, ``file`` events of :mod:`ddpfaults.events`). The runs start in copies of the working directory of
their own, so a path both name lies outside it (``--ckpt /scratch/run1``): the uninterrupted run, started after the
faulted one, would resume from the faulted run's last checkpoint, and whatever it found would say nothing of the
resume. Pure data: imports no torch.
"""

from __future__ import annotations

#: how a file event leaves a file the job's: written in place, or moved into place under its name
WRITES = ("wrote", "renamed")

_FIX = (
    "Give each run its own: put {run_dir} in the script's arguments where the path goes (each run fills it with a "
    "directory of its own; docs/recovery.md), or keep the path inside the working directory (each run starts from its "
    "own copy); a rank function: ctx.shared_dir"
)


def paths(record: dict, hows: tuple) -> list[str]:
    """The paths of a record's file events whose ``how`` is one of ``hows``, in the order they were met."""
    return [f["path"] for f in record.get("files", ()) if f.get("how") in hows]


def shared_file(baseline: list[list[dict]], attempts: list[list[list[dict]]], written_at: dict) -> str | None:
    """Why the check is refused, or None: the first file the uninterrupted run (``baseline``, records per rank) read
    before it wrote it itself, that the interrupted run (``attempts``) wrote: the two runs shared an output (a
    checkpoint directory outside the working directory), so the uninterrupted run resumed from the faulted one's
    files. Read before the uninterrupted run's first optimizer step, it began there: at the step the faulted run had
    reached when it last wrote the file (``written_at``: path -> step)."""
    faulted = {path for ranks in attempts for records in ranks for rec in records for path in paths(rec, WRITES)}
    for rank, records in enumerate(baseline):
        own = set()
        for index, rec in enumerate(records):
            shared = []
            for event in rec.get("files", ()):
                if event["how"] in WRITES:
                    own.add(event["path"])
                elif event["how"] == "read" and event["path"] in faulted and event["path"] not in own:
                    shared.append(event)
            if shared and index == 0:  # before its first step: the largest is the checkpoint (a pointer beside it)
                path = max(shared, key=lambda e: e.get("size") or 0)["path"]
                return _refusal(rank, path, written_at.get(path, written_at.get(shared[0]["path"])))
            if shared:
                return _refusal(rank, shared[0]["path"], None)
    return None


def _refusal(rank: int, path: str, began: int | None) -> str:
    if began is not None:
        return (
            f"the uninterrupted run began at step {began} from {path}, which the faulted run wrote (rank {rank} read "
            f"it before its first step): it did not start from scratch, so it says nothing of the resume. {_FIX}"
        )
    return (
        f"the uninterrupted run's rank {rank} read {path}, which the faulted run wrote: the two runs share that path, "
        f"so the uninterrupted run resumed from the faulted run's files. {_FIX}"
    )
