"""One self-contained HTML page for a report document: a summary table, then a swimlane timeline per world.

A world is drawn as one lane per rank on a shared time axis: steps are bands, collectives are
blocks from entered to left (an unfinished one runs on to the rank's death, else to the verdict),
faults, failures, exits and the kill are markers, and a dead rank's error is written after its
failure. Over all lanes, the stall window is shaded and the verdict and the hang point are vertical
lines. The first divergent collective (:func:`ddpfaults.judge.verdict.first_divergence`) is outlined on
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

import os

from ddpfaults.errors import ReportFileError
from ddpfaults.judge.results import Divergence, FiredFault, WorldResult
from ddpfaults.report.document import build_document, check_document
from ddpfaults.report.html_assets import _CSS, _JS, _LEGEND
from ddpfaults.report.lanes import Scale, call_text, esc, lane, short, ticks


def render_html(document: dict) -> str:
    """The whole page for a report document (see :mod:`ddpfaults.report.document`), as one HTML string."""
    check_document(document)
    worlds = list(enumerate(document["worlds"]))
    worlds.sort(key=lambda item: (item[1].get("outcome") == "completed", item[0]))  # failures first
    counts = {o: sum(w.get("outcome") == o for _, w in worlds) for o in ("crashed", "hung", "completed")}
    tally = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no worlds"
    body = [
        f"<header class=page><h1>ddpfaults report</h1><p>{len(worlds)} world{'s' * (len(worlds) != 1)}: "
        f"{esc(tally)} <span class=muted>· schema {esc(document['schema'])}</span></p></header>",
        _summary(worlds),
        _LEGEND,
        *(_world(i, w) for i, w in worlds),
    ]
    return (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>ddpfaults report: {esc(tally)}"
        f"</title><meta name=viewport content='width=device-width,initial-scale=1'>\n<style>{_CSS}</style>"
        f"</head>\n<body>\n" + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n"
    )


def write_html(path, worlds, nodeids=None) -> str:
    """Write the page for ``worlds`` (WorldResults, their dicts, or a whole document) to ``path``; return it."""
    document = worlds if isinstance(worlds, dict) and "schema" in worlds else build_document(worlds, nodeids)
    path = os.fspath(path)
    page = render_html(document)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as exc:
        raise ReportFileError(f"page {path!r} cannot be written: {exc}") from None
    return path


# -- small helpers ---------------------------------------------------------------------------------
def _name(world: dict) -> str:
    return world.get("nodeid") or world.get("function") or "world"


def _summary(worlds) -> str:
    rows = []
    for i, w in worlds:
        outcome = esc(w.get("outcome"))
        rows.append(
            f"<tr class='o-{outcome}'><td><a href='#world-{i}'>#{i + 1}</a></td>"
            f"<td class=name><a href='#world-{i}'>{esc(_name(w))}</a></td>"
            f"<td><span class='badge o-{outcome}'>{outcome}</span></td><td class=num>{esc(w.get('world_size'))}</td>"
            f"<td class=cause title='{esc(w.get('root_cause'))}'>{esc(short(w.get('root_cause'), 400))}</td>"
            f"<td class=num>{float(w.get('elapsed') or 0):.2f}</td><td class=num>{esc(w.get('seed'))}</td></tr>"
        )
    return (
        "<table id=summary><thead><tr><th>#</th><th>test / function</th><th>verdict</th><th>ranks</th>"
        "<th>root cause</th><th>seconds</th><th>seed</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


# -- one world -----------------------------------------------------------------------------------
def _world(index: int, w: dict) -> str:
    ranks = w["ranks"]
    try:
        world = WorldResult.from_dict(w)
        results, divergence = world.ranks, world.divergence
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
    scale = Scale(all_times, end, emphasis)
    overlay, flags = [], []
    if stall:
        judged = stall["t"] + float(stall.get("window", 0))
        title = f"stall window: no progress from {stall['t']:.3f} s for {stall.get('window', 0):g} s"
        overlay.append(f"<div class='ov stall' style='{scale.style(stall['t'], judged)}' title='{esc(title)}'></div>")
        if verdict_t > judged:
            overlay.append(
                f"<div class='ov judge' style='{scale.style(judged, verdict_t)}' "
                f"title='checking that every live rank waits on its peers'></div>"
            )
    if hang_t is not None:
        title = f"hang point: last progress of any rank at {hang_t:.3f} s; nothing moved after it"
        overlay.append(f"<div class='ov vline hang-point' style='{scale.style(hang_t)}' title='{esc(title)}'></div>")
        flags.append(
            f"<span class='flag hang-flag' style='{scale.style(hang_t)}'>"
            f"hang point · stall {w.get('stall', 0):g} s</span>"
        )
    overlay.append(
        f"<div class='ov vline verdict' style='{scale.style(verdict_t)}' "
        f"title='{esc('verdict: ' + str(w.get('outcome')) + ' at ' + format(verdict_t, '.3f') + ' s')}'></div>"
    )
    flags.append(f"<span class='flag verdict-flag' style='{scale.style(verdict_t)}'>verdict</span>")

    root = w.get("root_rank")
    selected = root if isinstance(root, int) and 0 <= root < len(ranks) else 0
    lanes = [
        lane(r, results[i] if results else None, divergence, scale, verdict_t, end, r.get("rank") == root)
        for i, r in enumerate(ranks)
    ]
    details = [_detail(r, divergence, r.get("rank") == root, hidden=i != selected) for i, r in enumerate(ranks)]
    density = "" if len(ranks) <= 8 else " dense" if len(ranks) <= 24 else " compact"
    outcome = esc(w.get("outcome"))
    return f"""<section class='world o-{outcome}' id='world-{index}' data-world='{index}' data-outcome='{outcome}'>
<h2><span class='badge o-{outcome}'>{outcome}</span> #{index + 1} {esc(_name(w))}</h2>
{_facts(w)}
<div class=controls>time axis <button type=button data-axis=compressed class=on>compressed</button><button type=button
 data-axis=linear>linear</button> · zoom <button type=button data-zoom=out>−</button><button type=button
 data-zoom=in>+</button><button type=button data-zoom=reset>1×</button>
<span class=muted>click a lane for its stack, error and output</span></div>
<div class='tl{density}' style='--zoom:1'><div class=tl-inner>
<div class='tl-row tl-axis'><div class=tl-label>rank</div>
<div class=tl-track>{ticks(scale)}<div class=flags>{"".join(flags)}</div></div>
<div class=tl-status>state at the verdict</div></div>
<div class=tl-body>{"".join(lanes)}<div class=tl-overlay>{"".join(overlay)}</div></div>
</div></div>
<div class=detail>{"".join(details)}</div>
</section>"""


def _facts(w: dict) -> str:
    rows = [
        (
            "world",
            f"{w.get('world_size')} ranks · {w.get('backend', 'gloo')} · seed {w.get('seed')} · "
            f"{float(w.get('elapsed') or 0):.2f} s · peer_failure {w.get('peer_failure')} · "
            f"stall {w.get('stall')} s · timeout {w.get('timeout')} s",
        ),
        ("verdict", w.get("reason")),
        ("root cause", w.get("root_cause")),
        ("first divergence", Divergence.from_dict(w["divergence"]).describe() if w.get("divergence") else None),
        ("faults", ", ".join(w.get("faults") or [])),
        ("fired", _fired(w)),
        ("flight recorder", w.get("flight_records")),
    ]
    if w.get("outcome") != "completed":
        try:
            from ddpfaults.judge.results import replay_line

            rows.append(("replay", replay_line(WorldResult.from_dict(w))))
        except (KeyError, TypeError, ValueError):
            pass
    items = "".join(f"<dt>{esc(k)}</dt><dd class='f-{k.replace(' ', '-')}'>{esc(v)}</dd>" for k, v in rows if v)
    return f"<dl class=facts>{items}</dl>"


def _fired(w: dict) -> str:
    """The faults fired in a world or on a rank, one clause each."""
    return "; ".join(FiredFault(**f).describe() for f in w.get("fired") or [])


def _detail(r: dict, divergence, is_root: bool, hidden: bool) -> str:
    """The panel shown when a rank's lane is clicked: facts, faults, collectives, stack, traceback, output."""
    rank = r.get("rank")
    facts = [
        ("outcome", f"{r.get('outcome')} ({r.get('state')})"),
        ("pid", r.get("pid")),
        ("exit code", r.get("exitcode")),
        ("last step", r.get("last_step")),
        ("where", r.get("where")),
        ("error", (("(collateral) " if r.get("collateral") else "") + r["error"]) if r.get("error") else None),
        ("raised at", r.get("site")),
        ("failed at", f"{r['failed_at']:.3f} s" if r.get("failed_at") is not None else None),
        ("faults fired", _fired(r)),
    ]
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts if v not in (None, ""))
    calls = r.get("collectives") or []
    div = divergence.index if divergence else None
    lo = max(0, div - 4) if div else max(0, len(calls) - 12)
    shown = calls[lo : lo + 12]
    items = "".join(
        f"<li value={lo + i + 1}{' class=divergent-call' if lo + i + 1 == div else ''}>{esc(call_text(c))}</li>"
        for i, c in enumerate(shown)
    )
    note = f" (#{lo + 1}–#{lo + len(shown)} of {len(calls)})" if len(shown) < len(calls) else ""
    sections = [f"<h4>collectives{note}</h4><ol class=calls>{items}</ol>" if calls else "<h4>no collectives</h4>"]
    for title, text in (("stack", r.get("stack")), ("traceback", r.get("traceback"))):
        if text:
            sections.append(f"<h4>{title}</h4><pre>{esc(text.rstrip())}</pre>")
    output = (r.get("output") or "").rstrip()
    lines = output.count("\n") + 1 if output else 0
    sections.append(
        f"<h4>output (last {lines} lines)</h4><pre class=output>{esc(output)}</pre>" if output else "<h4>no output</h4>"
    )
    return (
        f"<div class=rank-detail data-detail-rank='{esc(rank)}'{' hidden' if hidden else ''}>"
        f"<h3>rank {esc(rank)} <span class='st st-{esc(r.get('state'))}'>{esc(r.get('state'))}</span>"
        f"{' <span class=rootnote>★ root cause</span>' if is_root else ''}</h3>"
        f"<dl class=facts>{rows}</dl>{''.join(sections)}</div>"
    )


__all__ = ["render_html", "write_html"]
