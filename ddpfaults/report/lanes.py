"""The swimlanes of the HTML report: a compressed time axis, one lane per rank (life, steps, collectives,
faults, errors), and the small text helpers the page shares."""

from __future__ import annotations

import itertools
import math
import re
from bisect import bisect_right
from html import escape

from ddpfaults.judge.results import RankState
from ddpfaults.report.document import timeline_calls

GLOO_PREFIX = re.compile(r"\[[^\]]*/gloo/[^\]]*\] ")
DEAD = (str(RankState.RAISED), str(RankState.DIED))


def esc(text) -> str:
    """HTML-escaped text of any value ("" for None)."""
    return escape("" if text is None else str(text), quote=True)


def short(text, limit: int = 200) -> str:
    """``text`` escaped, cut to ``limit`` characters with an ellipsis."""
    text = GLOO_PREFIX.sub("", "" if text is None else str(text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def seconds_text(seconds: float) -> str:
    """A duration for titles: ``12.0 ms`` or ``1.50 s``."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


class Scale:
    """Seconds since world start → percent of the track width, compressed (log-shrunk gaps) and linear."""

    def __init__(self, times, end: float, emphasis=()):
        times = list(times)
        first = min(times, default=0.0)
        self.start = max(0.0, first - 0.02 * (end - first))  # nothing happens before the first rank event
        self.end = max(end, self.start + 1e-6)
        marks = [t for a, b, _ in emphasis for t in (a, b)]
        self.points = sorted({self.start, self.end, *(self._clip(t) for t in times + marks)})
        tau = (self.end - self.start) / 1000  # gaps much shorter than this stay linear, longer ones shrink (log)
        weights = [math.log1p((b - a) / tau) for a, b in itertools.pairwise(self.points)]
        for a, b, fraction in emphasis:  # give an interval (the stall, the steps) at least this share of the width
            inside = [i for i in range(len(weights)) if a <= self.points[i] and self.points[i + 1] <= b]
            w_in = sum(weights[i] for i in inside)
            w_out = sum(weights) - w_in
            if w_in and w_out and w_in / (w_in + w_out) < fraction:
                for i in inside:
                    weights[i] *= fraction * w_out / ((1 - fraction) * w_in)
        xs = [0.0]
        for w in weights:
            xs.append(xs[-1] + w)
        self.xs = [100 * x / xs[-1] for x in xs]

    def _clip(self, t) -> float:
        return min(max(float(t), self.start), self.end)

    def compressed(self, t: float) -> float:
        """Percent position of ``t`` on the compressed axis."""
        t = self._clip(t)
        i = min(bisect_right(self.points, t) - 1, len(self.points) - 2)
        a, b = self.points[i], self.points[i + 1]
        return self.xs[i] + (self.xs[i + 1] - self.xs[i]) * (t - a) / (b - a)

    def inverse(self, x: float) -> float:
        """The time at percent position ``x`` of the compressed axis."""
        i = min(bisect_right(self.xs, x) - 1, len(self.xs) - 2)
        span = self.xs[i + 1] - self.xs[i]
        return self.points[i] + (self.points[i + 1] - self.points[i]) * ((x - self.xs[i]) / span if span else 0)

    def linear(self, t: float) -> float:
        """Percent position of ``t`` on the linear axis."""
        return 100 * (self._clip(t) - self.start) / (self.end - self.start)

    def style(self, t0: float, t1: float | None = None) -> str:
        """CSS variables placing an element at ``t0`` (and, for a block, ending at ``t1``) on both axes."""
        c0, l0 = self.compressed(t0), self.linear(t0)
        style = f"--cl:{c0:.3f}%;--ll:{l0:.3f}%"
        if t1 is not None:
            style += f";--cw:{self.compressed(t1) - c0:.3f}%;--lw:{self.linear(t1) - l0:.3f}%"
        return style


# -- summary -----------------------------------------------------------------------------------
def ticks(scale: Scale) -> str:
    """The time axis labels of ``scale``."""
    ticks = []
    for k in range(9):
        x = k * 12.5
        ticks.append(f"<span class='tick c' style='--x:{x}%'>{scale.inverse(x):.3f} s</span>")
    raw = (scale.end - scale.start) / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    for k in range(math.ceil(scale.start / step), math.floor(scale.end / step) + 1):
        ticks.append(f"<span class='tick l' style='--x:{scale.linear(k * step):.3f}%'>{k * step:.4g} s</span>")
    return "".join(ticks)


def item(cls: str, scale: Scale, t0: float, t1: float | None, title: str, label: str = "") -> str:
    """One positioned block (a collective, a step, a marker) on a lane, with a tooltip."""
    return f"<div class='{cls}' style='{scale.style(t0, t1)}' title='{esc(title)}'>{esc(label)}</div>"


class RankTimes:
    """The moments of one rank's life that its drawing needs, from its (time-sorted) events."""

    def __init__(self, r: dict, verdict_t: float, end: float):
        self.events = sorted(r.get("events") or [], key=lambda e: e.get("t", 0))
        first = {}
        for e in self.events:
            first.setdefault(e.get("k"), e)
        self.start, self.finished, self.failed = first.get("start"), first.get("finished"), first.get("failed")
        self.death = first["exited"]["t"] if "exited" in first else None  # the process ended
        ended = [e["t"] for e in (self.finished, self.failed, first.get("exited")) if e]
        self.stop = min(ended) if ended else verdict_t  # the function stopped running
        self.life_end = self.death if self.death is not None else first["killed"]["t"] if "killed" in first else end
        self.verdict_t = verdict_t


def lane(r: dict, result, divergence, scale: Scale, verdict_t: float, end: float, is_root: bool, calls=None) -> str:
    """One rank's row: label, track (life, steps, collectives, markers), state text; ``calls``: the rank's
    :func:`~ddpfaults.report.document.timeline_calls`, if the caller has them already."""
    rank, state = r.get("rank"), str(r.get("state"))
    times = RankTimes(r, verdict_t, end)
    parts = _life_and_steps(times, scale, rank)
    parts += _collectives(r, times, scale, divergence, timeline_calls(r) if calls is None else calls)
    div_index = divergence.index if divergence else None
    made = max((c.seq for c in result.collectives), default=0) if result is not None else None
    if div_index and made is not None and made < div_index and state not in DEAD:
        skipped = [e["t"] for e in times.events if e.get("k") == "fault" and e.get("effect") == "skipped"]
        parts.append(
            item(
                "mk divergence-absent",
                scale,
                skipped[-1] if skipped else times.stop,
                None,
                f"rank {rank} never called collective #{div_index} (it was at: {r.get('where') or state})",
                f"no #{div_index}",
            )
        )
    parts += _markers(times, scale)
    error = r.get("error")
    mark_at = times.failed["t"] if times.failed else times.death if state == str(RankState.DIED) else None
    if error and mark_at is not None:
        cls = " collateral" if r.get("collateral") else ""
        parts.append(item("mk failed" + cls, scale, mark_at, None, f"{state}: {error}", "✕"))
        parts.append(
            f"<div class='err{cls}' style='{scale.style(mark_at)}' title='{esc(error)}'>{esc(short(error, 160))}</div>"
        )

    status = r.get("where") or ""
    if error:
        status = ("(collateral) " if r.get("collateral") else "") + short(error, 300)
    root = " root" if is_root else ""
    return (
        f"<div class='tl-row lane st-{esc(state)}{root}' data-rank='{esc(rank)}' data-state='{esc(state)}' tabindex=0>"
        f"<div class=tl-label title='rank {esc(rank)}: {esc(state)}{' · root cause' if is_root else ''}'>"
        f"<i class='dot st-{esc(state)}'></i>rank {esc(rank)}{'<b class=star>★</b>' if is_root else ''}</div>"
        f"<div class=tl-track>{''.join(parts)}</div>"
        f"<div class=tl-status title='{esc(status)}'>"
        f"<b class='st st-{esc(state)}'>{esc(state)}</b> {esc(status)}</div></div>"
    )


def _life_and_steps(times: RankTimes, scale: Scale, rank) -> list[str]:
    """The process's life line, what it did after its function ended, and one band per step."""
    parts = []
    if times.start:
        parts.append(
            item(
                "it life",
                scale,
                times.start["t"],
                times.life_end,
                f"rank {rank} process alive {times.start['t']:.3f}–{times.life_end:.3f} s",
            )
        )
    if times.finished:
        parts.append(
            item("it after done", scale, times.finished["t"], times.life_end, "finished; waiting for the verdict")
        )
    elif times.failed and (times.death is None or times.death > times.failed["t"]):
        parts.append(
            item("it after failed", scale, times.failed["t"], times.life_end, "raised; waiting to exit or lingering")
        )
    steps = [e for e in times.events if e.get("k") == "step"]
    for e, nxt in itertools.zip_longest(steps, steps[1:]):
        t1 = nxt["t"] if nxt else max(times.stop, e["t"])
        parts.append(
            item(
                f"it step s{int(e.get('step') or 0) % 2}",
                scale,
                e["t"],
                t1,
                f"step {e.get('step')}: {e['t']:.3f}–{t1:.3f} s ({seconds_text(t1 - e['t'])})",
                f"step {e.get('step')}",
            )
        )
    return parts


def _maker_class(call) -> str:
    """The colour class of a call by who made it: DDP's (`` ddp``), FSDP's (`` fsdp``), DTensor's or DCP's
    (`` lib``), the code's own (``""``)."""
    if call.maker.startswith("ddp"):
        return " ddp"
    if call.maker.startswith("fsdp"):
        return " fsdp"
    return " lib" if call.maker in ("dtensor", "dcp") else ""


def _collectives(r: dict, times: RankTimes, scale: Scale, divergence, calls) -> list[str]:
    """One block per call of :func:`~ddpfaults.report.document.timeline_calls`: entered → left; never left: to
    the rank's death, else to the verdict; a flight-recorder call whose end is not recorded: a thin block at the
    time it was issued. Blocks are labelled with the call's number among the rank's collectives."""
    parts = []
    for call in calls:
        init = call.op == "init_process_group"
        recorded = call.source == "flight recorder"
        cls = "it coll" + (" init" if init else "") + _maker_class(call) + (" fr" if recorded else "")
        what = call_text({**call.record(), "done": True}) + (" — from the flight recorder" if recorded else "")
        began = f"{'issued' if recorded else 'entered'} {call.t0:.3f} s"
        t1 = call.t1
        if not call.left:
            t1 = times.death if times.death is not None else times.verdict_t
            cls += " open"
            inside = "died inside it" if times.death is not None else "still inside at the verdict"
            how = f"{began}, never left ({inside})"
        elif t1 is None:
            t1 = call.t0
            cls += " noend"
            how = f"{began}, completed (the recorder keeps no end time)"
        else:
            how = f"{began}, left {t1:.3f} s ({seconds_text(t1 - call.t0)})"
        if divergence is not None and call.number is not None and call.number == divergence.index:
            cls += " divergence" + (" odd" if r.get("rank") in divergence.odd_ranks else "")
            how += " — FIRST DIVERGENT COLLECTIVE"
        label = "init" if init else f"#{call.number} {call.op}" if call.number is not None else call.op
        parts.append(item(cls, scale, call.t0, max(t1, call.t0), f"#{call.number or 0} {what}: {how}", label))
    return parts


def _markers(times: RankTimes, scale: Scale) -> list[str]:
    """Faults fired, log lines, the process's exit and the launcher's kill."""
    parts = []
    for e in times.events:
        kind, t = e.get("k"), e.get("t", 0)
        if kind == "fault":
            parts.append(item("mk fault", scale, t, None, f"fault fired: {e.get('fault')} ({e.get('how')})"))
        elif kind == "log":
            parts.append(item("mk log", scale, t, None, f"log: {e.get('msg')}"))
        elif kind == "killed":
            parts.append(item("mk killed", scale, t, None, f"killed by the launcher at {t:.3f} s"))
        elif kind == "exited":
            code = e.get("code")
            parts.append(
                item(
                    "mk exited" + (" signal" if (code or 0) < 0 else ""),
                    scale,
                    t,
                    None,
                    f"process exited (code {code}) at {t:.3f} s",
                )
            )
    return parts


def call_text(c: dict) -> str:
    """A collective record as one line: ``all_reduce([4]) at f.py:3 in g (step 1)``."""
    shapes = ", ".join(str(s) for s in c.get("shapes") or [])
    note = f" [{c['note']}]" if c.get("note") else ""
    step = f" (step {c['step']})" if c.get("step") is not None else ""
    return f"{c.get('op')}({shapes}){note} at {c.get('site')}{step}{'' if c.get('done') else ' — not left'}"
