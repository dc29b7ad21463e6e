"""The resume check's comparison and the preemption summary, on hand-built records and results (no process)."""

import pytest

from ddpfaults.judge.checks import recovery, resume
from ddpfaults.judge.results import FiredFault, Outcome, RankResult, RankState, WorldResult


def _run(steps: int, *, batch=lambda i: f"b{i}", lr=lambda i: 0.1, state=lambda i: f"s{i}", final="F") -> list:
    """One rank's records of ``steps`` optimizer steps: parameters p0 -> p1 -> ... (p{i+1} after step i)."""
    records = [
        {
            "i": i,
            **({"before": "p0"} if i == 0 else {}),  # the capture records it at an attempt's first step
            "params": f"p{i + 1}",
            "batch": [batch(i)],
            "lr": [lr(i)],
            "state": state(i),
            "rng": {"torch": f"t{i}", "random": f"r{i}", "numpy": f"n{i}"},
        }
        for i in range(steps)
    ]
    return records + ([_end(final)] if final else [])


VALUES = [3.0, 1.0, -2.0, 0.5, 1.5]  # a tensor's norm and 4 projections (ddpfaults.rank.resume.values)


def _end(digest="F", scale=1.0) -> dict:
    """A final record: one module and one optimizer of digest ``digest``, their values ``VALUES`` times ``scale``."""
    values = [[[v * scale for v in VALUES], "int-digest"]]
    return {
        "final": True,
        "modules": [digest],
        "optimizers": [digest],
        "module_values": values,
        "optimizer_values": values,
    }


def _resumed(base: list, upto: int, *, final="F", scale=1.0, **changed) -> list:
    """The base run's steps from ``upto`` on, as an attempt that resumed from the state after step ``upto - 1``
    (``changed``: a field's value at the first resumed step; ``final``, ``scale``: its final record's)."""
    steps = [dict(r) for r in base if not r.get("final")][upto:]
    steps[0].update({"before": f"p{upto}", **changed})
    return steps + [_end(final, scale)]


BASE = _run(6)


def test_an_interrupted_run_resumed_from_its_last_step_is_equivalent():
    killed = _run(4, final=None)  # killed at step 4: steps 0-3 ran
    finding = resume.compare([BASE], [[killed], [_resumed(BASE, 4)]])
    assert finding == {
        "equivalent": True,
        "bit_equal": True,
        "steps": 6,
        "final_identical": True,
        "first_difference": None,
        "rounding": None,
    }
    assert resume.describe(finding) == "resumed bit-equal: 6 steps, final state identical"


def test_the_uninterrupted_run_watches_the_parameters_each_resumed_attempt_entered_with():
    """Attempt 0's first step is every run's step 0 (recorded anyway); each later attempt's, on every rank, is
    watched; a rank that left no step adds nothing."""
    killed, second = _run(4, final=None), _run(2, final=None)
    attempts = [[killed, killed], [_resumed(BASE, 4), []], [_resumed(BASE, 2)]]
    assert resume.watch(attempts) == frozenset({"p4", "p2"})
    assert resume.watch([[killed, second]]) == frozenset()


def test_an_optimizer_state_the_uninterrupted_run_did_not_record_is_not_compared():
    """The uninterrupted run records optimizer and RNG states only where a run resumed (its watch): a resumed step
    it holds no state for compares what it has (the batch, the parameters, the learning rate)."""
    base = [{k: v for k, v in r.items() if k not in ("state", "rng") or r.get("i") == 0} for r in BASE]
    finding = resume.compare([base], [[_run(4, final=None)], [_resumed(BASE, 4, state="lost")]])
    assert finding["equivalent"] is True and finding["first_difference"] is None
    caught = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, state="lost")]])
    assert (caught["first_difference"]["step"], caught["first_difference"]["cause"]) == (4, "optimizer_state")


def _two_optimizers(end: int, start: int = 0, final="F", **changed) -> list:
    """One rank's records of two optimizers stepping in turn (a GAN's), steps ``start``..``end - 1``: optimizer
    ``i % 2`` makes step ``i``; each optimizer's first step in the job records what it entered with (``changed``: a
    field's value at optimizer 1's first step)."""
    records = []
    for i in range(start, end):
        opt, n = i % 2, i // 2
        record = {"i": i, "opt": opt, "params": f"o{opt}-{n + 1}", "batch": [f"b{n}"] if opt == 0 else [], "lr": [0.1]}
        if i < start + 2:
            record.update(before=f"o{opt}-{n}", state=f"s{opt}-{n}", rng={"torch": f"t{n}"})
            record.update(changed if opt == 1 else {})
        records.append(record)
    return records + ([_end(final)] if final else [])


def test_a_resume_with_two_optimizers_stepping_in_turn_is_laid_on_each_one_s_step():
    """Killed after 2 steps of each optimizer, resumed from there: the attempt is laid at step 4 (not 3: optimizer 0's
    previous step was step 2, optimizer 1's step 3 came between), each optimizer's state compared where it resumed."""
    base = [
        {**r, "state": f"s{r['opt']}-{r['i'] // 2}", "rng": {"torch": f"t{r['i'] // 2}"}}
        for r in _two_optimizers(8)[:-1]
    ]
    base.append(_end())
    killed = _two_optimizers(4, final=None)
    assert resume.compare([base], [[killed], [_two_optimizers(8, start=4)]])["equivalent"] is True
    assert resume.watch([[killed], [_two_optimizers(8, start=4)]]) == frozenset({"o0-2", "o1-2"})
    lost = resume.compare([base], [[killed], [_two_optimizers(8, start=4, state="lost")]])
    assert (lost["first_difference"]["step"], lost["first_difference"]["cause"]) == (5, "optimizer_state")


def test_a_step_a_rank_never_ran_but_resumed_past_is_no_loss_a_step_never_reached_is():
    """Rank killed between its two optimizers' steps of one batch (it ran step 2, not 3) while its replica ran both and
    checkpointed: the attempt resumes at step 4 with the state after step 3, so step 3 was not lost. A step after the
    last attempt's is still missing."""
    base = [
        {**r, "state": f"s{r['opt']}-{r['i'] // 2}", "rng": {"torch": f"t{r['i'] // 2}"}}
        for r in _two_optimizers(8)[:-1]
    ]
    base.append(_end())
    killed = _two_optimizers(3, final=None)
    assert resume.compare([base], [[killed], [_two_optimizers(8, start=4)]])["equivalent"] is True
    short = resume.compare([base], [[killed], [_two_optimizers(6, start=4)]])
    assert (short["first_difference"]["step"], short["first_difference"]["cause"]) == (6, "missing_step")


def test_a_step_run_again_after_the_restart_replaces_the_first_run_of_it():
    killed = _run(5, final=None)  # step 4 ran, but its checkpoint was lost: the resume redoes it
    assert resume.compare([BASE], [[killed], [_resumed(BASE, 4)]])["equivalent"]


def test_a_replayed_batch_is_named_with_the_step_it_belongs_to():
    finding = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, batch=["b0"])]])
    first = finding["first_difference"]
    assert (first["step"], first["ranks"], first["cause"], first["attempt"]) == (4, [0], "samples_replayed", 1)
    assert "the batch the uninterrupted run consumed at step 0: samples replayed" in first["detail"]
    assert resume.describe(finding).startswith("resume differs from step 4: rank 0 consumed at step 4")


def test_each_cause_is_told_by_the_first_evidence_that_differs():
    cases = {
        "data_order": {"batch": ["new"]},
        "optimizer_state": {"state": "fresh", "lr": [0.5]},
        "learning_rate": {"lr": [0.5]},
        "rng": {"params": "other", "rng": {"torch": "other", "random": "r4", "numpy": "n4"}},
        "parameters": {"params": "other"},
    }
    for cause, changed in cases.items():
        resumed = _resumed(BASE, 4, final="G", scale=1.01, **changed)
        finding = resume.compare([BASE], [[_run(4, final=None)], [resumed]])
        assert finding["first_difference"]["cause"] == cause, (cause, finding)


def test_the_rng_whose_state_differed_is_named():
    python = {"torch": "t4", "random": "other", "numpy": "n4"}
    cases = [
        ("torch CPU", {"torch": "other", "random": "r4", "numpy": "n4"}),
        ("python random", python),
        ("numpy", {"torch": "t4", "random": "r4", "numpy": "other"}),
        ("torch CPU, python random", {"torch": "other", "random": "other", "numpy": "n4"}),
        ("numpy", {"torch": "t4", "random": "r4"}),  # numpy imported in one run only
    ]
    for names, rng in cases:
        resumed = _resumed(BASE, 4, params="other", rng=rng, final="G", scale=1.01)
        finding = resume.compare([BASE], [[_run(4, final=None)], [resumed]])
        first = finding["first_difference"]
        assert first["cause"] == "rng" and f"the RNG state differs ({names}):" in first["detail"], (names, first)
    resumed = _resumed(BASE, 4, params="other", rng=python, final="G", scale=1.01)
    finding = resume.compare([BASE], [[_run(4, final=None)], [resumed]])
    detail = finding["first_difference"]["detail"]
    assert "random.setstate" in detail and "dropout" not in detail and "numpy" not in detail


def test_an_rng_state_not_restored_is_the_first_difference_though_the_parameters_and_final_state_are_equal():
    rng = {"torch": "t4", "random": "other", "numpy": "n4"}  # drawn from by nothing the step computed
    finding = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, rng=rng)]])
    first = finding["first_difference"]
    assert finding["equivalent"] is False and finding["final_identical"], finding
    assert (first["step"], first["cause"], first["ranks"]) == (4, "rng", [0]), first
    assert "the RNG state differs (python random): Python's random state was not restored" in first["detail"]
    later = _resumed(BASE, 4)
    later[1]["rng"] = rng  # restored, then drawn from otherwise at step 4 without changing its parameters
    assert resume.compare([BASE], [[_run(4, final=None)], [later]])["first_difference"]["step"] == 5


def test_a_replayed_batch_names_the_rngs_that_differ_too():
    rng = {"torch": "t4", "random": "r4", "numpy": "other"}
    finding = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, batch=["b0"], rng=rng)]])
    assert finding["first_difference"]["detail"].endswith(
        "samples replayed (the data position was not restored); the RNG state differs too (numpy)"
    )


def test_an_attempt_resumed_after_the_last_step_is_judged_by_its_modules():
    killed = _run(6, final=None)  # killed after the last optimizer step, its checkpoint saved
    done = {"final": True, "modules": ["F"], "optimizers": [], "steps": 0}  # no step: it met no optimizer
    assert resume.compare([BASE], [[killed], [[done]]])["equivalent"]
    other = resume.compare([BASE], [[killed], [[{**done, "modules": ["G"]}]]])
    assert other["first_difference"]["cause"] == "final_state"
    lost = resume.compare([BASE], [[killed], [[{**done, "steps": 2}]]])  # it stepped, yet recorded no optimizer
    assert lost["first_difference"]["cause"] == "final_state"


def test_resumed_steps_differing_in_the_last_bits_with_every_input_equal_are_equivalent_to_rounding():
    for ranks in (2, 3, 4):
        killed = [_run(4, final=None)] * ranks
        resumed = [_resumed(BASE, 4, params="last bits", final="G", scale=1 + 1e-7)] * ranks
        finding = resume.compare([BASE] * ranks, [killed, resumed])
        assert finding["equivalent"] and not finding["bit_equal"] and not finding["final_identical"], finding
        rounding = finding["rounding"]
        assert (rounding["step"], rounding["ranks"], rounding["attempt"]) == (4, list(range(ranks)), 1)
        assert 0.5e-7 < rounding["relative_difference"] < 2e-7
        text = resume.describe(finding)
        assert text.startswith("resumed equivalent to rounding: 6 steps; every resume restored the batch")
        assert "from step 4 (rank 0" in text and (resume.REBUILT_DDP in text) == (ranks >= 3), text


def test_resumed_steps_differing_beyond_rounding_in_the_end_are_a_difference_from_their_first_step():
    resumed = _resumed(BASE, 4, final="G", scale=1.001)
    resumed[1]["params"] = "other"  # equal at the first resumed step, then not
    finding = resume.compare([BASE], [[_run(4, final=None)], [resumed]])
    first = finding["first_difference"]
    assert (first["step"], first["cause"], first["attempt"]) == (5, "parameters", 1), finding
    assert "the final state differs by 1.0e-03 (relative), more than rounding (1e-05)" in first["detail"]
    unreadable = _resumed(BASE, 4, params="other")
    unreadable[-1] = {"final": True, "modules": ["G"], "optimizers": ["G"]}  # no values to compare
    assert (
        "cannot be compared"
        in resume.compare([BASE], [[_run(4, final=None)], [unreadable]])["first_difference"]["detail"]
    )


def test_a_difference_in_what_rounding_cannot_change_is_caught_after_the_last_bits_differ():
    for cause, changed in {"samples_replayed": {"batch": ["b0"]}, "learning_rate": {"lr": [0.5]}}.items():
        resumed = _resumed(BASE, 4, params="last bits", final="G", scale=1 + 1e-7)
        resumed[1].update({"params": "other", **changed})
        first = resume.compare([BASE], [[_run(4, final=None)], [resumed]])["first_difference"]
        assert (first["step"], first["cause"]) == (5, cause), (cause, first)


def test_an_rng_differing_where_the_run_resumed_is_the_cause_whatever_the_end():
    rng = {"torch": "t4", "random": "r4", "numpy": "other"}
    beyond = _resumed(BASE, 4, params="other", rng=rng, final="G", scale=1.01)
    first = resume.compare([BASE], [[_run(4, final=None)], [beyond]])["first_difference"]
    assert (first["step"], first["cause"]) == (4, "rng") and "differs (numpy)" in first["detail"], first
    within = _resumed(BASE, 4, params="last bits", rng=rng, final="G", scale=1 + 1e-7)  # numpy drawn from by nothing
    first = resume.compare([BASE], [[_run(4, final=None)], [within]])["first_difference"]
    assert (first["step"], first["cause"]) == (4, "rng"), first  # a state not restored: another run from here
    later = _resumed(BASE, 4, params="last bits", final="G", scale=1 + 1e-7)
    del later[1]["rng"]  # a faulted run records RNG states at an attempt's first step only: no difference to find
    assert resume.compare([BASE], [[_run(4, final=None)], [later]])["equivalent"]


def test_an_optimizer_state_that_differs_after_a_resumed_step_is_rounding_not_a_lost_state():
    resumed = _resumed(BASE, 3, final="G", scale=1 + 1e-8)
    resumed[1]["state"] = "last bits"  # the momentum after step 3 rounded otherwise; the parameters did not
    resumed[2]["params"] = "last bits"  # ... until step 5
    finding = resume.compare([BASE], [[_run(3, final=None)], [resumed]])
    assert finding["equivalent"] and finding["rounding"]["step"] == 5, finding


def test_a_second_restart_from_the_run_s_own_checkpoint_is_laid_on_its_own_step():
    first = _resumed(BASE, 2, params="q3", final=None)[:2]  # steps 2-3, their parameters off in the last bits
    first[1].update({"params": "q4"})
    second = [dict(r) for r in _resumed(BASE, 4, final="G", scale=1 + 1e-7)]
    for r in second[:-1]:
        r["params"] = "q" + r["params"][1:]
    second[0]["before"] = "q4"  # what the first restart checkpointed after step 3
    finding = resume.compare([BASE], [[_run(2, final=None)], [first], [second]])
    assert finding["equivalent"] and finding["rounding"]["step"] == 2, finding
    torn = [dict(r) for r in second[:-1]] + [second[-1]]
    torn[0]["before"] = "torn"
    finding = resume.compare([BASE], [[_run(2, final=None)], [first], [torn]])
    cause = finding["first_difference"]
    assert (cause["step"], cause["cause"], cause["attempt"]) == (4, "resumed_state", 2), finding
    assert "neither run ever had" in cause["detail"]


def test_relative_difference_estimates_the_difference_s_norm_over_the_norm():
    assert resume.relative_difference([[2.0, 1.0, 1.0, 1.0, 1.0], "d"], [[2.0, 1.0, 1.0, 1.0, 1.0], "d"]) == 0.0
    assert resume.relative_difference([[2.0, 1.0, 1.0, 1.0, 1.0]], [[2.0, 1.2, 0.8, 1.2, 0.8]]) == pytest.approx(0.1)
    assert resume.relative_difference([[2.0, 0, 0, 0, 0]], [[2.2, 0, 0, 0, 0]]) == pytest.approx(0.2 / 2.2)
    assert resume.relative_difference([[1.0, 0, 0, 0, 0], "d"], [[1.0, 0, 0, 0, 0], "e"]) == float("inf")
    assert resume.relative_difference([[1.0, 0, 0, 0, 0]], []) == float("inf")


def test_a_resume_from_weights_the_run_never_had_is_named_as_such():
    finding = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, before="torn")]])
    assert finding["first_difference"]["cause"] == "resumed_state"


def test_steps_never_run_and_a_different_final_state_are_differences():
    missing = resume.compare([BASE], [[_run(4, final=None)]])
    assert missing["first_difference"]["cause"] == "missing_step" and missing["first_difference"]["step"] == 4
    final = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, final="G")]])
    assert not final["equivalent"] and final["first_difference"]["cause"] == "final_state"
    assert final["final_identical"] is False


def test_preemption_says_who_handled_saved_and_was_killed_and_the_steps_lost():
    notice = "sent SIGTERM as a scheduler preempting the job does"
    fired = [FiredFault(0, "Preempt(step=3)", r, 3, notice, "preempted") for r in (0, 1)]
    fired.append(FiredFault(0, "Preempt(step=3)", 1, 3, "SIGKILLed", "preempted", "SIGKILL"))
    ranks = [
        RankResult(
            0,
            RankState.FINISHED,
            last_step=3,
            events=[
                {"k": "saved", "t": 0.1, "step": 1},
                {"k": "fault", "t": 0.5, "effect": "preempted"},
                {"k": "saved", "t": 0.6, "step": 3},
            ],
        ),
        RankResult(1, RankState.DIED, exitcode=-9, last_step=4, events=[{"k": "fault", "t": 0.5}]),
        RankResult(2, RankState.DIED, exitcode=-15, last_step=3),
    ]
    fired.append(FiredFault(0, "Preempt(step=3)", 2, 3, notice, "preempted"))
    world = WorldResult(Outcome.CRASHED, ranks, "rank 2 was killed by SIGTERM", 2, "ended", 1.0, fired=fired)
    summary = recovery.preemption(world)
    assert summary == {
        "fault": "Preempt(step=3)",
        "step": 3,
        "notified": [0, 1, 2],
        "handled": [0, 1],
        "saved": [0],
        "killed_after_grace": [1],
        "last_checkpoint_step": 3,
        "steps_lost": 1,
    }
    assert "handled by 0, 1; saved after the notice by 0; SIGKILLed after the grace period: 1" in (
        recovery.describe_preemption(summary)
    )
    assert recovery.preemption(WorldResult(Outcome.COMPLETED, ranks, "", None, "ended", 1.0)) is None


def test_a_save_begun_before_the_notice_is_not_saved_after_it_though_it_ended_after():
    """A periodic checkpoint under way when the notice came (an async save's upload, a save the handler's thread
    outran) is no answer to the notice: a save counts from when it began, its end less ``took``."""
    notice = "sent SIGTERM as a scheduler preempting the job does"
    fired = [FiredFault(0, "Preempt(step=3)", r, 3, notice, "preempted") for r in (0, 1)]
    periodic = {"k": "saved", "t": 0.7, "step": 2, "took": 0.4}  # began at 0.3, before the notice at 0.5
    answer = {"k": "saved", "t": 0.9, "step": 3, "took": 0.3}  # began at 0.6, after it
    ranks = [
        RankResult(
            r, RankState.DIED, exitcode=-9, last_step=3, events=[{"k": "fault", "t": 0.5, "effect": "preempted"}]
        )
        for r in (0, 1)
    ]
    ranks[0].events.append(periodic)
    ranks[1].events.append(answer)
    world = WorldResult(Outcome.CRASHED, ranks, "", None, "ended", 1.0, fired=fired)
    assert recovery.preemption(world)["saved"] == [1]


def test_preemption_under_torchrun_counts_a_rank_that_died_without_an_exit_code_as_not_handling_it():
    """A torchrun judge sees no exit code: a notified rank that died (not by the grace period's SIGKILL) did not
    handle the notice; one that finished did."""
    notice = "sent SIGTERM as a scheduler preempting the job does"
    fired = [FiredFault(0, "Preempt(step=1)", r, 1, notice, "preempted") for r in (0, 1)]
    ranks = [RankResult(0, RankState.FINISHED, last_step=1), RankResult(1, RankState.DIED, last_step=1)]
    world = WorldResult(Outcome.CRASHED, ranks, "rank 1 died", 1, "ended", 1.0, fired=fired, start_method="torchrun")
    summary = recovery.preemption(world)
    assert (summary["notified"], summary["handled"], summary["saved"]) == ([0, 1], [0], [])


def test_the_report_and_the_page_show_each_attempt_the_preemption_and_the_resume_finding():
    from ddpfaults.report.document import build_document
    from ddpfaults.report.html import render_html

    attempts = [
        {
            "attempt": 0,
            "outcome": "crashed",
            "reason": "ended",
            "root_cause": "rank 1 was killed by SIGKILL",
            "root_rank": 1,
            "fired": ["RankKilled(rank=1, step=4) fired on rank 1 at step 4 (on_step)"],
            "steps": [4, 4],
            "seconds": 0.4,
            "preemption": None,
        },
        {
            "attempt": 1,
            "outcome": "completed",
            "reason": "ended",
            "root_cause": "no failure",
            "root_rank": None,
            "fired": [],
            "steps": [5, 5],
            "seconds": 0.2,
            "preemption": None,
        },
    ]
    finding = resume.compare([BASE], [[_run(4, final=None)], [_resumed(BASE, 4, lr=[0.5])]])
    world = WorldResult(
        Outcome.COMPLETED,
        [RankResult(0, RankState.FINISHED)],
        "no failure",
        None,
        "ended",
        0.2,
        world_size=1,
        faults=["RankKilled(rank=1, step=4)"],
        attempts=attempts,
        resume=finding,
    )
    text = world.report()
    assert "attempt 0: crashed in 0.40 s, steps reached [4, 4]; rank 1 was killed by SIGKILL" in text
    assert "resume differs from step 4: the learning rate at step 4 is 0.5 where the uninterrupted run had 0.1" in text
    assert "replay: " in text  # a completed world whose resume differs is worth rerunning
    page = render_html(build_document([world]))
    assert "f-attempt-0" in page and "f-attempt-1" in page and "the learning rate at step 4 is 0.5" in page


def test_a_run_without_faults_that_failed_leaves_nothing_to_compare_with():
    finding = resume.unchecked("crashed", "rank 0 raised KeyError: 'x'")
    assert not finding["equivalent"] and finding["first_difference"]["cause"] == "uninterrupted_failed"
    assert resume.describe(finding) == (
        "resume not checked: the run without faults crashed (rank 0 raised KeyError: 'x'): there is no uninterrupted "
        "run to compare with"
    )


def test_a_difference_before_any_restart_says_the_run_is_not_reproducible():
    killed = _run(4, final=None)
    killed[2] = {**killed[2], "params": "other"}  # attempt 0, which ran as the uninterrupted run did
    first = resume.compare([BASE], [[killed], [_resumed(BASE, 4)]])["first_difference"]
    assert (first["step"], first["cause"], first["attempt"]) == (2, "parameters", 0), first
    assert first["detail"].endswith(
        "before any restart: the run is not reproducible (an unseeded RNG, a "
        "nondeterministic kernel) or a fault changed it"
    )


def test_inputs_transformed_otherwise_from_the_same_batches_drawn_name_the_rng_that_differs():
    base = [dict(r, drawn=[f"d{r['i']}"]) if not r.get("final") else r for r in BASE]
    mine = _resumed(base, 4, batch=["other"], rng={"torch": "t4", "random": "lost", "numpy": "n4"})
    first = resume.compare([base], [[_run(4, final=None)], [mine]])["first_difference"]
    assert (first["step"], first["cause"]) == (4, "rng"), first
    assert "from the same batches drawn, and the RNG state differs (python random)" in first["detail"]


def test_inputs_from_a_batch_drawn_again_are_samples_replayed_though_transformed_otherwise():
    base = [dict(r, drawn=[f"d{r['i']}"]) if not r.get("final") else r for r in BASE]
    mine = _resumed(base, 4, batch=["other"], drawn=["d0"])
    first = resume.compare([base], [[_run(4, final=None)], [mine]])["first_difference"]
    assert (first["step"], first["cause"]) == (4, "samples_replayed"), first


def _file(how: str, path: str) -> dict:
    """A ``file`` event of a record (ddpfaults.rank.files)."""
    return {"k": "file", "how": how, "path": path, "size": 10}


def test_an_uninterrupted_run_that_read_the_faulted_run_s_file_is_refused_not_a_difference():
    killed = _run(4, final=None)
    killed[2]["files"] = [_file("wrote", "/scratch/run1/ckpt.pt")]
    base = [dict(r) for r in BASE]
    base[3]["files"] = [_file("read", "/scratch/run1/ckpt.pt")]
    finding = resume.compare([base], [[killed], [_resumed(BASE, 4)]])
    assert finding["equivalent"] is None and finding["first_difference"]["cause"] == "shared_file"
    assert "rank 0 read /scratch/run1/ckpt.pt, which the faulted run wrote" in finding["first_difference"]["detail"]
    assert "{run_dir}" in finding["first_difference"]["detail"]
    assert resume.describe(finding).startswith("resume not checked: the uninterrupted run's rank 0 read")


def test_an_uninterrupted_run_that_began_from_the_faulted_run_s_checkpoint_is_refused_naming_the_step():
    killed = _run(4, final=None)
    killed[2]["files"] = [_file("wrote", "/scratch/ckpt_000002.pt.tmp"), _file("renamed", "/scratch/ckpt_000002.pt")]
    resumed = _resumed(BASE, 2)
    resumed[0]["files"] = [_file("read", "/scratch/ckpt_000002.pt")]
    resumed[-1]["files"] = [_file("wrote", "/scratch/ckpt_000006.pt")]  # after its last step: 6 steps done
    base = [dict(BASE[0], files=[_file("read", "/scratch/ckpt_000002.pt")]), *BASE[1:]]
    finding = resume.compare([BASE, base], [[killed, killed], [resumed, resumed]])
    detail = finding["first_difference"]["detail"]
    assert finding["equivalent"] is None and finding["first_difference"]["cause"] == "shared_file", finding
    assert detail.startswith(
        "the uninterrupted run began at step 2 from /scratch/ckpt_000002.pt, which the faulted run wrote (rank 1 read "
        "it before its first step)"
    ), detail
    nothing = [dict(_end(), files=[_file("read", "/scratch/ckpt_000006.pt")])]  # it found the end: no step to make
    detail = resume.compare([nothing], [[killed], [resumed]])["first_difference"]["detail"]
    assert detail.startswith("the uninterrupted run began at step 6 from /scratch/ckpt_000006.pt"), detail


def test_a_file_the_uninterrupted_run_wrote_before_reading_it_is_its_own():
    killed = _run(4, final=None)
    killed[2]["files"] = [_file("wrote", "/scratch/ckpt.pt")]
    base = [dict(r) for r in BASE]
    base[1]["files"] = [_file("wrote", "/scratch/ckpt.pt"), _file("read", "/scratch/ckpt.pt")]
    assert resume.compare([base], [[killed], [_resumed(BASE, 4)]])["equivalent"] is True


def test_a_resumed_attempt_is_laid_where_the_checkpoint_it_read_was_written_though_every_step_s_parameters_agree():
    flat = [dict(r, params="p", before="p") if "before" in r else dict(r, params="p") for r in _run(8, final=None)]
    flat.append(_end())  # zero gradients: the parameters never move, so they place no attempt
    killed = [dict(r) for r in flat[:5]]
    killed[4]["files"] = [_file("wrote", "/run/snapshot.pt")]  # saved after step 3: four steps done
    replayed = [dict(r) for r in flat[:4]] + [_end()]  # it resumed at the saved epoch's first step: 0 again
    replayed[0]["files"] = [_file("read", "/run/snapshot.pt")]
    finding = resume.compare([flat], [[killed], [replayed]])
    first = finding["first_difference"]
    assert finding["final_identical"] and (first["step"], first["cause"]) == (4, "samples_replayed"), finding
    assert "rank 0 consumed at step 4 the batch the uninterrupted run consumed at step 0" in first["detail"]
    right = [dict(r) for r in flat[4:]]
    right[0].update(before="p", files=[_file("read", "/run/snapshot.pt")])
    assert resume.compare([flat], [[killed], [right]])["bit_equal"]


def test_a_check_that_could_not_run_is_neither_equivalent_nor_different():
    for finding in (resume.not_resumed("completed"), resume.unchecked("crashed", "rank 1 raised")):
        assert finding["equivalent"] is None and finding["first_difference"]["cause"] in resume.UNCHECKED
        assert resume.describe(finding).startswith("resume not checked: ")


def test_a_rank_s_file_lines_count_only_after_its_last_step_record_and_a_line_cut_by_a_kill_ends_them(tmp_path):
    """A rank writes each file event as a line of its own, then again in its next step's record: ``read`` keeps the
    step records, and the file lines after the last of them (a rank killed before its next step) as a record of
    their own, up to a line the kill cut short."""
    import json

    from ddpfaults import jobfiles

    def file_line(path):
        return f"{jobfiles.RESUME_FILE_LINE}{json.dumps({'how': 'wrote', 'path': path})}}}\n"

    steps = [{"i": 0, "params": "a", "files": [{"how": "wrote", "path": "/c/0"}]}, {"i": 1, "params": "b"}]
    lines = [file_line("/c/0"), json.dumps(steps[0]) + "\n", json.dumps(steps[1]) + "\n"]
    (tmp_path / "rank0.resume").write_text(
        "".join([*lines, file_line("/c/1"), file_line("/c/2"), file_line("/c/3")[:20]])
    )
    (tmp_path / "rank1.resume").write_text("".join(lines))
    ranks = resume.read(str(tmp_path), 3)
    assert ranks[0] == [*steps, {"files": [{"how": "wrote", "path": "/c/1"}, {"how": "wrote", "path": "/c/2"}]}]
    assert ranks[1] == steps
    assert ranks[2] == []
