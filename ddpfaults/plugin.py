"""pytest plugin entry point (``pytest -p ddpfaults``). Thin glue over the library core.

* collects scenario modules (``scenario_*.py``, ini ``ddpfaults_scenario_files``): one item per
  scenario, or per variant (``name[variant]``); an item fails when its world does not do what
  the scenario expects, with the world's report and a replay command;
* the ``ddp_world`` fixture runs worlds imperatively (rank functions and scripts), with this run's settings and the
  marker; every world a test runs, through the fixture or not, is recorded for the reports;
* the ``ddpfaults(...)`` marker, options and ini keys (see :mod:`ddpfaults.settings`);
* CI output: JUnit properties per item, a terminal summary, ``--ddpfaults-report=PATH.json``.

Results travel to the xdist controller as an attribute of the test reports (``ddpfaults_worlds``),
so the summary and the JSON report (``docs/report-schema.md``) hold every world of every worker. The engine is imported
lazily: this module is loaded on every pytest start.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import re
import shlex
import sys
import time

import pytest

from ddpfaults import settings as ddps
from ddpfaults.errors import MarkerError, OrphanRanks, ScenarioMismatch

SETTINGS = pytest.StashKey[ddps.Settings]()  # the resolved settings of this run
_TIMER_FIRES = pytest.StashKey[float]()  # monotonic time at which pytest-timeout's armed timer will fire
_WORLDS = pytest.StashKey[list]()  # item: world records not yet attached to a report
_SEEN = pytest.StashKey[list]()  # item: every world judged while it ran (the engine's watchers)
_RECORDED = pytest.StashKey[set]()  # item: ids of the worlds already recorded (with their expectation)


# -- configuration ----------------------------------------------------------------------------


def pytest_addoption(parser):
    """Options and ini keys, one ``ddpfaults`` group."""
    ddps.add_options(parser)


def pytest_configure(config):
    """Register the marker and resolve the settings once (a bad value is a usage error)."""
    config.addinivalue_line("markers", ddps.MARKER_LINE)
    config.stash[SETTINGS] = ddps.resolve(config)
    if not hasattr(config, "workerinput"):  # xdist workers send their worlds to the controller in reports
        config.pluginmanager.register(_Collector(config), "ddpfaults-collector")


def pytest_report_header(config):
    """One header line with the effective defaults."""
    return config.stash[SETTINGS].header()


# -- collection of scenario modules ----------------------------------------------------------


def pytest_collect_file(file_path, parent):
    """Collect files matching the scenario patterns as :class:`ScenarioModule`."""
    patterns = parent.config.stash[SETTINGS].scenario_files
    if any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return ScenarioModule.from_parent(parent, path=file_path)
    return None


class ScenarioModule(pytest.Module):
    """A scenario module: imported the way pytest imports test modules, one item per case."""

    def collect(self):
        """One :class:`ScenarioItem` per case; a case invalid for its world size is a collection error."""
        from ddpfaults.scenario import scenarios_in

        module = self.obj
        for declared in scenarios_in(module):
            for case in declared.cases():
                item = ScenarioItem.from_parent(self, name=case.id, case=case)
                for mark in _marks_of(declared.fn):
                    item.add_marker(mark)
                case.resolve(_spec(item))  # a marker, settings or faults that do not fit the world: an error here
                yield item

    def repr_failure(self, excinfo):
        """A ddpfaults error while importing or checking the module: one line naming the file."""
        from ddpfaults.errors import DDPFaultsError

        if isinstance(excinfo.value, DDPFaultsError):
            return f"{self.path}: {type(excinfo.value).__name__}: {excinfo.value}"
        return super().repr_failure(excinfo)


def _marks_of(fn) -> list:
    """The pytest marks a scenario function carries, as decorators ``add_marker`` takes (it refuses a bare Mark)."""
    marks = getattr(fn, "pytestmark", [])
    marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    return [getattr(pytest.mark, m.name).with_args(*m.args, **m.kwargs) for m in marks]


class ScenarioItem(pytest.Item):
    """One scenario case: run its world, compare with its expectation."""

    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        """Run the case with this run's settings and marker, capped to fit pytest-timeout."""
        result = self.case.run(
            _spec(self), fit=lambda spec: ddps.fit(spec, _remaining(self)), flight_recorder_dir=_flight_dir(self)
        )
        try:
            _check(self, result, self.case.expect)
        finally:
            _reap([result])

    def repr_failure(self, excinfo, style=None):
        """The mismatch and the world's report, or a one-line ddpfaults error; never plugin frames."""
        from ddpfaults.errors import DDPFaultsError

        if isinstance(excinfo.value, ScenarioMismatch):
            return str(excinfo.value)
        if isinstance(excinfo.value, DDPFaultsError):
            return f"ddpfaults: {type(excinfo.value).__name__}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        """Location of the scenario function, and the case id."""
        code = getattr(self.case.scenario.fn, "__code__", None)
        return self.path, (code.co_firstlineno - 1) if code else None, f"scenario {self.case.id}"


# -- running worlds: settings, marker, pytest-timeout, recording --------------------------------


def _spec(node):
    """This node's run spec: the settings overlaid by its ``ddpfaults`` markers (MarkerError naming the node)."""
    marks = ddps.marker_values(node.iter_markers("ddpfaults"), node.nodeid)
    return ddps.run_spec(node.config.stash[SETTINGS], marks, node.nodeid)


def _remaining(item) -> float | None:
    """Seconds until pytest-timeout's timer fires on ``item`` (None: no timer is armed)."""
    fires = item.stash.get(_TIMER_FIRES, None)
    return None if fires is None else fires - time.monotonic()


def _flight_dir(item, index: int = 0) -> str | None:
    """Where ``item``'s world number ``index`` keeps its flight-recorder dumps (None: not asked for): a folder
    named by the test id under ``--ddpfaults-flight-recorder``."""
    root = item.config.stash[SETTINGS].flight_recorder
    if root is None:
        return None
    name = re.sub(r"[^\w.\-\[\]]+", "_", item.nodeid).strip("_") + (f"-{index + 1}" if index else "")
    return os.path.join(str(item.config.invocation_params.dir), root, name)


def _replay(item, result) -> str:
    """``pytest -p ddpfaults 'path::id' --ddpfaults-seed=N`` (the world's pinning settings, as it ran) plus every
    other run option given on the command line or in the environment."""
    from ddpfaults.replay import PYTEST_OPTION, replay_line
    from ddpfaults.spec import PYTEST, settable

    path = os.path.relpath(item.path, item.config.invocation_params.dir)
    node = path + item.nodeid[item.nodeid.index("::") :] if "::" in item.nodeid else path
    settings = item.config.stash[SETTINGS]
    given = {p.name: getattr(result.spec, p.name) for p in settable(PYTEST) if p.pins}
    given.update({p.name: getattr(settings.spec, p.name) for p in settable(PYTEST) if settings.given(p.name)})
    return replay_line(["pytest -p ddpfaults", shlex.quote(node)], given, style=PYTEST_OPTION)


def _check(item, result, expect, *, require_fired: bool = False):
    """Record ``result`` for ``item`` and return it as recorded (with its pytest replay line); raise
    :class:`ScenarioMismatch` if it does not meet ``expect`` (or, with none and ``require_fired``, if a fault never
    fired though a rank it targets finished)."""
    from ddpfaults.expect import Expectation, unfired_mismatches

    expectation = Expectation.of(expect, result) if expect is not None else None
    mismatches = [str(m) for m in expectation.mismatches] if expectation is not None else []
    if expectation is None and require_fired:
        mismatches = [str(m) for m in unfired_mismatches(result)]
    result = _record(item, result, expectation)
    if mismatches:
        head, _ = _report(result)
        expected = [f"expected: {expect.describe()}"] if expect is not None else []
        raise ScenarioMismatch("\n".join([*mismatches, *expected, "", head]))
    return result


def _record(item, result, expectation=None):
    """Keep ``result`` (with its ``expectation``, if any) for ``item``'s report, JSON report and JUnit properties;
    return it as kept: a new result, the same but for its replay line (pytest's)."""
    item.stash.setdefault(_RECORDED, set()).add(id(result))
    result = dataclasses.replace(result, replay=_replay(item, result))
    record = {
        "nodeid": item.nodeid,
        "expectation": expectation.to_dict() if expectation is not None else None,
        "result": result.to_dict(),
    }
    item.stash.setdefault(_WORLDS, []).append(record)
    item.user_properties += [("ddpfaults.verdict", str(result.outcome)), ("ddpfaults.world_size", result.world_size)]
    item.user_properties += [("ddpfaults.seed", result.seed), ("ddpfaults.seconds", f"{result.elapsed:.2f}")]
    if expectation is not None:
        item.user_properties.append(("ddpfaults.expect", expectation.expect.describe()))
    return result


def _report(result) -> tuple[str, list[tuple[str, str]]]:
    """The world's report as (first screen, with the replay line; [(section title, text)]), the titles as
    :func:`~ddpfaults.report.text.render_world` heads them (``--- TITLE ---``)."""
    from ddpfaults.report.text import report_parts

    head, sections = report_parts(result)
    if result.replay and result.replay not in head:
        head += f"\nreplay: {result.replay}"
    return head, [(title, text.rstrip()) for title, text in sections]


class DDPWorld:
    """The ``ddp_world`` fixture: run worlds with this test's settings and marker, recorded for the reports."""

    def __init__(self, item):
        self._item = item
        self.results: list = []

    def run(self, fn, *, world_size=None, faults=(), expect=None, **kwargs):
        """``run_world(fn, ...)`` with defaults from the settings and the marker; returns the WorldResult.

        Explicit keywords (timeout, stall, seed, peer_failure, start_method, args, kwargs, ...) win over defaults,
        except a seed pinned by ``--ddpfaults-seed``. With ``expect`` (``"hung"``, ``"crashed with KeyError on rank
        0"``, an Expect) a mismatch fails the test with the world's report; so does, without one, a fault that never
        fired though a rank it targets finished (``require_faults_fire=False`` allows it). The ranks run ``fn`` in
        this process's working directory unless ``cwd`` names one. A script is run with :meth:`run_script`."""
        __tracebackhide__ = True
        from ddpfaults.engine.launcher import FunctionTarget
        from ddpfaults.errors import FunctionNotRunnable

        if isinstance(fn, (str, os.PathLike)):
            raise FunctionNotRunnable(
                f"ddp_world.run runs a rank function; {os.fspath(fn)!r} is a path: run a script with "
                f"ddp_world.run_script({os.fspath(fn)!r}, argv, world_size=..., faults=[...])"
            )
        target = {name: kwargs.pop(name) for name in ("args", "kwargs", "cwd") if name in kwargs}
        return self._run(functools.partial(FunctionTarget.of, fn, **target), world_size, faults, expect, kwargs)

    def run_script(self, path=None, argv=(), *, world_size=None, faults=(), expect=None, cwd=None, **kwargs):
        """``run_script(path, argv, ...)`` with the settings and the marker, as :meth:`run` runs a function; returns
        the WorldResult. A relative ``path`` is relative to the test module's folder (``module=`` runs a module as
        ``python -m`` would instead). Each world runs in a fresh, empty working directory (removed after it) unless
        ``cwd`` names one; the script's own folder is importable either way (docs/scripts.md). Other keywords as
        :func:`ddpfaults.run_script` (``step_clock``...)."""
        __tracebackhide__ = True
        from ddpfaults.engine.scripts import ScriptRun, world_directory

        if path is not None and isinstance(path, (str, os.PathLike)):
            path = os.path.join(os.path.dirname(str(self._item.path)), os.fspath(path))
        target = {name: kwargs.pop(name) for name in ("module", "step_clock") if name in kwargs}
        with world_directory(cwd) as directory:
            run = functools.partial(ScriptRun.of, path, argv, cwd=directory, **target)
            return self._run(run, world_size, faults, expect, kwargs)

    def _run(self, target, world_size, faults, expect, kwargs):
        """One world of this test: ``target()`` (the validated target) run with the settings, the marker and the
        keywords in one request (:class:`~ddpfaults.engine.world.WorldRequest`), checked against ``expect``."""
        __tracebackhide__ = True
        from ddpfaults.engine import world
        from ddpfaults.errors import DeadlineError
        from ddpfaults.expect import Expect
        from ddpfaults.spec import PARAM

        settings = self._item.config.stash[SETTINGS]
        require_fired = kwargs.pop("require_faults_fire", True)
        declared = {name: kwargs.pop(name) for name in list(kwargs) if name in PARAM}
        spec = _spec(self._item).replace(world_size=world_size, **declared).replace(**settings.pinned)
        expect = Expect.parse(expect) if expect is not None else None
        if expect is not None and expect.checks_resume:  # an expected finding needs the check, as a scenario's does
            spec = spec.replace(check_resume=True)
        try:
            spec = ddps.fit(spec, _remaining(self._item))
            kwargs.setdefault("flight_recorder_dir", _flight_dir(self._item, len(self.results)))
            request = world.WorldRequest.of(target(), faults, spec, require_faults_fire=False, **kwargs)
            result = world.run(request)
            self.results.append(result)
            result = _check(self._item, result, expect, require_fired=require_fired)
        except (ScenarioMismatch, DeadlineError) as exc:
            failure = str(exc)
        else:
            return result
        pytest.fail(failure, pytrace=False)  # outside the except block: no chained traceback


def _reap(results) -> None:
    """Orphan census of finished worlds: SIGKILL whatever is left of their ranks (see ``census.survivors``: their
    process groups, what is below them, the fork server's orphans; except ranks the engine keeps warm in its pool
    on purpose), and say so."""
    from ddpfaults.engine import census
    from ddpfaults.proc import tree

    warm = census.POOLED
    left = census.survivors([r.pid for world in results for r in world.ranks if r.pid and r.pid not in warm])
    tree.kill(pid for pid, _ in left)
    if left:
        raise OrphanRanks(f"rank processes survived their world (now killed): {left}")


@pytest.fixture
def ddp_world(request):
    """Run fault-injected worlds from a test: ``ddp_world.run(fn, world_size=2, faults=[...])`` for a rank function,
    ``ddp_world.run_script("train.py", argv, world_size=2, faults=[...])`` for a script (docs/scripts.md)."""
    world = DDPWorld(request.node)
    yield world
    _reap(world.results)


# -- per-item hooks ---------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test whose ``ddpfaults`` marker is bad (or does not fit this run's settings) makes its module a collection
    error naming the test and the value: every marker is checked before any world starts."""
    report = yield
    if report.passed:
        problems = []
        for node in report.result:
            if isinstance(node, pytest.Item) and node.get_closest_marker("ddpfaults") is not None:
                try:
                    _spec(node)
                except MarkerError as exc:
                    problems.append(f"MarkerError: {exc}")
        if problems:
            report.outcome, report.longrepr, report.result = "failed", "\n".join(problems), []
    return report


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Note when pytest-timeout's timer for ``item`` will fire (for the whole item, or the call only with
    ``func_only``); pytest-timeout itself still arms it."""
    item.stash[_TIMER_FIRES] = time.monotonic() + settings.timeout


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item):
    """Forget ``item``'s pytest-timeout timer once pytest-timeout cancels it."""
    if _TIMER_FIRES in item.stash:
        del item.stash[_TIMER_FIRES]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Watch every world judged while ``item`` runs (setup, call, teardown), for its reports."""
    from ddpfaults import engine

    with engine.watching(lambda result: item.stash.setdefault(_SEEN, []).append(result)):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item):
    """Attach this phase's worlds to its report (xdist carries them to the controller), the worlds it ran outside
    the fixture included (a bare ``run_world``/``run_script``, a fixture's world); on a failure, add their reports as
    sections, but for a world whose report the failure already shows (``assert ..., result.report()``)."""
    recorded, seen, item.stash[_SEEN] = item.stash.get(_RECORDED, set()), item.stash.get(_SEEN, []), []
    for result in (r for r in seen if id(r) not in recorded):
        _record(item, result)
    report = yield
    records, item.stash[_WORLDS] = item.stash.get(_WORLDS, []), []
    report.ddpfaults_worlds = records
    if report.failed and records:
        from ddpfaults.judge.results import WorldResult

        shown = str(report.longrepr)  # a mismatch shows the head; `assert ..., result.report()` all of the report
        for i, record in enumerate(records, 1):
            head, sections = _report(WorldResult.from_dict(record["result"]))
            sections = [(title, text) for title, text in sections if f"--- {title} ---" not in shown]
            if head.splitlines()[0] not in shown:
                sections.insert(0, (f"world {i} of {len(records)}", head))
            report.sections += [(f"ddpfaults: {title}", text) for title, text in sections]
    return report


def pytest_sessionfinish(session):
    """Close the engine's pool of warm worlds in this process (controller or xdist worker), if it was used."""
    pool = sys.modules.get("ddpfaults.engine.pool")
    if pool is not None and hasattr(pool, "close_all"):
        pool.close_all()


# -- end of session: JSON report and terminal summary (controller, or no xdist) -----------------


class _Collector:
    """Registered per run: keeps every world that comes back in a report, then writes the summary and JSON."""

    def __init__(self, config):
        self.config = config
        self.settings = config.stash[SETTINGS]
        self.records: list = []  # (outcome of the test report, world record)
        self.tests: dict = {}  # node id: its test's outcome as pytest counts it ("failed" if any phase failed)

    def pytest_runtest_logreport(self, report):
        """Keep the worlds a report carries (under xdist: reports from every worker), and each test's outcome."""
        self.records += [(report.outcome, record) for record in getattr(report, "ddpfaults_worlds", None) or []]
        before = self.tests.get(report.nodeid)
        if report.failed or before is None or (before != "failed" and report.when == "call"):
            self.tests[report.nodeid] = report.outcome

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self):
        """Write ``--ddpfaults-report`` (every world of the run, with its expectation and whether it held, in
        one ``ddpfaults.report/4`` document), ``--ddpfaults-html`` (the same worlds as one swimlane page) and
        ``--ddpfaults-trace`` (their timelines as one Chrome Trace Event file)."""
        if not (self.settings.report or self.settings.html or self.settings.trace):
            return
        from ddpfaults.report.document import build_document

        records = [r for _, r in self.records]
        document = build_document(
            [r["result"] for r in records],
            [r["nodeid"] for r in records],
            [r["expectation"] for r in records],
            [self.tests.get(r["nodeid"]) for r in records],
        )
        here = str(self.config.invocation_params.dir)
        if self.settings.report:
            from ddpfaults.report.document import write_document

            write_document(os.path.join(here, self.settings.report), document)
        if self.settings.html:
            from ddpfaults.report.html import write_html

            write_html(os.path.join(here, self.settings.html), document)
        if self.settings.trace:
            from ddpfaults.report.chrome_trace import write_trace

            write_trace(os.path.join(here, self.settings.trace), document)

    def pytest_terminal_summary(self, terminalreporter):
        """Count worlds by verdict, list the slowest; with -v and the show option, print passing worlds."""
        if not self.records:
            return
        tr, worlds = terminalreporter, [r for _, r in self.records]
        counts: dict = {}
        for record in worlds:
            counts[record["result"]["outcome"]] = counts.get(record["result"]["outcome"], 0) + 1
        tr.write_sep("-", "ddpfaults")
        plural = "world" if len(worlds) == 1 else "worlds"
        tr.write_line(f"{len(worlds)} {plural}: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
        slowest = sorted(worlds, key=lambda r: -r["result"]["elapsed"])[:3]
        tr.write_line(
            "slowest: "
            + "; ".join(f"{r['result']['elapsed']:.2f} s {r['nodeid']} ({r['result']['outcome']})" for r in slowest)
        )
        for kind, path in (
            ("JSON report", self.settings.report),
            ("HTML report", self.settings.html),
            ("Chrome trace", self.settings.trace),
        ):
            if path:
                tr.write_line(f"{kind}: {path}")
        if self.settings.show and self.config.get_verbosity() > 0:
            from ddpfaults.judge.results import WorldResult

            for outcome, record in self.records:
                if outcome == "passed":
                    tr.write_sep("_", f"{record['nodeid']}: {record['result']['outcome']}")
                    tr.write_line(WorldResult.from_dict(record["result"]).report())
