"""The resume check's two runs must not share an output: did the uninterrupted run load what the faulted run saved?

Each rank's capture notes the paths ``torch.save`` and ``torch.load`` were given (:mod:`ddpfaults.rank.resume`: a
record's ``files``, ``["saved" | "loaded", absolute path]``). The runs start in copies of the working directory of
their own, so a path both name lies outside it (``--ckpt /scratch/run1``): the uninterrupted run, started after the
faulted one, would resume from the faulted run's last checkpoint, and whatever it found would say nothing of the
resume. Pure data: imports no torch.
"""

from __future__ import annotations


def shared_file(baseline: list[list[dict]], attempts: list[list[list[dict]]]) -> str | None:
    """Why the check is refused, or None: the first path the uninterrupted run (``baseline``, records per rank)
    loaded with ``torch.load`` before it saved it itself, that the interrupted run (``attempts``) saved: the two runs
    shared an output (a checkpoint directory outside the working directory), so the uninterrupted run resumed from
    the faulted one's files."""
    written = {path for ranks in attempts for records in ranks for rec in records for how, path in _files(rec)}
    for rank, records in enumerate(baseline):
        own = set()
        for rec in records:
            for how, path in _files(rec, None):
                if how == "saved":
                    own.add(path)
                elif path in written and path not in own:
                    return (
                        f"the uninterrupted run's rank {rank} loaded {path}, which the faulted run saved: the two runs "
                        f"share that path, so the uninterrupted run resumed from the faulted run's files. Give each "
                        f"run its own: put {{run_dir}} in the script's arguments where the path goes (each run "
                        f"fills it with a directory of its own; docs/recovery.md), or keep the path inside the "
                        f"working directory (each run starts from its own copy); a rank function: ctx.shared_dir"
                    )
    return None


def _files(record: dict, how: str | None = "saved") -> list:
    """A record's ``[how, path]`` pairs of kind ``how`` (None: every pair)."""
    return [f for f in record.get("files", ()) if how is None or f[0] == how]
