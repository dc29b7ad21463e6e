"""One self-contained HTML page for a report document: a summary table, then a swimlane timeline per world.

A world is drawn as one lane per rank on a shared time axis: steps are bands, collectives are
blocks from entered to left (an unfinished one runs on to the rank's death, else to the verdict),
faults, failures, exits and the kill are markers, and a dead rank's error is written after its
failure. Over all lanes, the stall window is shaded and the verdict and the hang point are vertical
lines. The first divergent collective (:func:`ddpfaults.verdict.first_divergence`) is outlined on
every rank. Clicking a lane shows that rank's details (stack, traceback, output tail) below it.

The time axis is *compressed* by default: quiet gaps (start-up, the stall window) shrink
logarithmically so millisecond steps stay visible; "linear" shows true proportions. Both
positions are computed here and stored as CSS variables on each element, so the page draws
without JavaScript; the small inline script only handles clicks, the axis toggle and zoom.
Nothing is loaded from the network.

Stable hooks for tests: ``id="summary"``, ``section.world[data-world]``, ``.lane[data-rank]``,
``.divergence``, ``.hang-point``, ``.rank-detail[data-detail-rank]``.
"""

from __future__ import annotations

import math
import os
import re
from bisect import bisect_right
from html import escape

from .reportfile import build_document, check_document
from .results import RankResult, RankState, WorldResult
from .verdict import first_divergence

_GLOO_PREFIX = re.compile(r"\[[^\]]*/gloo/[^\]]*\] ")
_DEAD = (str(RankState.RAISED), str(RankState.DIED))


def render_html(document: dict) -> str:
    """The whole page for a report document (see :mod:`ddpfaults.reportfile`), as one HTML string."""
    check_document(document)
    worlds = list(enumerate(document["worlds"]))
    worlds.sort(key=lambda item: (item[1].get("outcome") == "completed", item[0]))  # failures first
    counts = {o: sum(w.get("outcome") == o for _, w in worlds) for o in ("crashed", "hung", "completed")}
    tally = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no worlds"
    body = [
        f"<header class=page><h1>ddpfaults report</h1><p>{len(worlds)} world{'s' * (len(worlds) != 1)}: "
        f"{_e(tally)} <span class=muted>· schema {_e(document['schema'])}</span></p></header>",
        _summary(worlds), _LEGEND,
        *(_world(i, w) for i, w in worlds),
    ]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>ddpfaults report: {_e(tally)}"
            f"</title><meta name=viewport content='width=device-width,initial-scale=1'>\n<style>{_CSS}</style>"
            f"</head>\n<body>\n" + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n")


def write_html(path, worlds, nodeids=None) -> str:
    """Write the page for ``worlds`` (WorldResults, their dicts, or a whole document) to ``path``; return it."""
    document = worlds if isinstance(worlds, dict) and "schema" in worlds else build_document(worlds, nodeids)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(document))
    return path


# -- small helpers ---------------------------------------------------------------------------------
def _e(text) -> str:
    return escape("" if text is None else str(text), quote=True)


def _short(text, limit: int = 200) -> str:
    text = _GLOO_PREFIX.sub("", "" if text is None else str(text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dur(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _name(world: dict) -> str:
    return world.get("nodeid") or world.get("function") or "world"


class _Scale:
    """Seconds since world start → percent of the track width, compressed (log-shrunk gaps) and linear."""

    def __init__(self, times, end: float, emphasis=()):
        times = list(times)
        first = min(times, default=0.0)
        self.start = max(0.0, first - 0.02 * (end - first))  # nothing happens before the first rank event
        self.end = max(end, self.start + 1e-6)
        marks = [t for a, b, _ in emphasis for t in (a, b)]
        self.points = sorted({self.start, self.end, *(self._clip(t) for t in times + marks)})
        tau = (self.end - self.start) / 1000  # gaps much shorter than this stay linear, longer ones shrink (log)
        weights = [math.log1p((b - a) / tau) for a, b in zip(self.points, self.points[1:])]
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
def _summary(worlds) -> str:
    rows = []
    for i, w in worlds:
        outcome = _e(w.get("outcome"))
        rows.append(
            f"<tr class='o-{outcome}'><td><a href='#world-{i}'>#{i + 1}</a></td>"
            f"<td class=name><a href='#world-{i}'>{_e(_name(w))}</a></td>"
            f"<td><span class='badge o-{outcome}'>{outcome}</span></td><td class=num>{_e(w.get('world_size'))}</td>"
            f"<td class=cause title='{_e(w.get('root_cause'))}'>{_e(_short(w.get('root_cause'), 400))}</td>"
            f"<td class=num>{float(w.get('elapsed') or 0):.2f}</td><td class=num>{_e(w.get('seed'))}</td></tr>"
        )
    return ("<table id=summary><thead><tr><th>#</th><th>test / function</th><th>verdict</th><th>ranks</th>"
            "<th>root cause</th><th>seconds</th><th>seed</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


# -- one world -----------------------------------------------------------------------------------
def _world(index: int, w: dict) -> str:
    ranks = w["ranks"]
    try:
        results = [RankResult.from_dict(r) for r in ranks]
        divergence = first_divergence(results)
    except (KeyError, TypeError, ValueError):  # a hand-edited document: draw it without the highlight
        results, divergence = [], None
    events = sorted(w.get("events") or [], key=lambda e: e.get("t", 0))
    verdict_t = next((e["t"] for e in events if e.get("k") == "verdict"), float(w.get("elapsed") or 0))
    all_times = [e["t"] for r in ranks for e in r.get("events") or [] if "t" in e] + [e["t"] for e in events]
    end = max([verdict_t, *all_times]) if all_times else max(verdict_t, 1.0)
    stall = next((e for e in events if e.get("k") == "stall"), None)
    hang_t = None
    if w.get("outcome") == "hung":
        progress = [e["t"] for r in ranks for e in r.get("events") or [] if e.get("k") not in ("exited", "killed")]
        hang_t = stall["t"] if stall else max(progress, default=None)
    steps = [e["t"] for r in ranks for e in r.get("events") or [] if e.get("k") == "step"]
    emphasis = [(hang_t, verdict_t, 0.15)] if hang_t is not None and hang_t < verdict_t else []
    emphasis += [(min(steps), end, 0.7)] if steps and min(steps) < end else []
    scale = _Scale(all_times, end, emphasis)
    overlay, flags = [], []
    if stall:
        judged = stall["t"] + float(stall.get("window", 0))
        title = f"stall window: no progress from {stall['t']:.3f} s for {stall.get('window', 0):g} s"
        overlay.append(f"<div class='ov stall' style='{scale.style(stall['t'], judged)}' title='{_e(title)}'></div>")
        if verdict_t > judged:
            overlay.append(f"<div class='ov judge' style='{scale.style(judged, verdict_t)}' "
                           f"title='checking that every live rank waits on its peers'></div>")
    if hang_t is not None:
        title = f"hang point: last progress of any rank at {hang_t:.3f} s; nothing moved after it"
        overlay.append(f"<div class='ov vline hang-point' style='{scale.style(hang_t)}' title='{_e(title)}'></div>")
        flags.append(f"<span class='flag hang-flag' style='{scale.style(hang_t)}'>hang point · stall {w.get('stall', 0):g} s</span>")
    overlay.append(f"<div class='ov vline verdict' style='{scale.style(verdict_t)}' "
                   f"title='{_e('verdict: ' + str(w.get('outcome')) + ' at ' + format(verdict_t, '.3f') + ' s')}'></div>")
    flags.append(f"<span class='flag verdict-flag' style='{scale.style(verdict_t)}'>verdict</span>")

    root = w.get("root_rank")
    selected = root if isinstance(root, int) and 0 <= root < len(ranks) else 0
    lanes = [_lane(r, results[i] if results else None, divergence, scale, verdict_t, end, r.get("rank") == root)
             for i, r in enumerate(ranks)]
    details = [_detail(r, divergence, r.get("rank") == root, hidden=i != selected) for i, r in enumerate(ranks)]
    density = "" if len(ranks) <= 8 else " dense" if len(ranks) <= 24 else " compact"
    outcome = _e(w.get("outcome"))
    return f"""<section class='world o-{outcome}' id='world-{index}' data-world='{index}' data-outcome='{outcome}'>
<h2><span class='badge o-{outcome}'>{outcome}</span> #{index + 1} {_e(_name(w))}</h2>
{_facts(w)}
<div class=controls>time axis <button type=button data-axis=compressed class=on>compressed</button><button type=button
 data-axis=linear>linear</button> · zoom <button type=button data-zoom=out>−</button><button type=button
 data-zoom=in>+</button><button type=button data-zoom=reset>1×</button> <span class=muted>click a lane for its stack, error and output</span></div>
<div class='tl{density}' style='--zoom:1'><div class=tl-inner>
<div class='tl-row tl-axis'><div class=tl-label>rank</div><div class=tl-track>{_ticks(scale)}<div class=flags>{''.join(flags)}</div></div><div class=tl-status>state at the verdict</div></div>
<div class=tl-body>{''.join(lanes)}<div class=tl-overlay>{''.join(overlay)}</div></div>
</div></div>
<div class=detail>{''.join(details)}</div>
</section>"""


def _facts(w: dict) -> str:
    rows = [
        ("world", f"{w.get('world_size')} ranks · {w.get('backend', 'gloo')} · seed {w.get('seed')} · "
                  f"{float(w.get('elapsed') or 0):.2f} s · peer_failure {w.get('peer_failure')} · "
                  f"stall {w.get('stall')} s · timeout {w.get('timeout')} s"),
        ("verdict", w.get("reason")),
        ("root cause", w.get("root_cause")),
        ("first divergence", w.get("divergence")),
        ("faults", ", ".join(w.get("faults") or [])),
        ("fired", "; ".join(w.get("fired") or [])),
    ]
    if w.get("outcome") != "completed":
        try:
            from .report import replay_line

            rows.append(("replay", replay_line(WorldResult.from_dict(w))))
        except (KeyError, TypeError, ValueError):
            pass
    items = "".join(f"<dt>{_e(k)}</dt><dd class='f-{k.replace(' ', '-')}'>{_e(v)}</dd>" for k, v in rows if v)
    return f"<dl class=facts>{items}</dl>"


def _ticks(scale: _Scale) -> str:
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


def _item(cls: str, scale: _Scale, t0: float, t1: float | None, title: str, label: str = "") -> str:
    return f"<div class='{cls}' style='{scale.style(t0, t1)}' title='{_e(title)}'>{_e(label)}</div>"


class _RankTimes:
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


def _lane(r: dict, result, divergence, scale: _Scale, verdict_t: float, end: float, is_root: bool) -> str:
    """One rank's row: label, track (life, steps, collectives, markers), state text."""
    rank, state = r.get("rank"), str(r.get("state"))
    times = _RankTimes(r, verdict_t, end)
    parts = _life_and_steps(times, scale, rank)
    parts += _collectives(times, scale, rank, divergence)
    div_index = divergence.index if divergence else None
    if div_index and result is not None and len(result.collectives) < div_index and state not in _DEAD:
        skipped = [e["t"] for e in times.events if e.get("k") == "fault" and str(e.get("how", "")).startswith("skipped")]
        parts.append(_item("mk divergence-absent", scale, skipped[-1] if skipped else times.stop, None,
                           f"rank {rank} never called collective #{div_index} (it was at: {r.get('where') or state})",
                           f"no #{div_index}"))
    parts += _markers(times, scale)
    error = r.get("error")
    mark_at = times.failed["t"] if times.failed else times.death if state == str(RankState.DIED) else None
    if error and mark_at is not None:
        cls = " collateral" if r.get("collateral") else ""
        parts.append(_item("mk failed" + cls, scale, mark_at, None, f"{state}: {error}", "✕"))
        parts.append(f"<div class='err{cls}' style='{scale.style(mark_at)}' title='{_e(error)}'>{_e(_short(error, 160))}</div>")

    status = r.get("where") or ""
    if error:
        status = ("(collateral) " if r.get("collateral") else "") + _short(error, 300)
    root = " root" if is_root else ""
    return (f"<div class='tl-row lane st-{_e(state)}{root}' data-rank='{_e(rank)}' data-state='{_e(state)}' tabindex=0>"
            f"<div class=tl-label title='rank {_e(rank)}: {_e(state)}{' · root cause' if is_root else ''}'>"
            f"<i class='dot st-{_e(state)}'></i>rank {_e(rank)}{'<b class=star>★</b>' if is_root else ''}</div>"
            f"<div class=tl-track>{''.join(parts)}</div>"
            f"<div class=tl-status title='{_e(status)}'><b class='st st-{_e(state)}'>{_e(state)}</b> {_e(status)}</div></div>")


def _life_and_steps(times: _RankTimes, scale: _Scale, rank) -> list[str]:
    """The process's life line, what it did after its function ended, and one band per step."""
    parts = []
    if times.start:
        parts.append(_item("it life", scale, times.start["t"], times.life_end,
                           f"rank {rank} process alive {times.start['t']:.3f}–{times.life_end:.3f} s"))
    if times.finished:
        parts.append(_item("it after done", scale, times.finished["t"], times.life_end, "finished; waiting for the verdict"))
    elif times.failed and (times.death is None or times.death > times.failed["t"]):
        parts.append(_item("it after failed", scale, times.failed["t"], times.life_end, "raised; waiting to exit or lingering"))
    steps = [e for e in times.events if e.get("k") == "step"]
    for e, nxt in zip(steps, steps[1:] + [None]):
        t1 = nxt["t"] if nxt else max(times.stop, e["t"])
        parts.append(_item(f"it step s{int(e.get('step') or 0) % 2}", scale, e["t"], t1,
                           f"step {e.get('step')}: {e['t']:.3f}–{t1:.3f} s ({_dur(t1 - e['t'])})", f"step {e.get('step')}"))
    return parts


def _collectives(times: _RankTimes, scale: _Scale, rank, divergence) -> list[str]:
    """One block per collective, entered → left; never left: to the rank's death, else to the verdict."""
    calls, order = {}, 0
    for e in times.events:
        if e.get("k") == "enter":
            init = e.get("op") == "init_process_group"
            order += 0 if init else 1  # the n-th traced collective is RankResult.collectives[n - 1]
            calls[e.get("seq")] = {"enter": e, "t1": None, "index": None if init else order}
        elif e.get("k") == "exit" and e.get("seq") in calls:
            calls[e["seq"]]["t1"] = e["t"]
    parts = []
    for call in calls.values():
        e, idx, t1 = call["enter"], call["index"], call["t1"]
        cls = "it coll" + (" init" if idx is None else "") + (" ddp" if e.get("note") else "")
        what = _call_text({**e, "done": True})
        if t1 is None:
            t1 = times.death if times.death is not None else times.verdict_t
            cls += " open"
            inside = "died inside it" if times.death is not None else "still inside at the verdict"
            how = f"entered {e['t']:.3f} s, never left ({inside})"
        else:
            how = f"entered {e['t']:.3f} s, left {t1:.3f} s ({_dur(t1 - e['t'])})"
        if divergence is not None and idx == divergence.index:
            cls += " divergence" + (" odd" if rank in divergence.odd_ranks else "")
            how += " — FIRST DIVERGENT COLLECTIVE"
        label = "init" if idx is None else f"#{idx} {e.get('op')}"
        parts.append(_item(cls, scale, e["t"], t1, f"#{idx or 0} {what}: {how}", label))
    return parts


def _markers(times: _RankTimes, scale: _Scale) -> list[str]:
    """Faults fired, log lines, the process's exit and the launcher's kill."""
    parts = []
    for e in times.events:
        kind, t = e.get("k"), e.get("t", 0)
        if kind == "fault":
            parts.append(_item("mk fault", scale, t, None, f"fault fired: {e.get('fault')} ({e.get('how')})"))
        elif kind == "log":
            parts.append(_item("mk log", scale, t, None, f"log: {e.get('msg')}"))
        elif kind == "killed":
            parts.append(_item("mk killed", scale, t, None, f"killed by the launcher at {t:.3f} s"))
        elif kind == "exited":
            code = e.get("code")
            parts.append(_item("mk exited" + (" signal" if (code or 0) < 0 else ""), scale, t, None,
                               f"process exited (code {code}) at {t:.3f} s"))
    return parts


def _detail(r: dict, divergence, is_root: bool, hidden: bool) -> str:
    """The panel shown when a rank's lane is clicked: facts, faults, collectives, stack, traceback, output."""
    rank = r.get("rank")
    facts = [("outcome", f"{r.get('outcome')} ({r.get('state')})"), ("pid", r.get("pid")),
             ("exit code", r.get("exitcode")), ("last step", r.get("last_step")), ("where", r.get("where")),
             ("error", (("(collateral) " if r.get("collateral") else "") + r["error"]) if r.get("error") else None),
             ("raised at", r.get("site")),
             ("failed at", f"{r['failed_at']:.3f} s" if r.get("failed_at") is not None else None),
             ("faults fired", "; ".join(r.get("fired") or []))]
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v not in (None, ""))
    calls = r.get("collectives") or []
    div = divergence.index if divergence else None
    lo = max(0, div - 4) if div else max(0, len(calls) - 12)
    shown = calls[lo: lo + 12]
    items = "".join(
        f"<li value={lo + i + 1}{' class=divergent-call' if lo + i + 1 == div else ''}>{_e(_call_text(c))}</li>"
        for i, c in enumerate(shown))
    note = f" (#{lo + 1}–#{lo + len(shown)} of {len(calls)})" if len(shown) < len(calls) else ""
    sections = [f"<h4>collectives{note}</h4><ol class=calls>{items}</ol>" if calls else "<h4>no collectives</h4>"]
    for title, text in (("stack", r.get("stack")), ("traceback", r.get("traceback"))):
        if text:
            sections.append(f"<h4>{title}</h4><pre>{_e(text.rstrip())}</pre>")
    output = (r.get("output") or "").rstrip()
    lines = output.count("\n") + 1 if output else 0
    sections.append(f"<h4>output (last {lines} lines)</h4><pre class=output>{_e(output)}</pre>" if output
                    else "<h4>no output</h4>")
    return (f"<div class=rank-detail data-detail-rank='{_e(rank)}'{' hidden' if hidden else ''}>"
            f"<h3>rank {_e(rank)} <span class='st st-{_e(r.get('state'))}'>{_e(r.get('state'))}</span>"
            f"{' <span class=rootnote>★ root cause</span>' if is_root else ''}</h3>"
            f"<dl class=facts>{rows}</dl>{''.join(sections)}</div>")


def _call_text(c: dict) -> str:
    shapes = ", ".join(str(s) for s in c.get("shapes") or [])
    note = f" [{c['note']}]" if c.get("note") else ""
    step = f" (step {c['step']})" if c.get("step") is not None else ""
    return f"{c.get('op')}({shapes}){note} at {c.get('site')}{step}{'' if c.get('done') else ' — not left'}"


_LEGEND = """<div class=legend><b>legend</b>
<span><i class='sw step s0'></i>step</span><span><i class='sw coll'></i>collective</span>
<span><i class='sw coll ddp'></i>DDP gradient bucket</span><span><i class='sw coll open'></i>entered, never left</span>
<span><i class='sw coll divergence'></i>first divergent collective</span><span><i class='sw mkfault'></i>fault fired</span>
<span><b class=x>✕</b>error / death</span><span><i class='sw killed'></i>killed</span><span><i class='sw stall'></i>stall window</span>
<span><i class='sw hang'></i>hang point</span><span><i class='sw verdictsw'></i>verdict</span><span>★ root cause</span></div>"""

_CSS = """
:root{--ok:#1a7f37;--hung:#bc4c00;--crash:#cf222e;--ink:#1f2328;--mut:#656d76;--line:#d0d7de;--coll:#3b6fd4;--ddp:#8250df;--div:#e000a0;
--label:96px;--status:300px;--lane:22px}
*{box-sizing:border-box}
body{margin:0;padding:14px 18px;font:13px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:var(--ink);background:#fff}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:0 0 6px}h3{font-size:14px;margin:4px 0}h4{font-size:12px;margin:10px 0 3px;color:var(--mut)}
.muted{color:var(--mut)}pre{margin:0;padding:6px 8px;background:#f6f8fa;border:1px solid var(--line);border-radius:4px;font:11px/1.35 'DejaVu Sans Mono',monospace;white-space:pre-wrap;word-break:break-all;max-height:320px;overflow:auto}
.badge{display:inline-block;padding:0 7px;border-radius:10px;color:#fff;font-weight:600;font-size:12px}
.badge.o-completed{background:var(--ok)}.badge.o-hung{background:var(--hung)}.badge.o-crashed{background:var(--crash)}
#summary{border-collapse:collapse;width:100%;margin:10px 0 8px}
#summary th,#summary td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
#summary th{background:#f6f8fa;font-weight:600}#summary td.num{text-align:right;font-variant-numeric:tabular-nums}
#summary td.cause{max-width:640px}#summary td.name{max-width:340px;word-break:break-all}#summary a{color:inherit}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;margin:6px 0 10px;color:var(--mut);font-size:12px}
.legend span{display:inline-flex;align-items:center;gap:4px}.legend .x{color:var(--crash)}
.sw{display:inline-block;width:18px;height:11px;border-radius:2px;position:relative}
.sw.stall{background:repeating-linear-gradient(135deg,#f5c40055 0 4px,#f5c40022 4px 8px);border:1px solid #d4a600}
.sw.hang{width:3px;background:var(--crash)}.sw.verdictsw{width:3px;background:var(--ink)}.sw.killed{width:3px;background:#000}
.sw.mkfault{width:9px;height:9px;background:#f08c00;transform:rotate(45deg)}
.world{border-top:3px solid var(--line);padding:10px 0 16px;margin-top:8px}
.world.o-hung{border-top-color:var(--hung)}.world.o-crashed{border-top-color:var(--crash)}.world.o-completed{border-top-color:var(--ok)}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:1px 10px;margin:0 0 6px}
dl.facts dt{color:var(--mut)}dl.facts dd{margin:0;word-break:break-word}dd.f-root-cause{font-weight:600}
.controls{margin:4px 0;color:var(--mut);font-size:12px}
.controls button{font:inherit;padding:0 7px;margin-left:2px;border:1px solid var(--line);background:#f6f8fa;border-radius:3px;cursor:pointer}
.controls button.on{background:var(--ink);color:#fff;border-color:var(--ink)}
.tl{position:relative;overflow:auto;max-height:72vh;border:1px solid var(--line);border-radius:4px}
.tl.dense{--lane:16px}.tl.compact{--lane:12px}
.tl-inner{position:relative;width:calc(var(--zoom)*100%);min-width:100%}
.tl-row{display:flex;height:var(--lane)}
.tl-label,.tl-status{position:sticky;z-index:4;background:#fff;flex:0 0 auto;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.tl-label{left:0;width:var(--label);padding:0 6px;border-right:1px solid var(--line)}
.tl-status{right:0;width:var(--status);padding:0 6px;border-left:1px solid var(--line);color:var(--mut)}
.tl-track{position:relative;z-index:0;flex:1 1 auto;overflow:hidden}
.lane{cursor:pointer;font-size:11px;line-height:var(--lane);border-bottom:1px solid #eef0f2}
.tl.compact .lane{font-size:9.5px}.lane:hover .tl-label,.lane:hover .tl-status{background:#f3f6fb}
.lane.selected .tl-label,.lane.selected .tl-status{background:#dde9ff}
.lane.root .tl-label{font-weight:700}.star{color:var(--div);margin-left:3px}
.tl-axis{position:sticky;top:0;z-index:6;height:34px;background:#fff;border-bottom:1px solid var(--line);font-size:11px}
.tl-axis .tl-label,.tl-axis .tl-status{line-height:34px;color:var(--mut);z-index:7}
.tick{position:absolute;top:1px;left:var(--x);padding-left:3px;border-left:1px solid #afb8c1;color:var(--mut);white-space:nowrap;height:15px;line-height:15px}
.tick.l{display:none}.tl.linear .tick.l{display:block}.tl.linear .tick.c{display:none}
.flags{position:absolute;left:0;right:0;top:17px;height:16px}
.flag{position:absolute;left:var(--cl);padding:0 4px;border-left:2px solid;font-size:10.5px;line-height:15px;white-space:nowrap;background:#fff}
.tl.linear .flag{left:var(--ll)}
.hang-flag{border-color:var(--crash);color:var(--crash);font-weight:700}.verdict-flag{border-color:var(--ink);transform:translateX(-100%);border-left:0;border-right:2px solid}
.tl-body{position:relative}
.tl-overlay{position:absolute;top:0;bottom:0;left:var(--label);right:var(--status);pointer-events:none;z-index:3}
.it,.ov{position:absolute;left:var(--cl);width:max(var(--cw),2px)}
.tl.linear .it,.tl.linear .ov{left:var(--ll);width:max(var(--lw),2px)}
.ov{top:0;bottom:0}.ov.vline{width:0}.tl.linear .ov.vline{width:0}
.ov.stall{background:repeating-linear-gradient(135deg,#f5c40030 0 6px,#f5c40014 6px 12px);border-left:1px solid #d4a600;border-right:1px dashed #d4a600}
.ov.judge{background:#f5c40012}
.ov.hang-point{border-left:2px dashed var(--crash)}.ov.verdict{border-left:2px solid var(--ink)}
.it{top:0;bottom:0;overflow:hidden;white-space:nowrap;text-overflow:clip}
.it.life{top:calc(50% - 1px);bottom:auto;height:2px;background:#c5ccd4}
.it.after{top:30%;bottom:30%}.it.after.done{background:repeating-linear-gradient(135deg,#1a7f3733 0 3px,transparent 3px 6px)}
.it.after.failed{background:repeating-linear-gradient(135deg,#cf222e33 0 3px,transparent 3px 6px)}
.it.step{background:#e7ecf3;border-left:1px solid #9aa6b2;color:#57606a;padding-left:3px;font-size:10px;z-index:1}
.it.step.s1{background:#dfe5ee}
.it.coll{top:3px;bottom:3px;background:var(--coll);color:#fff;border-radius:2px;padding-left:2px;font-size:10px;line-height:calc(var(--lane) - 7px);z-index:2;opacity:.9}
.tl.compact .it.coll{top:2px;bottom:2px;font-size:8.5px;line-height:calc(var(--lane) - 5px)}
.it.coll.init{background:#8c959f}.it.coll.ddp{background:var(--ddp)}
.it.coll.open{background:repeating-linear-gradient(135deg,#cf222e 0 5px,#ff8182 5px 10px);color:#fff;font-weight:600}
.it.coll.divergence{outline:2px solid var(--div);outline-offset:1px;box-shadow:0 0 0 4px #e000a040;z-index:3;opacity:1}
.sw.coll{background:var(--coll)}.sw.coll.ddp{background:var(--ddp)}.sw.coll.open{background:repeating-linear-gradient(135deg,#cf222e 0 4px,#ff8182 4px 8px)}
.sw.coll.divergence{outline:2px solid var(--div);outline-offset:1px}.sw.step{background:#e7ecf3;border-left:1px solid #9aa6b2}
.mk{position:absolute;left:var(--cl);z-index:5;transform:translateX(-50%)}.tl.linear .mk,.tl.linear .err{left:var(--ll)}
.mk.fault{top:calc(50% - 5px);width:10px;height:10px;background:#f08c00;border:1px solid #fff;transform:translateX(-50%) rotate(45deg)}
.mk.log{top:calc(50% - 3px);width:6px;height:6px;border-radius:50%;background:#57606a}
.mk.killed{top:0;bottom:0;width:3px;background:#000}
.mk.exited{top:calc(50% - 4px);width:8px;height:8px;background:#6e7781}.mk.exited.signal{background:var(--crash)}
.mk.failed{top:0;bottom:0;color:var(--crash);font-weight:900;font-size:15px;line-height:var(--lane)}
.tl.compact .mk.failed{font-size:11px}.mk.failed.collateral{color:#9a6700;font-size:12px}
.mk.divergence-absent{top:1px;bottom:1px;transform:none;margin-left:7px;padding:0 3px;border:2px dashed var(--div);border-radius:3px;color:var(--div);font-weight:700;font-size:10px;line-height:calc(var(--lane) - 6px);white-space:nowrap;background:#fffd}
.err{position:absolute;left:var(--cl);margin-left:9px;z-index:5;color:var(--crash);font-weight:600;white-space:nowrap;background:#ffffffd8;padding:0 3px}
.err.collateral{color:#9a6700;font-weight:400}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;margin-right:5px;background:#8c959f}
.st{font-weight:600}.dot.st-finished{background:var(--ok)}.dot.st-blocked,.dot.st-running{background:var(--hung)}.dot.st-raised,.dot.st-died{background:var(--crash)}
b.st-finished,span.st-finished{color:var(--ok)}b.st-blocked,b.st-running,span.st-blocked,span.st-running{color:var(--hung)}b.st-raised,b.st-died,span.st-raised,span.st-died{color:var(--crash)}
.detail{margin-top:8px;border:1px solid var(--line);border-radius:4px;padding:6px 10px;background:#fcfcfd}
.rootnote{color:var(--div);font-size:12px}ol.calls{margin:0;padding-left:34px;font:11px/1.4 'DejaVu Sans Mono',monospace}
li.divergent-call{color:var(--div);font-weight:700}
"""

_JS = """
(function(){
  function world(el){return el.closest('section.world');}
  function select(lane){
    var w=world(lane), r=lane.getAttribute('data-rank');
    w.querySelectorAll('.lane.selected').forEach(function(l){l.classList.remove('selected');});
    lane.classList.add('selected');
    w.querySelectorAll('.rank-detail').forEach(function(d){d.hidden=d.getAttribute('data-detail-rank')!==r;});
    var panel=w.querySelector('.detail'); if(panel.scrollIntoView){panel.scrollIntoView({block:'nearest'});}
  }
  document.addEventListener('click',function(ev){
    var lane=ev.target.closest('.lane'); if(lane){select(lane);return;}
    var b=ev.target.closest('button'); if(!b){return;}
    var w=world(b), tl=w.querySelector('.tl');
    if(b.hasAttribute('data-axis')){
      tl.classList.toggle('linear',b.getAttribute('data-axis')==='linear');
      w.querySelectorAll('[data-axis]').forEach(function(x){x.classList.toggle('on',x===b);});
    } else if(b.hasAttribute('data-zoom')){
      var z=parseFloat(tl.style.getPropertyValue('--zoom'))||1, how=b.getAttribute('data-zoom');
      z=how==='in'?Math.min(z*2,64):how==='out'?Math.max(z/2,1):1;
      var centre=(tl.scrollLeft+tl.clientWidth/2)/tl.scrollWidth;
      tl.style.setProperty('--zoom',z); b.parentNode.querySelector('[data-zoom=reset]').textContent=z+'\\u00d7';
      tl.scrollLeft=centre*tl.scrollWidth-tl.clientWidth/2;
    }
  });
  document.addEventListener('keydown',function(ev){
    if(ev.key==='Enter'&&ev.target.classList&&ev.target.classList.contains('lane')){select(ev.target);}
  });
  document.querySelectorAll('section.world').forEach(function(w){
    var d=w.querySelector('.rank-detail:not([hidden])');
    if(d){var l=w.querySelector('.lane[data-rank="'+d.getAttribute('data-detail-rank')+'"]'); if(l){l.classList.add('selected');}}
  });
  document.documentElement.setAttribute('data-ready','1');
})();
"""

__all__ = ["render_html", "write_html"]
