"""The seams of torch a world's ranks used, read from their records (pure; no processes, no torch): what a fault
that never fired could have acted through, and what the code under test did use instead."""

from __future__ import annotations

from ddpfaults.judge.results import RankResult

#: every seam a fault may act through (a fault's ``seam``) or a rank may use, and how a report names it
SEAMS = {
    "dataloader": "batches drawn from a DataLoader",
    "ddp": "DistributedDataParallel",
    "fsdp": "FSDP",
    "torch_save": "checkpoint saves (torch.save or DCP)",
    "dcp": "DCP (dcp.save, dcp.load)",
    "collectives": "collectives of its own",
    "optimizer": "optimizer steps",
    "ctx.step": "ctx.step",
}


def used(ranks: list[RankResult]) -> list[str]:
    """The seams (keys of :data:`SEAMS`, in its order) any of ``ranks`` used: a DataLoader batch drawn, a module
    wrapped in DDP or FSDP (or a collective they made), a save, DCP's collectives, a collective of the code's own,
    steps counted by the optimizer or by ``ctx.step``."""
    found = set()
    for rank in ranks:
        kinds = {e.get("k") for e in rank.events}
        makers = {c.maker for c in rank.collectives}
        wrapped = {w.get("kind") for w in rank.wrapped}
        if "batch" in kinds or "loader_end" in kinds:
            found.add("dataloader")
        if "ddp" in wrapped or any(m.startswith("ddp") for m in makers):
            found.add("ddp")
        if "fsdp" in wrapped or any(m.startswith("fsdp") for m in makers):
            found.add("fsdp")
        if "saved" in kinds:
            found.add("torch_save")
        if "dcp" in makers:
            found.add("dcp")
        if "user" in makers:
            found.add("collectives")
        found |= {e.get("clock") for e in rank.events if e.get("k") == "step"} & {"optimizer", "ctx.step"}
    return [seam for seam in SEAMS if seam in found]


def unused_hint(seam: str | None, ranks: list[RankResult]) -> str:
    """Why a fault acting through ``seam`` never fired on ``ranks``, when they never used it: the seam, and the
    ones they did use ("" when they used it, or the fault has no one seam)."""
    if seam is None:
        return ""
    seen = used(ranks)
    if seam in seen:
        return ""
    did = ", ".join(SEAMS[s] for s in seen) if seen else "none ddpfaults sees"
    return f"it acts through {SEAMS[seam]}, which the ranks it targets never used (the seams they used: {did})"
