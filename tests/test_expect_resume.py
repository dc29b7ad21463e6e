"""``--expect`` / ``Expect`` text naming the resume check's finding, and the command line's exit code with
``--check-resume`` (classification only: the worlds behind it are in tests/engine/test_restarts.py)."""

import pytest

from ddpfaults import Expect
from ddpfaults.errors import ScenarioError
from ddpfaults.judge.checks import resume


@pytest.mark.parametrize(
    ("text", "outcome", "fields"),
    [
        ("resumed equivalent", "completed", (True, None, None)),
        ("completed; resumed equivalent", "completed", (True, None, None)),
        ("resume differs", "completed", (False, None, None)),
        ("completed, resume differs from step 5: samples_replayed", "completed", (False, "samples_replayed", 5)),
        ("crashed resume differs: rng", "crashed", (False, "rng", None)),
        ("resume not checked: shared_file", "completed", (None, "shared_file", None)),
    ],
)
def test_an_expectation_s_text_names_the_resume_finding(text, outcome, fields):
    expect = Expect.parse(text)
    assert str(expect.outcome) == outcome
    assert (expect.resume_equivalent, expect.resume_cause, expect.resume_step) == fields
    assert expect.checks_resume


def test_a_resume_word_the_grammar_lacks_is_refused_naming_the_resume_forms():
    with pytest.raises(ScenarioError, match="'resumed equivalent', 'resume differs"):
        Expect.parse("resumed maybe")
    with pytest.raises(ScenarioError, match="resume_cause must be one of"):
        Expect.parse("resume differs: no_such_cause")


class _Result:
    """What the expectation reads of a world: its outcome, its resume finding."""

    def __init__(self, finding):
        from ddpfaults.judge.results import Outcome

        self.outcome, self.resume = Outcome.COMPLETED, finding


def _mismatches(text, finding):
    from ddpfaults.expect import _resume_mismatches

    return _resume_mismatches(Expect.parse(text), _Result(finding))


DIFFERS = {
    "equivalent": False,
    "first_difference": {"step": 4, "cause": "samples_replayed", "ranks": [0], "detail": "d", "attempt": 1},
    "steps": 8,
    "rounding": None,
    "bit_equal": False,
    "final_identical": False,
}


def test_resumed_equivalent_fails_on_a_resume_that_differs_or_was_not_checked():
    assert _mismatches("resumed equivalent", DIFFERS)
    assert _mismatches("resumed equivalent", resume.not_resumed("completed"))
    assert not _mismatches("resume differs from step 4: samples_replayed", DIFFERS)
    assert not _mismatches("resume not checked: not_resumed", resume.not_resumed("completed"))
    assert _mismatches("resume differs", resume.not_resumed("completed"))
