"""Collectives paired across different steps: pure functions over rank results (no processes, no torch).

gloo pairs the ranks' collectives in the order they make them and checks sizes, not steps: a rank that skipped one
of DDP's gradient buckets at step 3 pairs its step-4 bucket with its peers' step-3 one, and every later step is
reduced against the wrong step's gradients, silently, until the world ends (a hang at the end, or a world that
completes). Each position of the ranks' sequences is compared as :func:`ddpfaults.judge.verdict.first_divergence`
does; a position where every rank's call matches in all but its step is a cross-step pairing. The comparison stops
at the first position where the calls differ otherwise (a divergence: what follows is not paired at all).

A pairing counts only where the rank behind (the lowest step) went on to a later step after its call: a rank
that left its loop and whose calls keep its last step (``Join``'s shadow collectives for a rank out of inputs)
is not training on.
"""

from __future__ import annotations

from ddpfaults.judge.results import POINT_TO_POINT, Collective, Desync, RankResult


def _what(call: Collective) -> tuple:
    return call.signature()[:4]


def _text(call: Collective) -> str:
    shapes = ", ".join(str(s) for s in call.shapes)
    return f"{call.op}({shapes})" + (f" [{call.note}]" if call.note else f" at {call.site}")


def cross_step(ranks: list[RankResult]) -> Desync | None:
    """The collectives ``ranks`` paired across steps (see the module docstring), or None."""
    if len(ranks) < 2:
        return None
    start = max((r.collectives[0].seq for r in ranks if r.collectives), default=1)
    calls = {
        r.rank: [c for c in r.collectives if c.op not in POINT_TO_POINT and c.group is None and c.seq >= start]
        for r in ranks
    }
    last = {r: max((c.step for c in cs if c.step is not None), default=None) for r, cs in calls.items()}
    lowest = min(calls)
    first, steps = None, set()
    for i in range(min(len(cs) for cs in calls.values())):
        here = {r: cs[i] for r, cs in calls.items()}
        if len({_what(c) for c in here.values()}) != 1:
            break  # a divergence: what follows is no pairing at all
        stepped = [c.step for c in here.values()]
        if None in stepped or len(set(stepped)) == 1:
            continue
        behind = min(stepped)
        if any(c.step == behind and c.step >= last[r] for r, c in here.items()):
            continue  # the rank behind is at its last step: out of its loop, not training on
        steps.add(here[lowest].step)
        if first is None:
            first = here
    if first is None:
        return None
    call = first[lowest]
    return Desync(
        index=call.seq,
        first_step=call.step,
        steps=len(steps),
        at=tuple((r, c.step) for r, c in sorted(first.items())),
        call=_text(call),
    )
