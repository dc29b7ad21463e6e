"""The Chrome Trace Event export (Perfetto, chrome://tracing): hand-built worlds, one real hung world, the CLI
subcommand and the pytest option end to end. What is checked is the document's structure: the keys each
phase needs, microsecond times that match the world's events, one named track per rank, properly nested
slices on every thread, and the never-left collectives of a hung world ending at the verdict."""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict

import pytest

import rankfns
from ddpfaults import Outcome, RankResult, RankState, WorldResult, run_world
from ddpfaults.__main__ import main as cli
from ddpfaults.errors import ReportFileError
from ddpfaults.faults import SkippedCollective
from ddpfaults.report.chrome_trace import SCHEMA, STEPS_TID, trace_document, write_trace
from ddpfaults.report.document import collective_numbers, read_document, world_time, write_document
from plugin_user import every_option_session
from processes import WORLD_GUARD

EPS = 1e-3  # microseconds: times are rounded to nanoseconds
RANK_INSTANTS = {"start", "fault", "log", "failed", "finished", "exited", "killed"}


# -- the structure every trace must have ------------------------------------------------------------


def check_trace(document: dict, worlds: list[dict]) -> dict:
    """Assert the trace's structure against the report dicts of ``worlds``; return the document as reloaded
    from its JSON text."""
    loaded = json.loads(json.dumps(document, allow_nan=False))
    assert loaded == document, "the trace is plain JSON"
    assert set(document) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert document["displayTimeUnit"] == "ms"
    assert document["otherData"]["schema"] == SCHEMA == "ddpfaults.trace/1"
    events = document["traceEvents"]
    assert isinstance(events, list)
    for e in events:
        assert isinstance(e.get("name"), str) and e["name"], e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        if e["ph"] == "M":
            key = "name" if e["name"] in ("process_name", "thread_name") else "sort_index"
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"), e
            assert key in e["args"], e
            continue
        assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
        else:
            assert e["ph"] == "i" and e.get("s") in ("t", "p", "g"), e
    assert_nested(events)
    names = {(e["pid"], e["tid"], e["name"]): e["args"] for e in events if e["ph"] == "M"}
    for pid, world in enumerate(worlds, 1):
        process = names[(pid, 0, "process_name")]["name"]
        assert (world.get("nodeid") or world["function"]) in process and world["outcome"] in process
        for r in world["ranks"]:
            assert names[(pid, r["rank"], "thread_name")] == {"name": f"rank {r['rank']}"}
            assert names[(pid, STEPS_TID + r["rank"], "thread_name")] == {"name": f"rank {r['rank']} steps"}
            assert "sort_index" in names[(pid, r["rank"], "thread_sort_index")]
        summary = document["otherData"]["worlds"][pid - 1]
        assert summary["pid"] == pid
        assert {k: summary[k] for k in ("outcome", "root_cause", "seed")} == {
            k: world[k] for k in ("outcome", "root_cause", "seed")
        }
        assert summary.get("replay") == (world.get("replay") or None)
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"}
    named = {(pid, tid) for pid, tid, name in names if name == "thread_name"}
    assert threads <= named, "every thread that holds events is named"
    return loaded


def assert_nested(events) -> None:
    """The ``X`` slices of one thread are disjoint or nested, never overlapping in part."""
    threads = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            threads[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e))
    for slices in threads.values():
        stack = []
        for ts, end, e in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= ts + EPS:
                stack.pop()
            assert not stack or end <= stack[-1] + EPS, f"slice overlaps an enclosing one in part: {e}"
            stack.append(end)


def test_the_nesting_check_catches_partial_overlap():
    good = [{"ph": "X", "pid": 1, "tid": 0, "ts": a, "dur": d} for a, d in ((0, 10), (2, 3), (5, 5), (10, 0), (11, 1))]
    assert_nested(good)
    with pytest.raises(AssertionError, match="overlaps"):
        assert_nested(good + [{"ph": "X", "pid": 1, "tid": 0, "ts": 8, "dur": 4}])


def verdict_t(world: dict) -> float:
    return next(e["t"] for e in world["events"] if e["k"] == "verdict")


def check_against_events(document: dict, worlds: list[dict]) -> None:
    """Every collective, step and instant of every rank is in the trace at its event's time (in microseconds)."""
    events = [e for e in document["traceEvents"] if e["ph"] != "M"]
    for pid, world in enumerate(worlds, 1):
        end_of_world = verdict_t(world) * 1e6
        for r in world["ranks"]:
            rank = r["rank"]
            mine = [e for e in events if e["pid"] == pid and e["tid"] % STEPS_TID == rank and e.get("s") != "p"]
            slices = [e for e in mine if e["ph"] == "X" and e["tid"] != STEPS_TID + rank]
            traced = [e for e in slices if e["args"]["recorder"] == "tracing"]
            colls = {e["args"]["seq"]: e for e in traced}
            kinds = sorted(r["events"], key=lambda e: e["t"])
            exits = {e["seq"]: e["t"] for e in kinds if e["k"] == "exit"}
            enters = [e for e in kinds if e["k"] == "enter"]
            assert sorted(e["args"]["seq"] for e in traced) == sorted(e["seq"] for e in enters), "each traced call once"
            matched = collective_numbers(r)
            recorded = [e for e in slices if e["args"]["recorder"] == "flight recorder"]
            assert len(traced) + len(recorded) == len(slices)
            assert sorted(e["args"]["number"] for e in recorded) == [
                n for n, c in enumerate(r["collectives"], 1) if n not in matched.values() and c.get("wall") is not None
            ], "every collective only the recorder saw, once; none a traced call already drew"
            for e in recorded:
                call = r["collectives"][e["args"]["number"] - 1]
                assert e["ts"] == pytest.approx(world_time(call["wall"], r) * 1e6, abs=EPS)
                returned = any(x["k"] == "finished" for x in r["events"])
                assert (e["name"], e["args"]["note"]) == (call["op"], call["note"])
                assert e["args"]["left"] is (call["done"] or returned)
            for e in enters:
                c = colls[e["seq"]]
                assert c["name"] == e["op"]
                assert c["ts"] == pytest.approx(e["t"] * 1e6, abs=EPS)
                assert {k: c["args"][k] for k in ("shapes", "site", "step", "note")} == {
                    k: e[k] for k in ("shapes", "site", "step", "note")
                }
                assert c["args"]["left"] is (e["seq"] in exits)
                end = exits[e["seq"]] * 1e6 if e["seq"] in exits else end_of_world
                assert c["ts"] + c["dur"] == pytest.approx(end, abs=EPS)
            steps = [e for e in mine if e["tid"] == STEPS_TID + rank]
            step_events = [e for e in kinds if e["k"] == "step"]
            assert [s["args"]["step"] for s in steps] == [e["step"] for e in step_events]
            for s, e in zip(steps, step_events, strict=True):
                assert s["ph"] == "X" and s["ts"] == pytest.approx(e["t"] * 1e6, abs=EPS)
            instants = [(e["name"], e["ts"]) for e in mine if e["ph"] == "i"]
            assert all(e["tid"] == rank and e["s"] == "t" for e in mine if e["ph"] == "i")
            expected = [(e["k"], e["t"] * 1e6) for e in kinds if e["k"] in RANK_INSTANTS]
            assert [n for n, _ in instants] == [k for k, _ in expected]
            assert [t for _, t in instants] == pytest.approx([t for _, t in expected], abs=EPS)
        world_instants = [e for e in events if e["pid"] == pid and e["ph"] == "i" and e["s"] == "p"]
        assert [(e["name"], e["ts"]) for e in world_instants] == [
            (e["k"], pytest.approx(e["t"] * 1e6, abs=EPS)) for e in world["events"]
        ]


# -- hand-built worlds --------------------------------------------------------------------------------


def enter(seq, t, step, op="all_reduce", note="", site="train.py:31 in train_step"):
    return {"k": "enter", "t": t, "seq": seq, "op": op, "shapes": [[4]], "site": site, "step": step, "note": note}


def world_of(outcome, ranks, events, **kwargs) -> WorldResult:
    return WorldResult(
        outcome=Outcome(outcome),
        ranks=ranks,
        root_cause=kwargs.pop("root_cause", "no failure"),
        root_rank=kwargs.pop("root_rank", None),
        reason=kwargs.pop("reason", "ended"),
        elapsed=kwargs.pop("elapsed", events[-1]["t"] if events else 1.0),
        world_size=len(ranks),
        seed=kwargs.pop("seed", 7),
        events=events,
        function=kwargs.pop("function", "train.py:train"),
        **kwargs,
    )


def hung_world() -> WorldResult:
    """Rank 1 skips step 1's all_reduce, logs, and finishes; rank 0 waits in its second all_reduce."""
    init = [enter(1, 0.01, None, op="init_process_group", site="ddpfaults"), {"k": "exit", "t": 0.02, "seq": 1}]
    r0 = init + [
        {"k": "step", "t": 0.021, "step": 0},
        enter(2, 0.022, 0),
        {"k": "exit", "t": 0.03, "seq": 2},
        {"k": "step", "t": 0.031, "step": 1},
        enter(3, 0.032, 1),
        {"k": "killed", "t": 2.5},
    ]
    r1 = init + [
        {"k": "step", "t": 0.021, "step": 0},
        enter(2, 0.023, 0),
        {"k": "exit", "t": 0.03, "seq": 2},
        {"k": "step", "t": 0.0305, "step": 1},
        {"k": "fault", "t": 0.0306, "index": 0, "fault": "SkippedCollective(rank=1, step=1)", "how": "skipped"},
        {"k": "log", "t": 0.0307, "msg": "skipped", "step": 1},
        {"k": "finished", "t": 0.031, "step": 1},
        {"k": "mystery", "t": 0.05, "what": "a kind this version does not know"},
        {"k": "killed", "t": 2.5},
    ]
    ranks = [
        RankResult(rank=0, state=RankState.BLOCKED, last_step=1, events=r0),
        RankResult(rank=1, state=RankState.FINISHED, last_step=1, events=r1),
    ]
    events = [{"k": "stall", "t": 0.0307, "window": 2.0}, {"k": "verdict", "t": 2.4, "reason": "stall"}]
    return world_of("hung", ranks, events, root_cause="rank 1 never called collective #2", root_rank=1)


def crashed_world() -> WorldResult:
    """Rank 1 raises and exits, rank 2 dies inside an all_reduce, rank 3 fails as collateral; launcher-side
    events listed out of time order, as the launcher appends them."""
    ranks = [
        RankResult(
            rank=0,
            state=RankState.FINISHED,
            events=[{"k": "start", "t": 0.001, "pid": 10}, {"k": "step", "t": 0.1, "step": 0}, enter(2, 0.2, 0)]
            + [{"k": "exit", "t": 0.3, "seq": 2}, {"k": "finished", "t": 0.35, "step": 0}],
        ),
        RankResult(
            rank=1,
            state=RankState.RAISED,
            error="KeyError: 'mask'",
            events=[
                {"k": "step", "t": 0.1, "step": 0},
                {"k": "exited", "t": 0.6, "code": 1},  # launcher-side, recorded last but listed first
                {"k": "failed", "t": 0.5, "error": "KeyError: 'mask'", "site": "train.py:9 in loss", "step": 0},
            ],
        ),
        RankResult(
            rank=2,
            state=RankState.DIED,
            exitcode=-9,
            events=[{"k": "step", "t": 0.1, "step": 0}, enter(2, 0.4, 0), {"k": "exited", "t": 0.45, "code": -9}],
        ),
        RankResult(
            rank=3,
            state=RankState.RAISED,
            collateral=True,
            events=[
                {"k": "step", "t": 0.1, "step": 0},
                enter(2, 0.2, 0),
                {"k": "exit", "t": 0.55, "seq": 2},
                {"k": "failed", "t": 0.56, "error": "RuntimeError: Connection closed by peer", "site": "x", "step": 0},
                {"k": "killed", "t": 0.71},
            ],
        ),
    ]
    return world_of(
        "crashed",
        ranks,
        [{"k": "verdict", "t": 0.7, "reason": "ended"}],
        root_cause="rank 1 raised KeyError",
        root_rank=1,
        replay="pytest -p ddpfaults 't.py::test_crash' --ddpfaults-seed=7",
    )


def ddp_world() -> WorldResult:
    """DDP's gradient buckets are all_reduced asynchronously: bucket 0 is entered before bucket 1 is left."""
    events = [
        {"k": "step", "t": 0.1, "step": 0},
        enter(2, 0.2, 0, note="DDP gradient bucket 1"),
        enter(3, 0.25, 0, note="DDP gradient bucket 0"),
        {"k": "exit", "t": 0.3, "seq": 2},
        {"k": "exit", "t": 0.35, "seq": 3},
        enter(4, 0.4, 0, op="all_gather_object"),
        enter(5, 0.41, 0, op="all_gather"),
        {"k": "exit", "t": 0.42, "seq": 5},
        {"k": "exit", "t": 0.43, "seq": 4},
        {"k": "finished", "t": 0.5, "step": 0},
    ]
    ranks = [RankResult(rank=0, state=RankState.FINISHED, events=events)]
    return world_of("completed", ranks, [{"k": "verdict", "t": 0.6, "reason": "ended"}])


def test_hand_built_worlds_give_a_well_formed_trace():
    worlds = [hung_world(), crashed_world(), ddp_world()]
    nodeids = ["tests/t.py::test_hang", None, "tests/t.py::test_ddp"]
    document = trace_document(worlds, nodeids)
    dicts = [{**w.to_dict(), **({"nodeid": n} if n else {})} for w, n in zip(worlds, nodeids, strict=True)]
    check_trace(document, dicts)
    check_against_events(document, dicts)
    assert trace_document([w.to_dict() for w in worlds], nodeids) == document, "dicts give the same trace"
    meta = {(e["pid"], e["name"]): e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    assert meta == {
        (1, "process_name"): "tests/t.py::test_hang (hung)",
        (2, "process_name"): "train.py:train (crashed)",
        (3, "process_name"): "tests/t.py::test_ddp (completed)",
    }
    assert [w["replay"] for w in document["otherData"]["worlds"] if "replay" in w] == [crashed_world().replay]


def test_never_left_collectives_last_until_the_verdict():
    document = trace_document([hung_world(), crashed_world()])
    open_slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["args"].get("left") is False]
    assert [(e["pid"], e["tid"], e["args"]["seq"]) for e in open_slices] == [(1, 0, 3), (2, 2, 2)]
    assert [e["ts"] + e["dur"] for e in open_slices] == pytest.approx([2.4e6, 0.7e6])
    assert all(e["cname"] == "terrible" for e in open_slices)


def test_steps_run_to_the_next_step_then_to_the_end_of_the_function():
    document = trace_document([hung_world(), crashed_world()])
    steps = {
        (e["pid"], e["tid"], e["name"]): (e["ts"], e["ts"] + e["dur"])
        for e in document["traceEvents"]
        if e["ph"] == "X"
    }
    assert steps[(1, STEPS_TID + 0, "step 0")] == pytest.approx((21000, 31000))
    assert steps[(1, STEPS_TID + 0, "step 1")] == pytest.approx((31000, 2.4e6)), "still running: to the verdict"
    assert steps[(1, STEPS_TID + 1, "step 1")] == pytest.approx((30500, 31000)), "to its finished event"
    assert steps[(2, STEPS_TID + 1, "step 0")] == pytest.approx((1e5, 5e5)), "to its failed event"
    assert steps[(2, STEPS_TID + 2, "step 0")] == pytest.approx((1e5, 4.5e5)), "to its exit"


def test_instants_carry_their_event_fields():
    document = trace_document([hung_world(), crashed_world()])
    instants = {(e["pid"], e["tid"], e["name"]): e for e in document["traceEvents"] if e["ph"] == "i"}
    assert instants[(1, 1, "fault")]["args"] == {
        "index": 0,
        "fault": "SkippedCollective(rank=1, step=1)",
        "how": "skipped",
    }
    assert instants[(1, 1, "log")]["args"] == {"msg": "skipped", "step": 1}
    assert instants[(1, 0, "stall")] == {
        "name": "stall",
        "ph": "i",
        "s": "p",
        "ts": 30700.0,
        "pid": 1,
        "tid": 0,
        "args": {"window": 2.0},
    }
    verdict = instants[(1, 0, "verdict")]
    assert verdict["s"] == "p" and verdict["args"]["reason"] == "stall" and verdict["args"]["outcome"] == "hung"
    assert instants[(2, 1, "failed")]["args"] == {
        "error": "KeyError: 'mask'",
        "site": "train.py:9 in loss",
        "step": 0,
        "collateral": False,
    }
    assert instants[(2, 3, "failed")]["args"]["collateral"] is True
    assert instants[(2, 2, "exited")]["args"] == {"code": -9}
    assert not any(e["name"] == "mystery" for e in document["traceEvents"]), "unknown kinds are ignored"


def test_ddp_buckets_that_overlap_in_part_go_to_an_extra_thread():
    document = trace_document([ddp_world()])
    slices = {e["args"]["seq"]: e for e in document["traceEvents"] if e["ph"] == "X" and "seq" in e["args"]}
    assert {seq: e["tid"] for seq, e in slices.items()} == {2: 0, 3: 2 * STEPS_TID, 4: 0, 5: 0}
    assert slices[2]["args"]["note"] == "DDP gradient bucket 1" and slices[3]["args"]["note"] == "DDP gradient bucket 0"
    assert slices[2]["cat"] == "collective,ddp" and slices[4]["cat"] == "collective"
    names = {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert names == {0: "rank 0", 2 * STEPS_TID: "rank 0 async 1", STEPS_TID: "rank 0 steps"}
    assert_nested(document["traceEvents"])


def test_the_first_divergent_collective_is_found_among_calls_the_events_do_not_trace():
    """A rank's ``collectives`` may come from torch's flight recorder, which also sees DDP's own broadcasts: the
    divergent call is matched to its event by signature, not by position."""
    site = "train.py:31 in train_step"
    calls = [
        {"seq": 1, "op": "broadcast", "shapes": [[4]], "site": "distributed.py:9", "step": None, "note": ""},
        {"seq": 2, "op": "all_reduce", "shapes": [[4]], "site": site, "step": 0, "note": ""},
        {"seq": 3, "op": "all_reduce", "shapes": [[4]], "site": site, "step": 0, "note": ""},
        {"seq": 4, "op": "all_reduce", "shapes": [[4]], "site": site, "step": 1, "note": ""},
    ]
    events = [enter(2, 0.1, 0), {"k": "exit", "t": 0.2, "seq": 2}, enter(3, 0.3, 0), {"k": "exit", "t": 0.4, "seq": 3}]
    events += [enter(4, 0.5, 1)]
    world = world_of("hung", [RankResult(rank=0, state=RankState.BLOCKED, events=events)], [], elapsed=2.0).to_dict()
    world["ranks"][0]["collectives"] = calls
    flagged = {}
    for index in (1, 2, 3, 4, 5):
        world["divergence"] = {"index": index, "groups": [], "odd_ranks": [0]}
        document = trace_document([world])
        flagged[index] = [e["args"]["seq"] for e in document["traceEvents"] if e.get("args", {}).get("first_divergent")]
    assert flagged == {1: [], 2: [2], 3: [3], 4: [4], 5: []}


def recorded_world(outcome="completed") -> dict:
    """One rank; its ``collectives`` come from the flight recorder (``wall`` times). The wall clock steps forward
    1000 s between two events (an NTP step): recorder times map through the nearest earlier event's two clocks.
    #1 DDP construction, recorder only; #2 the traced all_reduce; #3 a DDP bucket whose end was recorded (NCCL);
    #4 a DDP bucket the recorder never saw complete: open in the hung world; in the completed one the rank's
    function returned, so it was left (gloo had not yet retired it in the recorder when the rank dumped it)."""
    site, ddp = "train.py:31 in train_step", {"site": "train.py:40 in train_step", "step": 0, "shapes": [[4]]}
    events = [
        {"k": "start", "t": 0.01, "wall": 1000.01},
        {"k": "step", "t": 0.1, "step": 0, "wall": 1000.1},
        {**enter(2, 0.2, 0, site=site), "wall": 1000.2},
        {"k": "exit", "t": 0.3, "seq": 2, "wall": 2000.3},  # the wall clock stepped by 1000 s before this event
        {"k": "finished", "t": 0.5, "step": 0, "wall": 2000.5},
    ]
    calls = [
        {"seq": 1, "op": "broadcast", "shapes": [[6]], "site": site, "step": None, "note": "DDP construction"},
        {"seq": 2, "op": "all_reduce", "shapes": [[4]], "site": site, "step": 0, "note": ""},
        {"seq": 3, "op": "all_reduce", "note": "DDP gradient bucket", **ddp},
        {"seq": 4, "op": "all_reduce", "note": "DDP gradient bucket", **ddp},
    ]
    walls = [(1000.05, None, True), (1000.201, None, True), (2000.35, 2000.4, True), (2000.45, None, False)]
    for call, (wall, wall_end, done) in zip(calls, walls, strict=True):
        call.update(wall=wall, wall_end=wall_end, done=done)
    state = RankState.FINISHED if outcome == "completed" else RankState.BLOCKED
    if outcome != "completed":
        events.pop()  # no "finished": the rank still waits
    world = world_of(outcome, [RankResult(rank=0, state=state, events=events)], [{"k": "verdict", "t": 0.9}])
    world = world.to_dict()
    world["ranks"][0]["collectives"], world["ranks"][0]["recorder"] = calls, "flight recorder"
    return world


def test_calls_only_the_flight_recorder_saw_are_drawn_once_on_the_worlds_clock():
    completed, hung = recorded_world(), recorded_world("hung")
    hung["divergence"] = {"index": 3, "groups": [], "odd_ranks": [0]}
    document = trace_document([completed, hung])
    check_trace(document, [completed, hung])
    check_against_events(document, [completed, hung])
    slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["cat"] != "step" and e["pid"] == 2]
    drawn = [(e["args"]["number"], e["args"]["recorder"], e["ts"], e["dur"], e["args"]["left"]) for e in slices]
    assert drawn == [
        (1, "flight recorder", pytest.approx(50000), 0, True),  # issued, no end recorded: no length
        (2, "tracing", pytest.approx(200000), pytest.approx(100000), True),  # drawn once, from its events
        (3, "flight recorder", pytest.approx(350000), pytest.approx(50000), True),  # 2000.35 s is 0.35 s, not -999.6
        (4, "flight recorder", pytest.approx(450000), pytest.approx(450000), False),  # never completed: to the verdict
    ]
    assert [e["args"].get("end_recorded") for e in slices] == [False, None, None, None]
    assert [e["args"].get("first_divergent", False) for e in slices] == [False, False, True, False]
    assert slices[3]["cname"] == "terrible" and slices[0]["cat"] == "collective,ddp"
    finished = [e for e in document["traceEvents"] if e["ph"] == "X" and e["cat"] != "step" and e["pid"] == 1]
    assert [(e["args"]["number"], e["args"]["left"], e["dur"]) for e in finished][3] == (4, True, 0)
    assert "cname" not in finished[3] and finished[3]["args"]["end_recorded"] is False


def test_a_world_without_events_still_has_its_tracks():
    world = world_of("completed", [RankResult(rank=r, state=RankState.FINISHED) for r in range(3)], [], elapsed=0.5)
    document = trace_document(world, "t.py::one")  # one world, one node id
    assert [e for e in document["traceEvents"] if e["ph"] != "M"] == []
    names = sorted(e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name")
    assert names == ["rank 0", "rank 0 steps", "rank 1", "rank 1 steps", "rank 2", "rank 2 steps"]
    assert document["otherData"]["worlds"][0]["nodeid"] == "t.py::one"


# -- writing ----------------------------------------------------------------------------------------------


def test_write_trace_is_atomic_and_refuses_a_directory(tmp_path):
    path = write_trace(tmp_path / "out" / "trace.json", [hung_world()], ["t.py::x"])
    assert path == str(tmp_path / "out" / "trace.json")
    assert os.listdir(tmp_path / "out") == ["trace.json"], "no temp file left"
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == trace_document([hung_world()], ["t.py::x"])
    with pytest.raises(ReportFileError, match=re.escape(f"trace file '{tmp_path}' is a directory")):
        write_trace(tmp_path, [hung_world()])
    (tmp_path / "plain").write_text("a file, not a directory")
    with pytest.raises(ReportFileError, match="plain.*cannot be written"):
        write_trace(tmp_path / "plain" / "trace.json", [hung_world()])
    assert sorted(os.listdir(tmp_path)) == ["out", "plain"]


def test_cli_trace_converts_a_report_document(tmp_path, capsys):
    report = write_document(tmp_path / "report.json", [hung_world(), crashed_world()], ["t.py::a", "t.py::b"])
    assert cli(["trace", report]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.trace.json")
    document = json.loads((tmp_path / "report.trace.json").read_text())
    check_trace(document, read_document(report)["worlds"])
    assert document == trace_document(read_document(report))
    assert cli(["trace", report, "-o", str(tmp_path / "sub" / "t.json")]) == 0
    assert json.loads((tmp_path / "sub" / "t.json").read_text()) == document
    (tmp_path / "bare.json").write_text(hung_world().to_json())
    assert cli(["trace", str(tmp_path / "bare.json")]) == 2
    assert "bare.json" in capsys.readouterr().err
    assert not (tmp_path / "bare.trace.json").exists()


# -- a real world ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hung4():
    """Rank 2 skips step 2's all_reduce and finishes one collective ahead; ranks 0, 1, 3 wait in their last."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(rankfns.all_reduce_steps, world_size=4, faults=[SkippedCollective(rank=2, step=2)], stall=1.0)
    assert result.outcome == Outcome.HUNG and result.root_rank == 2, result.report()
    return result


def test_real_hung_world(tmp_path, hung4):
    world = {**hung4.to_dict(), "nodeid": "tests/t.py::test_hang"}
    document = check_trace(trace_document([hung4], ["tests/t.py::test_hang"]), [world])
    check_against_events(document, [world])
    events = [e for e in document["traceEvents"] if e["ph"] != "M"]
    never_left = [e for e in events if e["ph"] == "X" and e["args"].get("left") is False]
    assert sorted(e["tid"] for e in never_left) == [0, 1, 3]
    assert all(e["name"] == "all_reduce" and e["args"]["step"] == 3 for e in never_left)
    for e in never_left:
        assert e["ts"] + e["dur"] == pytest.approx(verdict_t(world) * 1e6, abs=EPS), "open until the verdict"
    divergent = sorted(e["tid"] for e in events if e["ph"] == "X" and e["args"].get("first_divergent"))
    assert divergent == [0, 1, 2, 3] and hung4.divergence.index == 3
    assert [(e["tid"], e["args"]["how"]) for e in events if e["name"] == "fault"] == [(2, "skipped all_reduce")]
    assert [e["name"] for e in events if e.get("s") == "p"] == ["deadlock", "verdict"]  # proved when it formed
    assert sorted(e["tid"] for e in events if e["name"] == "killed") == [0, 1, 2, 3]
    assert document["otherData"]["worlds"][0]["outcome"] == "hung"
    report = write_document(tmp_path / "r.json", [hung4], ["tests/t.py::test_hang"])
    assert trace_document(read_document(report)) == document, "the same trace from the report file"


def ddp_world_of(wrap: str) -> WorldResult:
    result = run_world(rankfns.ddp_steps, world_size=2, kwargs={"wrap": wrap, "steps": 3}, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert all(r.recorder == "flight recorder" for r in result.ranks), result.report()
    return result


@pytest.fixture(scope="module")
def plain_ddp():
    """Plain DistributedDataParallel, 3 steps: the tracing sees none of DDP's collectives, the recorder all."""
    return ddp_world_of("plain")


@pytest.fixture(scope="module")
def ctx_ddp():
    """ctx.ddp, 3 steps: the tracing sees the gradient buckets' all_reduces, the recorder every collective."""
    return ddp_world_of("ctx")


def test_real_plain_ddp_world_has_the_gradient_buckets_the_recorder_saw(plain_ddp):
    world = plain_ddp.to_dict()
    document = check_trace(trace_document([plain_ddp]), [world])
    check_against_events(document, [world])
    for r in world["ranks"]:
        assert not [e for e in r["events"] if e["k"] == "enter" and e["op"] != "init_process_group"], "none traced"
        slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["tid"] % STEPS_TID == r["rank"]]
        slices = [e for e in slices if e["tid"] != STEPS_TID + r["rank"]]
        buckets = [e for e in slices if e["args"]["note"] == "DDP gradient bucket"]
        assert [(e["name"], e["args"]["step"], e["cat"]) for e in buckets] == [
            ("all_reduce", step, "collective,ddp") for step in (0, 1, 2)
        ]
        assert sorted(e["args"]["number"] for e in slices if e["name"] != "init_process_group") == list(
            range(1, len(r["collectives"]) + 1)
        ), "every collective of the record, once"
        steps = sorted(e["t"] for e in r["events"] if e["k"] in ("step", "finished"))
        for bucket in buckets:  # on the world's clock: inside the step the recorder says it was made in
            step = bucket["args"]["step"]
            assert steps[step] * 1e6 - EPS <= bucket["ts"] <= steps[step + 1] * 1e6 + EPS, (bucket, steps)


def test_real_ctx_ddp_world_draws_each_collective_once_and_the_clocks_agree(ctx_ddp):
    world = ctx_ddp.to_dict()
    document = check_trace(trace_document([ctx_ddp]), [world])
    check_against_events(document, [world])
    for r in world["ranks"]:
        slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["tid"] % STEPS_TID == r["rank"]]
        calls = [e for e in slices if e["tid"] != STEPS_TID + r["rank"] and e["name"] != "init_process_group"]
        assert sorted(e["args"]["number"] for e in calls) == list(range(1, len(r["collectives"]) + 1))
        traced = [e for e in calls if e["args"]["recorder"] == "tracing"]
        assert [e["args"]["note"] for e in traced] == ["DDP gradient bucket 0"] * 3, "the buckets: from the tracing"
        events = {(e["k"], e.get("seq")): e["t"] for e in r["events"] if e["k"] in ("enter", "exit")}
        for seq, n in collective_numbers(r).items():  # the recorder stamped each call between its enter and exit
            issued = world_time(r["collectives"][n - 1]["wall"], r)
            assert events[("enter", seq)] - 1e-4 <= issued <= events[("exit", seq)] + 1e-4, (seq, n, issued)


# -- the pytest option, end to end -------------------------------------------------------------------------


def test_plugin_option_writes_the_trace(tmp_path_factory):
    """``--ddpfaults-trace`` in the session every plugin report option is checked in (two xdist workers): one
    trace of every world of both workers, the document the JSON report's worlds make."""
    result, report, directory = every_option_session(tmp_path_factory)
    result.stdout.fnmatch_lines(["Chrome trace: out/trace.json"])
    document = json.loads((directory / "out" / "trace.json").read_text())
    check_trace(document, report["worlds"])
    check_against_events(document, report["worlds"])
    assert document == trace_document(report)
    assert sorted(w["nodeid"] for w in document["otherData"]["worlds"]) == [
        "scenario_user.py::completes",
        "scenario_user.py::crashes[claims_completed]",
        "scenario_user.py::crashes[exit]",
        "scenario_user.py::skips_a_collective",
    ]
    assert [w["outcome"] for w in document["otherData"]["worlds"]] == [w["outcome"] for w in report["worlds"]]
    lanes = sum(e["name"] == "thread_name" and e["args"]["name"].endswith("steps") for e in document["traceEvents"])
    assert lanes == sum(w["world_size"] for w in report["worlds"]) == 8
    assert Counter(e["ph"] for e in document["traceEvents"])["X"] > 0
