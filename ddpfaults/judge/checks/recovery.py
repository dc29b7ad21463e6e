"""What a preemption did to a world, read from its result as data: which ranks got the notice, which handled it
(were not ended by the notice itself), which saved a checkpoint after it, which the grace period's SIGKILL ended,
and how many steps of work no checkpoint holds."""

from __future__ import annotations


def preemption(result) -> dict | None:
    """The preemption of ``result``'s world (a :class:`~ddpfaults.judge.results.WorldResult`), or None if no
    ``Preempt`` fired. ``steps_lost``: the furthest step a rank reached minus the step of the last checkpoint any
    rank saved (all of them without one)."""
    notices = [f for f in result.fired if f.effect == "preempted" and f.signal is None]
    if not notices:
        return None
    notified = sorted({f.rank for f in notices})
    expired = sorted({f.rank for f in result.fired if f.effect == "preempted" and f.signal == "SIGKILL"})
    handled, saved, saves = [], [], []
    for r in result.ranks:
        events = r.events
        notice = next((e["t"] for e in events if e.get("k") == "fault" and e.get("effect") == "preempted"), None)
        saves += [e["step"] or 0 for e in events if e.get("k") == "saved"]
        if r.rank not in notified:
            continue
        # a torchrun judge sees no exit code: a rank that died there, not by the grace period's SIGKILL
        died = r.exitcode < 0 if r.exitcode is not None else r.state == "died"
        died_of_notice = died and r.rank not in expired
        if not died_of_notice:
            handled.append(r.rank)
        # a save counts from when it began (its end less ``took``): a periodic one begun before the notice is no answer
        if notice is not None and any(e.get("k") == "saved" and e["t"] - e.get("took", 0) >= notice for e in events):
            saved.append(r.rank)
    reached = max((r.last_step for r in result.ranks if r.last_step is not None), default=0)
    last = max(saves, default=None)
    return {
        "fault": notices[0].fault,
        "step": notices[0].step,
        "notified": notified,
        "handled": handled,
        "saved": saved,
        "killed_after_grace": expired,
        "last_checkpoint_step": last,
        "steps_lost": max(reached - (last or 0), 0),
    }


def describe_preemption(p: dict) -> str:
    """The preemption in one line of a report."""

    def who(ranks):
        return ", ".join(map(str, ranks)) if ranks else "none"

    checkpoint = (
        "no checkpoint saved"
        if p["last_checkpoint_step"] is None
        else (f"last checkpoint at step {p['last_checkpoint_step']}")
    )
    return (
        f"preempted at step {p['step']} ({p['fault']}): ranks notified {who(p['notified'])}; handled by "
        f"{who(p['handled'])}; saved after the notice by {who(p['saved'])}; SIGKILLed after the grace period: "
        f"{who(p['killed_after_grace'])}; {checkpoint}, {p['steps_lost']} step(s) lost"
    )
