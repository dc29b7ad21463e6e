"""Point-to-point messages matched pair by pair: each ordered pair of ranks (sender, receiver) has its own sequence
of sends and receives, which gloo matches in order. Pure functions over the ranks' ``enter`` events of ``send``,
``recv``, ``isend`` and ``irecv`` (ddpfaults' tracing records each with its peer as ``root``, its shapes and step).

Measured on gloo (torch 2.13): a blocking ``send`` waits for its ``recv`` (a microbatch one stage never sends leaves
its receiver waiting for ever, and one it sends that is never received leaves the sender waiting); a message larger
than the receiver's buffer aborts the *receiving* rank (SIGABRT, ``op.preamble.length <= op.nbytes``), a smaller one
fills it silently. So the rank to name is the one that sent fewer messages than its peer received (or received
fewer than it was sent), or sent more than the receiver's buffer held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpfaults.judge.attribution import HABIT, Evidence, departed
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.judge.results import RankResult, RankState

SENDS, RECEIVES = frozenset({"send", "isend"}), frozenset({"recv", "irecv"})


@dataclass(frozen=True)
class Message:
    """One send or receive a rank made: to or from ``peer``, of ``shapes``, in ``step``, at ``site``."""

    rank: int
    peer: int
    op: str
    shapes: tuple
    step: int | None
    site: str

    def size(self) -> int:
        """Elements in its first tensor (a send and its receive must agree)."""
        return math.prod(self.shapes[0]) if self.shapes and isinstance(self.shapes[0], list) else 0

    def describe(self) -> str:
        """``send([16]) to rank 1 at pipe.py:14 in stage (step 1)``."""
        step = f" (step {self.step})" if self.step is not None else ""
        way = "to" if self.op in SENDS else "from"
        shapes = ", ".join(str(s) for s in self.shapes)
        return f"{self.op}({shapes}) {way} rank {self.peer} at {self.site}{step}"


def in_order(rank: RankResult) -> list[Message]:
    """The rank's sends and receives, in the order it began them."""
    return [
        Message(rank.rank, e["root"], e["op"], tuple(e.get("shapes") or ()), e.get("step"), e.get("site"))
        for e in rank.events
        if e.get("k") == "enter" and e.get("op") in SENDS | RECEIVES and isinstance(e.get("root"), int)
    ]


def messages(rank: RankResult) -> tuple[dict, dict]:
    """The rank's sends by destination and receives by source, each in order: ``({peer: [Message]}, {...})``."""
    sends: dict[int, list[Message]] = {}
    receives: dict[int, list[Message]] = {}
    for message in in_order(rank):
        (sends if message.op in SENDS else receives).setdefault(message.peer, []).append(message)
    return sends, receives


def _count(items: list[Message], step) -> int:
    return sum(1 for m in items if m.step == step)


def p2p_finding(ranks: list[RankResult]) -> Evidence | None:
    """The rank whose point-to-point messages do not match its peer's, or None.

    First a size mismatch (the n-th message from a sender to a receiver larger or smaller than the receiver's n-th
    buffer from it: the sender is named); else a count mismatch, at the first step whose counts differ in a pair
    whose short side can make no more (it ended, or is none of the pairs' waiting sides): the side that made fewer
    is named, the sender of a message never sent, the receiver of one never received; where several pairs are short
    and no short side ended, the rank whose own steps' messages changed (:func:`own_traffic`)."""
    traffic = {r.rank: messages(r) for r in ranks}
    states = {r.rank: r.state for r in ranks}
    pairs = []
    for s, (sends, _) in traffic.items():
        for d in sorted(set(sends) | {d for d, (_, rec) in traffic.items() if s in rec}):
            if d in traffic:
                pairs.append((s, d, sends.get(d, []), traffic[d][1].get(s, [])))
    for s, d, sent, received in pairs:
        for out, into in zip(sent, received, strict=False):
            if out.size() != into.size():
                return Evidence(
                    (s,),
                    f"rank {s} made {out.describe()}, which rank {d} received as {into.describe()} (gloo aborts a "
                    "receiver sent more than its buffer holds, and fills a larger one silently)",
                )
    found = []
    for s, d, sent, received in pairs:
        if len(sent) == len(received):
            continue
        short, other = (s, d) if len(sent) < len(received) else (d, s)
        steps = sorted({m.step for m in sent + received}, key=lambda x: (x is None, x))
        step = next((t for t in steps if _count(sent, t) != _count(received, t)), None)
        ended = states[short] in (RankState.FINISHED, RankState.RAISED, RankState.DIED)
        found.append((not ended, step is None, step if step is not None else 0, short, s, d, sent, received, step))
    if not found or (len(found) > 1 and all(f[0] for f in found)):
        # no short side ended, several pairs short: the rank whose own steps' messages changed, if one did (a stage
        # one microbatch short, waiting for gradients of its own while the next waits for the activation never sent)
        return own_traffic(ranks) if found else None
    *_, short, s, d, sent, received, step = min(found, key=lambda f: f[:4])
    at = f" in step {step}" if step is not None else ""
    n_sent, n_received = (
        (_count(sent, step), _count(received, step)) if step is not None else (len(sent), len(received))
    )
    if short == s:
        shows = (
            f"rank {s} sent {n_sent} message(s) to rank {d}{at}, where rank {d} received {n_received}: rank {d}'s "
            f"{received[len(sent)].describe()} is never sent"
        )
    else:
        shows = (
            f"rank {d} received {n_received} message(s) from rank {s}{at}, where rank {s} sent {n_sent}: rank {s}'s "
            f"{sent[len(received)].describe()} is never received"
        )
    return Evidence((short,), shows)


def own_traffic(ranks: list[RankResult]) -> Evidence | None:
    """The ranks whose sends and receives in one step departed from those of their other steps while every other
    rank kept to its own (:func:`ddpfaults.judge.attribution.departed`), or None. A step's pattern is the rank's
    messages in order, by direction and peer: a stage whose batch held one microbatch fewer sent one activation
    fewer and went on to receive gradients, where its other steps sent one more first; the stage waiting for that
    activation made, so far, what its steps always begin with. A rank's first step, when it differs from all its
    later complete ones and those agree, is set-up and left out (``torch.distributed.pipelining`` exchanges the
    stages' shapes in a schedule's first step). Two ranks that each send to the other first have no earlier steps to
    depart from: nothing is named."""
    patterns: dict[int, dict[int, tuple]] = {}
    complete: dict[int, list[int]] = {}
    for r in ranks:
        units: dict[int, list] = {}
        for m in in_order(r):
            if m.step is not None:
                units.setdefault(m.step, []).append((m.op in SENDS, m.peer))
        if not units:
            continue
        last = max(units) if r.last_step is None else max(max(units), r.last_step)
        patterns[r.rank] = {u: tuple(units.get(u, ())) for u in range(min(units), last + 1)}
        complete[r.rank] = [u for u in patterns[r.rank] if r.state == RankState.FINISHED or u < last]
        done, made = complete[r.rank], patterns[r.rank]
        if len(done) > HABIT and len({made[u] for u in done[1:]}) == 1 and made[done[0]] != made[done[1]]:
            del made[done[0]]  # a first step unlike all the later ones is set-up (pipelining's shape exchange)
            complete[r.rank] = done[1:]
    found = departed(patterns, complete)
    if found is None:
        return None
    step, deviants, steady, usual_at = found
    first = deviants[0]
    so_far = "" if step in complete[first] else " so far"
    return Evidence(
        tuple(deviants),
        f"in step {step} {format_ranks(deviants)} made {_runs(patterns[first][step])}{so_far}, where "
        f"{'its' if len(deviants) == 1 else 'their'} other steps made {_runs(patterns[first][usual_at[first]])}; "
        f"{format_ranks(steady)} made {'its' if len(steady) == 1 else 'their'} usual ones",
    )


def _runs(pattern: tuple) -> str:
    """``3 send(s) to rank 1, then 1 recv(s) from rank 1``: a step's messages (``(is a send, peer)``), runs counted."""
    runs: list[list] = []
    for message in pattern:
        if runs and runs[-1][0] == message:
            runs[-1][1] += 1
        else:
            runs.append([message, 1])
    if not runs:
        return "no send or receive"
    return ", then ".join(f"{n} {'send(s) to' if send else 'recv(s) from'} rank {peer}" for (send, peer), n in runs)


def split_finding(ranks: list[RankResult]) -> Evidence | None:
    """The rank whose ``all_to_all_single`` sent a peer more rows than that peer's call expected from it, or None.

    The ranks' calls are matched in order (the n-th on each rank; ddpfaults' tracing records each call's
    ``input_split_sizes`` and ``output_split_sizes``, a split not given being even: :func:`_rows`) and checked from
    the sender's side: at the first call where a rank's rows to a peer differ from the rows the peer expects from
    it, the sender is named (a rank gloo aborted first, if one did: the receiver of a message larger than its buffer
    dies). MoE routing that computes split sizes per rank without exchanging the counts first does this."""
    calls = {
        r.rank: [e for e in r.events if e.get("k") == "enter" and e.get("op") == "all_to_all_single"] for r in ranks
    }
    died = {r.rank for r in ranks if r.state == RankState.DIED}
    size = len(ranks)
    for i in range(max((len(c) for c in calls.values()), default=0)):
        at = {rank: c[i] for rank, c in calls.items() if i < len(c)}
        wrong = []
        for s, call in at.items():
            rows_out = _rows(call, 0, size)
            for d, theirs in at.items():
                rows_in = _rows(theirs, 1, size)
                if rows_out is None or rows_in is None or d >= len(rows_out) or s >= len(rows_in):
                    continue
                if rows_out[d] != rows_in[s]:
                    wrong.append((d not in died, rows_out[d] < rows_in[s], s, d, rows_out[d], rows_in[s], call))
        if wrong:
            *_, s, d, sent, expected, call = min(wrong, key=lambda w: w[:4])
            step = f" (step {call.get('step')})" if call.get("step") is not None else ""
            return Evidence(
                (s,),
                f"rank {s}'s all_to_all_single at {call.get('site')}{step} sent rank {d} {sent} row(s) where rank "
                f"{d} expected {expected} from it (split sizes computed per rank without exchanging the counts first)",
            )
    return None


def _rows(call: dict, side: int, size: int) -> list | None:
    """An ``all_to_all_single`` call's rows to each rank (``side`` 0: its input splits) or from each (1: its output
    splits): as given, or, where none were given (an even split, as torch then does), its tensor's first dimension
    (the recorded shapes: output first, then input) divided among the ``size`` ranks; None where neither is known."""
    splits = call.get("splits") or [None, None]
    if splits[side] is not None:
        return splits[side]
    shapes = call.get("shapes") or []
    shape = shapes[1 - side] if len(shapes) == 2 else None
    if not shape or not isinstance(shape[0], int) or shape[0] % size:
        return None
    return [shape[0] // size] * size


def begun(events: list[dict]) -> tuple[dict, dict]:
    """How many sends to, and receives from, each peer a rank's events show it began: ``({peer: n}, {peer: n})``."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for e in events:
        if e.get("k") == "enter" and e.get("op") in SENDS | RECEIVES and isinstance(e.get("root"), int):
            counts = sent if e["op"] in SENDS else received
            counts[e["root"]] = counts.get(e["root"], 0) + 1
    return sent, received
