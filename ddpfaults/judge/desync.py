"""Collectives paired across different steps: pure functions over rank results (no processes, no torch).

gloo pairs the ranks' collectives in the order they make them and checks sizes, not steps: a rank that skipped one
of DDP's gradient buckets at step 3 pairs its step-4 bucket with its peers' step-3 one, and every later step is
reduced against the wrong step's gradients, silently, until the world ends (a hang at the end, or a world that
completes). Each position of the ranks' sequences is compared as :func:`ddpfaults.judge.verdict.first_divergence`
does; a position where every rank's call matches in all but its step is a cross-step pairing. The comparison stops
at the first position where the calls differ otherwise (a divergence: what follows is not paired at all).

A pairing counts only where the rank behind (the lowest step) was still in its loop: a rank that left its loop
and whose calls keep its last step (``Join``'s shadow collectives for a rank out of inputs) is not training on.
Its last step's calls up to as many as any of its other steps made are its loop's (that step's backward, paired
wrong like the others: a rank whose data ran out a batch early); the ones past them are made out of its loop.
"""

from __future__ import annotations

from ddpfaults.judge.results import POINT_TO_POINT, Collective, Desync, RankResult


def _what(call: Collective) -> tuple:
    return call.signature()[:4]


def _text(call: Collective) -> str:
    shapes = ", ".join(str(s) for s in call.shapes)
    return f"{call.op}({shapes})" + (f" [{call.note}]" if call.note else f" at {call.site}")


def _out_of_loop(calls: list[Collective]) -> set[int]:
    """The positions of ``calls`` made out of the rank's loop: at its last step, past as many calls as any of its
    other steps made (all of them when it made calls at no other step)."""
    counts: dict = {}
    for c in calls:
        if c.step is not None:
            counts[c.step] = counts.get(c.step, 0) + 1
    if not counts:
        return set()
    last = max(counts)
    usual = max((n for step, n in counts.items() if step != last), default=0)
    at_last = [i for i, c in enumerate(calls) if c.step == last]
    return set(at_last[usual:])


def cross_step(ranks: list[RankResult]) -> Desync | None:
    """The collectives ``ranks`` paired across steps (see the module docstring), or None."""
    if len(ranks) < 2:
        return None
    start = max((r.collectives[0].seq for r in ranks if r.collectives), default=1)
    calls = {
        r.rank: [c for c in r.collectives if c.op not in POINT_TO_POINT and c.group is None and c.seq >= start]
        for r in ranks
    }
    out = {r: _out_of_loop(cs) for r, cs in calls.items()}
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
        if any(c.step == behind and i in out[r] for r, c in here.items()):
            continue  # the rank behind is out of its loop, not training on
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
