"""One self-contained HTML page for a report document: what failed, then a swimlane timeline per world.

The page opens with the tally ("3 of 40 failed · 35 passed · 2 without an expectation": worlds whose expectation did
not hold, out of every world listed; a world expected to crash that crashed passed) and a summary table, failed
worlds first, with each world's expectation, its observed verdict and root cause, and what differed.

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

Stable hooks for tests: ``id="tally"`` (``data-failed``, ``data-checked``, ``data-worlds``), ``id="summary"``
(rows ``tr[data-status][data-world]``), ``section.world[data-world][data-status]`` (status ``failed``,
``passed``, ``unchecked``), ``.lane[data-rank]``, ``.divergence``, ``.hang-point``, ``.rank-detail[data-detail-rank]``;
a collective block seen only by the flight recorder has class ``fr``.
"""

from __future__ import annotations

import os
import re

from ddpfaults.errors import ReportFileError
from ddpfaults.judge.checks.recovery import describe_preemption
from ddpfaults.judge.checks.resume import describe as describe_resume
from ddpfaults.judge.results import Divergence, FiredFault, WorldResult
from ddpfaults.report.document import (
    build_document,
    check_document,
    function_returned,
    timeline_calls,
    world_status,
)
from ddpfaults.report.html_assets import _CSS, _JS, _LEGEND
from ddpfaults.report.lanes import Scale, call_text, esc, lane, short, ticks
from ddpfaults.report.text import describe_attempt


def render_html(document: dict) -> str:
    """The whole page for a report document (see :mod:`ddpfaults.report.document`), as one HTML string."""
    check_document(document)
    worlds = list(enumerate(document["worlds"]))
    worlds.sort(key=lambda item: (world_status(item[1]) != "failed", item[0]))  # failures first
    tally = _tally([w for _, w in worlds])
    verdicts = {o: sum(w.get("outcome") == o for _, w in worlds) for o in ("crashed", "hung", "timed out", "completed")}
    verdict_text = ", ".join(f"{n} {o}" for o, n in verdicts.items() if n) or "no worlds"
    body = [
        f"<header class=page><h1>ddpfaults report</h1><p id=tally data-failed={tally['failed']} "
        f"data-checked={tally['checked']} data-worlds={len(worlds)}><b class=tally-head>{esc(tally['head'])}</b>"
        f"{esc(tally['rest'])} <span class=muted>· verdicts: {esc(verdict_text)} · schema "
        f"{esc(document['schema'])}</span></p></header>",
        _summary(worlds),
        _LEGEND,
        *(_world(i, w) for i, w in worlds),
    ]
    return (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>ddpfaults report: {esc(tally['head'])}"
        f"</title><meta name=viewport content='width=device-width,initial-scale=1'>\n<style>{_CSS}</style>"
        f"</head>\n<body>\n" + "\n".join(body) + f"\n<script>{_JS}</script>\n</body></html>\n"
    )


def _tally(worlds: list[dict]) -> dict:
    """How many worlds failed (their expectation did not hold, or their test failed) out of every world the page
    lists: ``head`` ("3 of 40 failed"), ``rest`` (passes, worlds without an expectation: the three add up to the
    rows), ``failed``, ``checked`` (the worlds with an expectation or a test outcome)."""
    statuses = [world_status(w) for w in worlds]
    failed, passed, unchecked = (statuses.count(s) for s in ("failed", "passed", "unchecked"))
    checked = failed + passed
    head = f"{failed} of {len(worlds)} failed" if checked else f"{len(worlds)} world{'s' * (len(worlds) != 1)}"
    rest = [f"{passed} passed"] if checked else []
    if unchecked:
        rest.append(f"{unchecked} without an expectation" if checked else "no expectations to check")
    return {"head": head, "rest": "".join(f" · {r}" for r in rest), "failed": failed, "checked": checked}


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


_STATUS_TEXT = {"failed": "FAILED", "passed": "passed", "unchecked": "no expectation"}


def _status_badge(w: dict) -> str:
    status = world_status(w)
    return f"<span class='badge s-{status}'>{_STATUS_TEXT[status]}</span>"


def _expected(w: dict) -> str:
    expectation = w.get("expectation")
    return expectation.get("text") or expectation.get("expect", {}).get("outcome", "") if expectation else ""


def _mismatches(w: dict) -> list[dict]:
    return list((w.get("expectation") or {}).get("mismatches") or [])


def _outcome_class(w: dict) -> str:
    """The CSS class of a world's outcome (``o-hung``, ``o-timed-out``)."""
    return "o-" + re.sub(r"[^\w-]+", "-", str(w.get("outcome")))


def _summary(worlds) -> str:
    rows = []
    for i, w in worlds:
        outcome, status, o_class = esc(w.get("outcome")), world_status(w), _outcome_class(w)
        differed = "".join(f"<li>{esc(short(m.get('text'), 300))}</li>" for m in _mismatches(w))
        rows.append(
            f"<tr class='s-{status} {o_class}' data-status={status} data-world={i}>"
            f"<td><a href='#world-{i}'>#{i + 1}</a></td>"
            f"<td class=name><a href='#world-{i}'>{esc(_name(w))}</a></td><td>{_status_badge(w)}</td>"
            f"<td class=expected>{esc(_expected(w)) or '<span class=muted>—</span>'}</td>"
            f"<td class=observed><span class='badge {o_class}'>{outcome}</span> "
            f"<span class=cause title='{esc(w.get('root_cause'))}'>{esc(short(w.get('root_cause'), 300))}</span></td>"
            f"<td class=differed>{f'<ul>{differed}</ul>' if differed else ''}</td>"
            f"<td class=num>{esc(w.get('world_size'))}</td><td class=num>{float(w.get('elapsed') or 0):.2f}</td></tr>"
        )
    return (
        "<table id=summary><thead><tr><th>#</th><th>test / function</th><th>result</th><th>expected</th>"
        "<th>observed</th><th>what differed</th><th>ranks</th><th>seconds</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
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
    calls = [timeline_calls(r) for r in ranks]
    all_times += [c.t0 for rank_calls in calls for c in rank_calls if c.source != "tracing"]  # the recorder's calls
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
        lane(r, results[i] if results else None, divergence, scale, verdict_t, end, r.get("rank") == root, calls[i])
        for i, r in enumerate(ranks)
    ]
    details = [_detail(r, divergence, r.get("rank") == root, hidden=i != selected) for i, r in enumerate(ranks)]
    density = "" if len(ranks) <= 8 else " dense" if len(ranks) <= 24 else " compact"
    outcome, status, o_class = esc(w.get("outcome")), world_status(w), _outcome_class(w)
    return f"""<section class='world {o_class} s-{status}' id='world-{index}' data-world='{index}'
 data-outcome='{outcome}' data-status='{status}'>
<h2>{_status_badge(w)} <span class='badge {o_class}'>{outcome}</span> #{index + 1} {esc(_name(w))}</h2>
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
    expectation = w.get("expectation")
    rows = [
        ("expected", (_expected(w) + ("" if expectation["held"] else " — did not hold")) if expectation else None),
        ("observed", f"{w.get('outcome')}: {w.get('root_cause')}" if expectation else None),
        *((f"differed: {m.get('kind')}", m.get("text")) for m in _mismatches(w)),
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
        ("preemption", describe_preemption(w["preemption"]) if w.get("preemption") else None),
        ("resume", describe_resume(w["resume"]) if w.get("resume") else None),
        *((f"attempt {a.get('attempt')}", _attempt(a)) for a in w.get("attempts") or []),
    ]
    if w.get("outcome") != "completed" or (w.get("resume") or {}).get("equivalent") is False:
        try:
            from ddpfaults.replay import world_command

            rows.append(("replay", world_command(WorldResult.from_dict(w))))
        except (KeyError, TypeError, ValueError):
            pass
    items = "".join(f"<dt>{esc(k)}</dt><dd class='f-{_slug(k)}'>{esc(v)}</dd>" for k, v in rows if v)
    return f"<dl class=facts>{items}</dl>"


def _attempt(a: dict) -> str:
    """One attempt of a restarted world, with the faults that fired in it."""
    try:
        text = describe_attempt(a).split(": ", 1)[1]
        preempted = [describe_preemption(a["preemption"])] if a.get("preemption") else []
    except (KeyError, TypeError, ValueError, IndexError):  # a hand-edited document
        return str(a)
    return "; ".join([text, *(a.get("fired") or []), *preempted])


def _slug(key: str) -> str:
    return key.split(":", 1)[0].replace(" ", "-")


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
    returned = function_returned(r)
    items = "".join(
        f"<li value={lo + i + 1}{' class=divergent-call' if lo + i + 1 == div else ''}>"
        f"{esc(call_text({**c, 'done': c.get('done') or returned}))}</li>"
        for i, c in enumerate(shown)
    )
    note = f" (#{lo + 1}–#{lo + len(shown)} of {len(calls)})" if len(shown) < len(calls) else ""
    source = f" · from the {esc(r['recorder'])}" if r.get("recorder") else ""
    sections = [
        f"<h4>collectives{note}{source}</h4><ol class=calls>{items}</ol>" if calls else "<h4>no collectives</h4>"
    ]
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
