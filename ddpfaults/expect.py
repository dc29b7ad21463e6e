"""What a world must do: :class:`Expect` (outcome, root-cause rank, error, collective, checks), the
:class:`Mismatch` es found against a result, and named :class:`Check` predicates. Pure: no torch, no processes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpfaults.errors import ExpectationFailed, FaultNeverFired, ScenarioError
from ddpfaults.judge.results import Outcome, WorldResult

_OUTCOMES = ", ".join(repr(o.value) for o in Outcome)  # for messages: 'completed', 'hung', 'crashed', 'timed out'
_EXPECT_TEXT = re.compile(
    r"^(?P<outcome>" + "|".join(re.escape(o.value) for o in Outcome) + ")"
    r"(?: with (?P<error>[\w.]+))?"
    r"(?: on rank (?P<rank>\d+))?"
    r"(?: in (?P<collective>[\w.]+))?$"
)
#: the resume check's finding at the end of an expectation's text: ``resumed equivalent``, ``resume differs``,
#: ``resume differs from step N``, ``resume differs: CAUSE``, ``resume not checked: CAUSE``
_RESUME_TEXT = re.compile(
    r"(?:^|[;,]?\s+)(?P<resume>resumed equivalent|resume (?P<how>differs|not checked)"
    r"(?: from step (?P<step>\d+))?(?::? (?P<cause>[a-z_]+))?)$"
)


@dataclass(frozen=True)
class Expect:
    """What a world must do: an outcome (``completed``, ``hung``, ``crashed`` or ``timed out``: the hard timeout came
    while its ranks were still making progress), and optionally the root-cause rank, its error type,
    the collective at fault, a root-cause substring, bit-equal replicas across ranks (``values_equal``: the ranks'
    return values, or, where no rank returned one, as in a script world, the final state of every module they
    wrapped in DDP or FSDP; with nothing to compare it fails, saying so), and
    ``checks``: named predicates over the result (see :class:`Check`) for what a verdict alone
    cannot tell (a completed run that violates an invariant, what survivors of a crash kept).

    ``faults_fire`` (default True): every fault of the plan must fire at least once — a fault
    that never fires means the scenario tests nothing, which is reported as a failure. Beside an outcome that
    differs, a fault no rank it targets lived to reach (they hung, raised or died first) is not listed: the world
    never came to its moment, and the outcome says why.

    ``resume_equivalent``, ``resume_cause``, ``resume_step``: the resume check's finding (an expectation naming one
    turns ``check_resume`` on): the restarted run equivalent to the uninterrupted one, bit-equal or to rounding
    (True), or not; the cause of its first difference (one of :data:`ddpfaults.judge.checks.resume.CAUSES`; implies not
    equivalent) and its step.
    """

    outcome: Outcome
    rank: int | None = None
    error: str | None = None
    collective: str | None = None
    root_cause: str | None = None
    values_equal: bool = False
    faults_fire: bool = True
    checks: tuple = ()
    resume_equivalent: bool | None = None
    resume_cause: str | None = None
    resume_step: int | None = None

    def __post_init__(self):
        try:
            object.__setattr__(self, "outcome", Outcome(self.outcome))
        except ValueError:
            raise ScenarioError(f"expect: outcome must be one of {_OUTCOMES}, got {self.outcome!r}") from None
        if self.rank is not None and (not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0):
            raise ScenarioError(f"expect: rank must be an int >= 0 (the root-cause rank), got {self.rank!r}")
        for name in ("error", "collective", "root_cause"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ScenarioError(f"expect: {name} must be a non-empty string, got {value!r}")
        for name in ("values_equal", "faults_fire"):
            if not isinstance(getattr(self, name), bool):
                raise ScenarioError(f"expect: {name} must be True or False, got {getattr(self, name)!r}")
        if self.values_equal and self.outcome != Outcome.COMPLETED:
            raise ScenarioError(
                f"expect: values_equal compares the ranks of a world that completed; a world expected to be "
                f"{self.outcome} leaves no replicas to compare (drop values_equal, or compare what survivors kept "
                f"with a Check)"
            )
        _check_resume_fields(self)
        if isinstance(self.checks, (str, bytes)) or not isinstance(self.checks, (list, tuple)):
            raise ScenarioError(f"expect: checks must be a list of ddpfaults.Check, got {self.checks!r}")
        for check in self.checks:
            if not callable(check):
                raise ScenarioError(f"expect: each check must be a ddpfaults.Check (or a callable), got {check!r}")
        object.__setattr__(self, "checks", tuple(self.checks))

    @classmethod
    def parse(cls, value) -> Expect:
        """An Expect from an Expect, an outcome, or text such as ``"crashed with KeyError on rank 0"``."""
        if isinstance(value, Expect):
            return value
        if isinstance(value, Outcome):
            return cls(value)
        if isinstance(value, str):
            text, resume = value.strip(), {}
            found = _RESUME_TEXT.search(text)
            if found:
                text, resume = text[: found.start()].strip() or "completed", _resume_of(found.groupdict())
            match = _EXPECT_TEXT.match(text)
            if not match:
                raise ScenarioError(
                    f"expect {value!r}: write one of {_OUTCOMES}, optionally followed by "
                    f"'with ErrorType', 'on rank N', 'in collective' (e.g. 'crashed with KeyError on rank 0'), "
                    f"and by the resume check's finding: 'resumed equivalent', 'resume differs [from step N][: "
                    f"CAUSE]' or 'resume not checked[: CAUSE]' (alone, the outcome is completed)"
                )
            parts = match.groupdict()
            rank = int(parts["rank"]) if parts["rank"] is not None else None
            return cls(parts["outcome"], rank=rank, error=parts["error"], collective=parts["collective"], **resume)
        raise ScenarioError(f"expect must be a string or ddpfaults.Expect, got {value!r}")

    def describe(self) -> str:
        """The expectation in the string form ``parse`` accepts (plus flags)."""
        text = str(self.outcome)
        if self.error:
            text += f" with {self.error}"
        if self.rank is not None:
            text += f" on rank {self.rank}"
        if self.collective:
            text += f" in {self.collective}"
        if self.root_cause:
            text += f" (root cause mentions {self.root_cause!r})"
        if self.values_equal:
            text += " (replicas bit-equal)"
        if self.resume_equivalent:
            text += " (resumed equivalent)"
        if self.resume_cause or self.resume_step is not None:
            at = f" from step {self.resume_step}" if self.resume_step is not None else ""
            text += f" (resume differs{at}{': ' + self.resume_cause if self.resume_cause else ''})"
        return "; ".join([text, *(check_name(c) for c in self.checks)])

    def to_dict(self) -> dict:
        """A JSON-ready dict of the expectation (``checks`` as their descriptions); see docs/report-schema.md."""
        return {
            "outcome": str(self.outcome),
            "rank": self.rank,
            "error": self.error,
            "collective": self.collective,
            "root_cause": self.root_cause,
            "values_equal": self.values_equal,
            "faults_fire": self.faults_fire,
            "checks": [check_name(c) for c in self.checks],
            **({"resume": self.resume_wanted} if self.checks_resume else {}),
        }

    @property
    def checks_resume(self) -> bool:
        """True if this expectation says anything of the resume check (the world must run with ``check_resume``)."""
        return self.resume_equivalent is not None or self.resume_cause is not None or self.resume_step is not None

    @property
    def resume_wanted(self) -> dict:
        """What the resume check must find, as data."""
        return {"equivalent": self.resume_equivalent, "cause": self.resume_cause, "step": self.resume_step}

    def mismatches(self, result: WorldResult) -> list[Mismatch]:
        """Every way ``result`` differs from this expectation (empty list: it matched)."""
        found = []
        if result.outcome != self.outcome:
            why = f": {result.root_cause}" if result.outcome == Outcome.TIMED_OUT else ""  # what to do about it
            found.append(
                Mismatch(
                    "outcome",
                    f"expected {self.outcome}, observed {result.outcome}{why}",
                    str(self.outcome),
                    str(result.outcome),
                )
            )
        if self.rank is not None and result.root_rank != self.rank:
            found.append(
                Mismatch(
                    "rank",
                    f"expected the root cause on rank {self.rank}, observed rank {result.root_rank}",
                    self.rank,
                    result.root_rank,
                )
            )
        root = result.ranks[result.root_rank] if result.root_rank is not None else None
        if self.error is not None:
            error = (root.error or "") if root is not None else ""
            if not (error.startswith(self.error) or f"{self.error}:" in error or self.error in result.root_cause):
                observed = error or result.root_cause
                found.append(
                    Mismatch("error", f"expected error {self.error}, observed {observed!r}", self.error, observed)
                )
        if self.collective is not None:
            ops = result.divergence.ops() if result.divergence is not None else set()
            ops |= {c.op for c in (root.collectives if root is not None else []) if not c.done}
            if self.collective not in ops:
                found.append(
                    Mismatch(
                        "collective",
                        f"expected the collective {self.collective} at fault, observed "
                        f"{sorted(ops) or 'none'} ({result.root_cause})",
                        self.collective,
                        tuple(sorted(ops)),
                    )
                )
        if self.root_cause is not None and self.root_cause not in result.root_cause:
            found.append(
                Mismatch(
                    "root_cause",
                    f"expected the root cause to mention {self.root_cause!r}, observed {result.root_cause!r}",
                    self.root_cause,
                    result.root_cause,
                )
            )
        if self.values_equal and result.outcome == Outcome.COMPLETED:
            found += replica_mismatches(result)
        if self.faults_fire:
            fired = {f.index for f in result.fired}
            if any(m.kind == "outcome" for m in found):  # a fault whose moment never came is not news beside it
                fired |= {u.index for u in result.unfired if not u.had_chance}
            hints = {u.index: f": {u.hint}" for u in result.unfired if u.hint}
            found += [
                Mismatch(
                    "fault_never_fired",
                    f"FaultNeverFired: {fault} never fired — the scenario does not exercise it{hints.get(i, '')}",
                    fault,
                    "never fired",
                )
                for i, fault in enumerate(result.faults)
                if i not in fired
            ]
        found += _resume_mismatches(self, result)
        for check in self.checks:
            problem = check(result)
            if problem:
                name = check_name(check)
                found.append(Mismatch("check", f"check {name!r} failed: {problem}", name, str(problem)))
        return found

    def verify(self, result: WorldResult) -> None:
        """Raise :class:`~ddpfaults.errors.FaultNeverFired` if the only problem is a fault that never fired,
        :class:`~ddpfaults.errors.ExpectationFailed` for any other mismatch; return if ``result`` matched."""
        found = self.mismatches(result)
        if found:
            kind = FaultNeverFired if all(m.kind == "fault_never_fired" for m in found) else ExpectationFailed
            raise kind(found, result)


def replica_mismatches(result: WorldResult) -> list[Mismatch]:
    """How the ranks' replicas differ (``values_equal``): their return values if any rank returned one, else the
    digests of the modules they wrapped (:mod:`ddpfaults.rank.wrapped`); a mismatch saying why when there is nothing
    to compare (empty: equal)."""
    if any(value is not None for value in result.values):
        if len(set(map(repr, result.values))) == 1:
            return []
        text = f"expected every rank to return the same value, observed {result.values!r}"
        return [Mismatch("values", text, "equal", tuple(map(repr, result.values)))]
    wrapped = [rank.wrapped for rank in result.ranks]
    counts = [len(w) for w in wrapped]
    if len(set(counts)) != 1:
        text = f"the ranks wrapped different numbers of modules in DDP/FSDP: {counts} (rank by rank)"
        return [Mismatch("values", text, "equal", tuple(map(str, counts)))]
    compared = [i for i, entry in enumerate(wrapped[0]) if not entry["sharded"]]
    if not compared:
        why = (
            "every module it wrapped is sharded by FSDP (each rank holds a part of its state)"
            if counts[0]
            else "no rank returned a value and none wrapped a module in DDP or FSDP"
        )
        text = (
            f"values_equal compared nothing: {why}; a rank function can return what its replicas must agree on "
            f"(e.g. a digest of its model)"
        )
        return [Mismatch("values", text, "equal", "nothing compared")]
    found = []
    for i in compared:
        digests = [w[i]["digest"] for w in wrapped]
        if len(set(digests)) != 1:
            entry = wrapped[0][i]
            ranks = ", ".join(f"rank {r} {d[:12]}" for r, d in enumerate(digests))
            text = (
                f"replicas differ: module #{i} ({entry['type']}, wrapped in {entry['kind'].upper()} at "
                f"{entry['site']}) ends with a different state per rank: {ranks}"
            )
            found.append(Mismatch("values", text, "equal", tuple(digests)))
    return found


def _resume_of(parts: dict) -> dict:
    """The resume fields of an expectation's text (see :data:`_RESUME_TEXT`)."""
    from ddpfaults.judge.checks.resume import UNCHECKED

    if parts["resume"] == "resumed equivalent":
        return {"resume_equivalent": True}
    step = int(parts["step"]) if parts["step"] is not None else None
    if parts["how"] == "not checked":
        if parts["cause"] not in UNCHECKED:
            raise ScenarioError(f"expect: 'resume not checked: CAUSE' takes one of {', '.join(UNCHECKED)}")
        return {"resume_cause": parts["cause"]}
    return {"resume_equivalent": False, "resume_cause": parts["cause"], "resume_step": step}


def _check_resume_fields(expect: Expect) -> None:
    from ddpfaults.judge.checks.resume import CAUSES

    if expect.resume_equivalent is not None and not isinstance(expect.resume_equivalent, bool):
        raise ScenarioError(f"expect: resume_equivalent must be True, False or None, got {expect.resume_equivalent!r}")
    if expect.resume_cause is not None and expect.resume_cause not in CAUSES:
        raise ScenarioError(f"expect: resume_cause must be one of {', '.join(CAUSES)}, got {expect.resume_cause!r}")
    step = expect.resume_step
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ScenarioError(f"expect: resume_step must be an int >= 0, got {step!r}")
    if expect.resume_equivalent and (expect.resume_cause or step is not None):
        raise ScenarioError(
            "expect: resume_equivalent=True cannot go with a resume_cause or resume_step (a difference)"
        )


def _resume_mismatches(expect: Expect, result: WorldResult) -> list[Mismatch]:
    from ddpfaults.judge.checks.resume import UNCHECKED

    if not expect.checks_resume:
        return []
    finding = result.resume
    if finding is None:
        return [Mismatch("resume", "expected a resume check, but the world ran without check_resume", "checked", None)]
    first = finding["first_difference"] or {}
    observed = {"equivalent": finding["equivalent"], "cause": first.get("cause"), "step": first.get("step")}
    wanted = {k: v for k, v in expect.resume_wanted.items() if v is not None}
    if expect.resume_cause or expect.resume_step is not None:
        wanted["equivalent"] = None if expect.resume_cause in UNCHECKED else False
    if all(observed[k] == v for k, v in wanted.items()):
        return []
    from ddpfaults.judge.checks.resume import describe

    return [
        Mismatch(
            "resume", f"expected the resume check to find {wanted}, observed {describe(finding)}", wanted, observed
        )
    ]


def require_faults_fired(result: WorldResult, *, allow: str = "pass require_faults_fire=False") -> None:
    """Raise :class:`~ddpfaults.errors.FaultNeverFired` (carrying ``result``) if a fault of its plan never fired
    although a rank it targets finished its function (:attr:`~ddpfaults.judge.results.UnfiredFault.had_chance`).

    A fault whose ranks all raised, died or stalled first is not an error here: its moment may never have
    come. (A scenario's ``Expect(faults_fire=True)`` is stricter: every fault must fire.) ``allow`` names the
    opt-out in the message."""
    missed = unfired_mismatches(result, allow=allow)
    if missed:
        raise FaultNeverFired(missed, result)


def unfired_mismatches(result: WorldResult, *, allow: str = "pass require_faults_fire=False") -> list[Mismatch]:
    """The faults :func:`require_faults_fired` refuses, as mismatches (empty: none)."""
    return [
        Mismatch(
            "fault_never_fired",
            f"FaultNeverFired: {u.describe()}: the plan does not exercise it (world {result.outcome}; "
            f"{allow} if that is expected)",
        )
        for u in result.unfired
        if u.had_chance
    ]


@dataclass(frozen=True)
class Mismatch:
    """One way a world differed from its expectation: what differed (``outcome``, ``rank``, ``error``,
    ``collective``, ``root_cause``, ``values``, ``fault_never_fired``, ``check``), how, in words, and the
    expected and observed values (JSON-ready: the outcomes, the ranks, the error types, the ops...)."""

    kind: str
    text: str
    expected: object = None
    observed: object = None

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict:
        """``{"kind", "text", "expected", "observed"}`` (tuples as lists)."""
        return {
            "kind": self.kind,
            "text": self.text,
            "expected": list(self.expected) if isinstance(self.expected, tuple) else self.expected,
            "observed": list(self.observed) if isinstance(self.observed, tuple) else self.observed,
        }


@dataclass(frozen=True)
class Expectation:
    """An :class:`Expect` held against one world: every :class:`Mismatch` found (none: it held)."""

    expect: Expect
    mismatches: tuple = ()

    @classmethod
    def of(cls, expect: Expect, result: WorldResult) -> Expectation:
        """``expect`` checked against ``result``."""
        return cls(expect, tuple(expect.mismatches(result)))

    @property
    def held(self) -> bool:
        """True if the world did what was expected."""
        return not self.mismatches

    def to_dict(self) -> dict:
        """The report document's ``expectation`` object: ``expect`` (:meth:`Expect.to_dict`), ``text`` (its
        :meth:`Expect.describe`), ``held`` and ``mismatches`` (:meth:`Mismatch.to_dict` each)."""
        return {
            "expect": self.expect.to_dict(),
            "text": self.expect.describe(),
            "held": self.held,
            "mismatches": [m.to_dict() for m in self.mismatches],
        }


def check_name(check) -> str:
    """How a check is named in texts: its ``description``, else its repr."""
    return getattr(check, "description", repr(check))


@dataclass(frozen=True)
class Check:
    """A named predicate for ``Expect(checks=...)``: ``fn(result)`` returns a problem (text) or None."""

    description: str
    fn: object

    def __call__(self, result) -> str | None:
        try:
            return self.fn(result)
        except Exception as exc:  # a malformed result is a mismatch, not a harness crash
            return f"{type(exc).__name__}: {exc}"
