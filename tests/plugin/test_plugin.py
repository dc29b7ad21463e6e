"""The pytest plugin, end to end: pytester runs of user scenario modules and tests.

Anything that spawns ranks runs in a subprocess (``runpytest_subprocess``), and after each
such run an orphan census checks that none of the ranks it launched is still alive (their
pids come from the run's JSON report, or from files the ranks write themselves).
"""

import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from ddpfaults.report.document import read_document
from plugin_user import SCENARIOS, STEPS, ddp_world_session, every_option_session
from pluginruns import RUN_TIMEOUT, assert_no_orphans, isolate, run
from processes import EVENT_GUARD, alive, descendants


@pytest.fixture
def user(pytester, monkeypatch):
    """A pytester dir holding rank functions and a user scenario module (see ``pluginruns.isolate``)."""
    return isolate(pytester, monkeypatch, rankfns_user=STEPS, scenario_user=SCENARIOS)


# -- collection -----------------------------------------------------------------------------------


def test_user_module_collects_one_item_per_scenario_and_variant(user):
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "scenario_user.py::completes",
            "scenario_user.py::skips_a_collective",
            "scenario_user.py::crashes[[]exit[]]",
            "scenario_user.py::crashes[[]claims_completed[]]",
            "4 tests collected*",
        ]
    )


def test_scenario_file_pattern_comes_from_ini(user):
    user.makeini("[pytest]\nddpfaults_scenario_files = faults_*.py\n")
    user.makepyfile(faults_more=SCENARIOS.replace("def completes", "def completes_too"))
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["faults_more.py::completes_too", "4 tests collected*"])
    result.stdout.no_fnmatch_line("scenario_user.py*")


def test_builtin_scenarios_collect_with_autoload_off_and_dash_p(user, monkeypatch):
    from ddpfaults.scenario import builtin_dir

    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q", builtin_dir())
    assert result.ret == 0, result.outlines
    result.stdout.fnmatch_lines(["*scenario_rank_crash.py::rank_crash[[]exit[]]", "*tests collected*"])


def test_settings_resolve_command_line_then_environment_then_ini(user, monkeypatch):
    from ddpfaults.plugin import SETTINGS

    # fixed: a setting resolved and read back: no world waits on it
    user.makeini("[pytest]\nddpfaults_world_size = 3\nddpfaults_seed = 4\nddpfaults_stall = 0.5\n")
    monkeypatch.setenv("DDPFAULTS_WORLD_SIZE", "5")
    config = user.parseconfigure("-p", "ddpfaults", "--ddpfaults-world-size=7")
    settings = config.stash[SETTINGS]
    assert (settings.world_size, settings.source("world_size")) == (7, "--ddpfaults-world-size")
    assert (settings.seed, settings.seed_pinned, settings.stall, settings.timeout) == (4, False, 0.5, 300.0)
    config = user.parseconfigure("-p", "ddpfaults")
    settings = config.stash[SETTINGS]
    assert (settings.world_size, settings.source("world_size")) == (5, "DDPFAULTS_WORLD_SIZE")
    monkeypatch.delenv("DDPFAULTS_WORLD_SIZE")
    monkeypatch.setenv("DDPFAULTS_SEED", "9")
    settings = user.parseconfigure("-p", "ddpfaults").stash[SETTINGS]
    assert (settings.world_size, settings.source("world_size")) == (3, "ini option ddpfaults_world_size")
    assert (settings.seed, settings.seed_pinned) == (9, True)
    with pytest.raises(AttributeError):  # frozen
        settings.seed = 1


# -- running scenario items: one session with every report option, under xdist, checked part by part -----


@pytest.fixture
def every_option(tmp_path_factory):
    """``plugin_user.every_option_session``: (result, report document, session directory)."""
    return every_option_session(tmp_path_factory)


def test_passing_item_and_a_real_hang_failing_with_its_report_and_junit_properties(every_option):
    result, document, directory = every_option
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ scenario skips_a_collective _*",
            "expected completed, observed hung",
            "expected: completed",
            "ddpfaults: 2-rank gloo world HUNG in * (deadlock proved: every live rank waits in a collective, send or "
            "receive that a peer can never make: rank 1 finished; rank 0 waits in collective #3 (all_reduce), which "
            "rank 1 never makes (it finished after its collective #2))",
            "function: scenario_user.py:skips_a_collective   seed: 0   peer_failure: exit",
            "root cause: rank 1 called all_reduce*",
            "first divergent collective #2:*",
            "rank*outcome*state*step*where*error",
            "*0*hung*blocked*2*in all_reduce(*",
            "*1*completed*finished*2*finished; waiting for the verdict*",
            "replay: pytest -p ddpfaults scenario_user.py::skips_a_collective --ddpfaults-seed=0",
            "*- ddpfaults: rank 0 stack (blocked) -*",
            "*distributed_c10d.py*in all_reduce",
            "*scenario_user.py*in skips_a_collective",
            "*- ddpfaults -*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "4 worlds: 1 completed, 2 crashed, 1 hung",
            "slowest: * s scenario_user.py::* (*)*",
            "FAILED scenario_user.py::skips_a_collective - expected completed, observed hung",
        ]
    )
    result.stdout.no_fnmatch_line("*_ scenario completes _*")  # a passing item prints no report
    result.stdout.no_fnmatch_line("*plugin.py*")  # a clean failure: no plugin traceback
    cases = ET.parse(directory / "junit.xml").getroot().iter("testcase")
    properties = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")} for case in cases}
    assert properties["skips_a_collective"] == {
        "ddpfaults.verdict": "hung",
        "ddpfaults.world_size": "2",
        "ddpfaults.seed": "0",
        "ddpfaults.expect": "completed",
        "ddpfaults.seconds": properties["skips_a_collective"]["ddpfaults.seconds"],
    }
    assert properties["completes"]["ddpfaults.verdict"] == "completed"
    assert float(properties["completes"]["ddpfaults.seconds"]) > 0


def test_a_real_crash_fails_with_root_cause_traceback_and_output(every_option):
    result, document, _ = every_option
    result.stdout.fnmatch_lines(
        [
            "*_ scenario crashes[[]claims_completed[]] _*",
            "expected completed, observed crashed",
            "ddpfaults: 2-rank gloo world CRASHED in *",
            "root cause: rank 1 raised KeyError: 'mask'*",
            "*1*crashed*raised*1*KeyError: 'mask'",
            "replay: pytest -p ddpfaults 'scenario_user.py::crashes[[]claims_completed[]]' --ddpfaults-seed=0",
            "*- ddpfaults: rank 1 traceback -*",
            "KeyError: 'mask'",
            "*- ddpfaults: rank 0 output (last * lines) -*",
            "*Connection*by peer*",
        ]
    )
    worlds = {w["nodeid"]: w for w in document["worlds"]}
    assert worlds["scenario_user.py::crashes[claims_completed]"]["outcome"] == "crashed"
    assert worlds["scenario_user.py::crashes[claims_completed]"]["root_rank"] == 1


def test_xdist_two_workers_json_report_holds_every_world(every_option):
    result, document, directory = every_option
    result.stdout.fnmatch_lines(["*2 workers*", "4 worlds: 1 completed, 2 crashed, 1 hung", "JSON report: worlds.json"])
    assert document["schema"] == "ddpfaults.report/4"
    assert sorted(w["nodeid"] for w in document["worlds"]) == [
        "scenario_user.py::completes",
        "scenario_user.py::crashes[claims_completed]",
        "scenario_user.py::crashes[exit]",
        "scenario_user.py::skips_a_collective",
    ]
    assert all(len(w["ranks"]) == 2 for w in document["worlds"])
    expectations = {w["nodeid"]: w["expectation"] for w in document["worlds"]}
    assert {nodeid: (e["text"], e["held"]) for nodeid, e in expectations.items()} == {
        "scenario_user.py::completes": ("completed", True),
        "scenario_user.py::crashes[claims_completed]": ("completed", False),
        "scenario_user.py::crashes[exit]": ("crashed with KeyError on rank 1", True),
        "scenario_user.py::skips_a_collective": ("completed", False),
    }
    assert expectations["scenario_user.py::crashes[claims_completed]"]["mismatches"] == [
        {
            "kind": "outcome",
            "text": "expected completed, observed crashed",
            "expected": "completed",
            "observed": "crashed",
        }
    ]
    read_document(directory / "worlds.json")  # a valid ddpfaults.report/4 document
    assert len([r["pid"] for w in document["worlds"] for r in w["ranks"] if r["pid"]]) == 8


def test_html_report_holds_every_world_with_one_lane_per_rank(every_option):
    result, document, directory = every_option
    result.stdout.fnmatch_lines(["HTML report: out/worlds.html"])
    page = (directory / "out" / "worlds.html").read_text()
    assert "<b class=tally-head>2 of 4 failed</b> · 2 passed" in page, "failed expectations, not bad verdicts"
    statuses = re.findall(r"<tr class='s-(\w+)", page)
    assert statuses == ["failed", "failed", "passed", "passed"], "the two failed worlds first"
    assert re.search(r"class='[^']*\bdivergence\b", page), "the hung world's first divergent collective is marked"
    for world in document["worlds"]:
        assert world["nodeid"] in page
    assert len(re.findall(r"data-rank=['\"]?\d", page)) >= 2 * len(document["worlds"])
    assert "http://" not in page and "https://" not in page


def test_flight_recorder_dumps_one_folder_per_world_named_by_its_test_id(every_option):
    """--ddpfaults-flight-recorder=DIR: each world's ranks' dumps in DIR/<test id>/rank_N; the JSON report and the
    HTML page link the folder."""
    _, document, directory = every_option
    folders = sorted(p.name for p in (directory / "fr").iterdir())
    assert len(folders) == len(document["worlds"]) == 4 and all(f.startswith("scenario_user.py_") for f in folders)
    for world in document["worlds"]:
        folder = world["flight_records"]
        assert os.path.isdir(folder) and os.path.basename(folder) in folders
        assert sorted(os.listdir(folder)) == [f"rank_{r}" for r in range(world["world_size"])]
        assert folder in (directory / "out" / "worlds.html").read_text()


# -- loading the plugin ---------------------------------------------------------------------------


def test_autoload_off_needs_and_works_with_dash_p(user, monkeypatch, every_option):
    """Without autoload and without ``-p ddpfaults`` no scenario is collected; with ``-p ddpfaults`` the every-option
    session (autoload off) ran every world."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    off = user.runpytest_inprocess("-k", "completes")  # no plugin, so no world: no subprocess needed
    off.stdout.fnmatch_lines(["*no tests ran*"])
    result, document, _ = every_option
    result.stdout.fnmatch_lines(["ddpfaults: world_size=4 timeout=300s stall=2s startup=300s seed=0*"])
    assert len(document["worlds"]) == 4


def test_autoload_plus_dash_p_registers_the_plugin_once(user):
    result = user.runpytest("-p", "ddpfaults", "--help")
    assert result.ret == 0
    assert sum(line.strip().startswith("--ddpfaults-timeout") for line in result.outlines) == 1
    result = user.runpytest("-p", "ddpfaults", "--markers")
    signature = (
        "@pytest.mark.ddpfaults(world_size=None, timeout=None, stall=None, startup=None, peer_failure=None, "
        "max_restarts=None, check_resume=None, cuda_on_cpu=None, restart_argv=None, seed=None)*"
    )
    result.stdout.fnmatch_lines([signature])


# -- bad input: collection errors and usage errors, never a hang ----------------------------------


def test_module_that_fails_to_import_is_a_collection_error_naming_it(user):
    user.makepyfile(scenario_broken="import ddpfaults\nimport no_such_module_here\n")
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*ERROR collecting scenario_broken.py*", "*No module named 'no_such_module_here'*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


@pytest.mark.parametrize(
    "faults, world_size, message",
    [
        ("[RankCrash(rank=5, step=1)]", 2, "*rank 5 does not exist in a world of 2 ranks*"),
        ("[RankCrash(rank=5, step=1)]", None, "*rank 5 does not exist in a world of 4 ranks*"),  # checked at collection
        ("['not a fault']", 2, "*faults[[]0] is 'not a fault', not a ddpfaults fault*"),  # fnmatch: [[] is a [
    ],
)
def test_invalid_fault_in_a_scenario_is_a_collection_error_naming_the_file(user, faults, world_size, message):
    user.makepyfile(
        scenario_badfault=f"""
import ddpfaults
from ddpfaults.faults import RankCrash

@ddpfaults.scenario(world_size={world_size}, faults={faults}, expect="crashed")
def bad(ctx):
    pass
"""
    )
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q", "scenario_badfault.py")
    result.stdout.fnmatch_lines(
        ["*ERROR collecting scenario_badfault.py*", f"*scenario_badfault.py: ScenarioError: {message}"]
    )
    result.stdout.no_fnmatch_line("*Traceback*")


@pytest.mark.parametrize(
    "args, env, ini, message",
    [
        (
            ["--ddpfaults-timeout=abc"],
            {},
            "",
            "ERROR: ddpfaults: --ddpfaults-timeout: invalid value 'abc' (expected a positive number of seconds)",
        ),
        (
            [],
            {"DDPFAULTS_WORLD_SIZE": "0"},
            "",
            "ERROR: ddpfaults: DDPFAULTS_WORLD_SIZE: invalid value '0' (expected an int >= 1)",
        ),
        (
            [],
            {},
            "ddpfaults_peer_failure = explode",
            "ERROR: ddpfaults: ini option ddpfaults_peer_failure: invalid value 'explode' (expected exit or linger)",
        ),
        (
            # fixed: a value handed to a pure function or refused before any world starts: no real time passes
            ["--ddpfaults-stall=5"],
            # fixed: a value handed to a pure function or refused before any world starts: no real time passes
            {"DDPFAULTS_TIMEOUT": "3"},
            "",
            "ERROR: ddpfaults: stall 5 s (from --ddpfaults-stall) must be shorter than timeout 3 s "
            "(from DDPFAULTS_TIMEOUT)",
        ),
        (["--ddpfaults-world-size=3"], {"DDPFAULTS_WORLD_SIZE": "x"}, "", None),  # the command line wins over the env
        ([], {"DDPFAULTS_PEER_FAILURE": "linger"}, "ddpfaults_peer_failure = explode", None),  # the env wins over ini
    ],
)
def test_bad_option_values_are_usage_errors_naming_option_and_value(user, monkeypatch, args, env, ini, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if ini:
        user.makeini(f"[pytest]\n{ini}\n")
    result = user.runpytest("-p", "ddpfaults", "--collect-only", "-q", *args)
    if message is None:
        assert result.ret == 0
        return
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_markers_are_one_collection_error_naming_each_test_and_keyword(user):
    user.makepyfile(
        test_marked="""
import pytest

@pytest.mark.ddpfaults(wrold_size=2)
def test_typo(ddp_world):
    raise AssertionError("never reached")

@pytest.mark.ddpfaults(timeout="soon")
def test_bad_value():
    pass
"""
    )
    result = user.runpytest("-p", "ddpfaults", "test_marked.py")
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting test_marked.py*",
            "MarkerError: ddpfaults marker of test_marked.py::test_typo: unknown keyword 'wrold_size' (known: "
            "world_size, timeout, stall, startup, peer_failure, max_restarts, check_resume, cuda_on_cpu, restart_argv, "
            "seed)",
            "MarkerError: ddpfaults marker of test_marked.py::test_bad_value: timeout must be a positive number of "
            "seconds, got 'soon'",
        ]
    )
    result.stdout.no_fnmatch_line("*never reached*")


# -- the ddp_world fixture and the marker -----------------------------------------------------------


def test_ddp_world_applies_marker_settings_and_pinned_seed_and_shows_reports(tmp_path_factory):
    """plugin_user.ddp_world_session: test_worlds.py's three tests, run with ``-v --ddpfaults-show
    --ddpfaults-seed=11``."""
    result, document, _ = ddp_world_session(tmp_path_factory)
    result.assert_outcomes(passed=3, failed=3)  # and test_fixture.py's: one passed, two failed
    result.stdout.fnmatch_lines(
        [
            "test_worlds.py::test_marker PASSED*",
            "test_worlds.py::test_asserted_hang FAILED*",
            "test_worlds.py::test_expected_hang PASSED*",
            "*_ test_asserted_hang _*",
            "E       AssertionError: assert *",
            "*- ddpfaults: world 1 of 1 -*",
            "ddpfaults: 2-rank gloo world HUNG in *",
            "replay: pytest -p ddpfaults test_worlds.py::test_asserted_hang --ddpfaults-seed=11",
            "*- ddpfaults: rank 1 stack (blocked) -*",
            "6 worlds: 4 completed, 2 hung",
            "*_ test_worlds.py::test_marker: completed _*",  # -v with --ddpfaults-show: passing worlds are shown
            "ddpfaults: 3-rank gloo world COMPLETED in *",
        ]
    )
    assert {w["seed"] for w in document["worlds"]} == {11}
    expectations = {w["nodeid"].split("::")[1]: w["expectation"] for w in document["worlds"] if "worlds" in w["nodeid"]}
    assert expectations["test_marker"] is None and expectations["test_asserted_hang"] is None, "no expect: null"
    assert (expectations["test_expected_hang"]["text"], expectations["test_expected_hang"]["held"]) == (
        "hung in all_reduce",
        True,
    )
    assert_no_orphans(document)


# -- interplay with pytest-timeout ----------------------------------------------------------------


#: the start of a test module whose tests take ``started_fork_server``: a cold first start of the fork server can
#: take longer than any fixed pytest-timeout, and how long is not what these tests measure
STARTED_FORK_SERVER = '''
import os
import pytest
import ddpfaults
import rankfns_user

@pytest.fixture
def started_fork_server():
    """Start the fork server (and a warm world) before any timer runs."""
    # fixed: the guard's 600 s (EVENT_GUARD; tests/support is not importable in this session): no verdict depends on it
    ddpfaults.run_world(rankfns_user.steps, world_size=2, timeout=600)

'''


#: a conftest that writes each test's outcome and failure text as it is reported: a session that pytest-timeout's
#: thread method ends with ``os._exit`` prints no summary
REPORTS_AS_THEY_COME = """
def pytest_runtest_logreport(report):
    if report.when == "call":
        with open("reports.txt", "a") as f:
            f.write(f"{report.nodeid.split('::')[-1]} {report.outcome} {report.longreprtext!r}\\n")
"""


@pytest.mark.slow  # waits out its deadlines by design
def test_world_deadline_and_each_pytest_timeout_method_leave_no_rank_behind(user):
    """One session, three tests, each with a fork server started first by a fixture (how long a cold first start
    takes is not what they measure) and a 2-rank world running when its timer fires:

    - a world asked for 60 s under a 4 s pytest-timeout is capped below it and judged hung;
    - pytest-timeout's signal method interrupts a plain run_world: it fails with pytest-timeout's message and
      run_world's clean-up still reaps the ranks;
    - last, pytest-timeout's thread method ends the whole pytest process with ``os._exit`` while a world runs (no
      summary, hence the conftest): its ranks must still die.

    Every rank writes its pid into its test's ``pids_*`` folder: all six are gone afterwards."""
    user.makeconftest(REPORTS_AS_THEY_COME)
    user.makepyfile(
        test_timeouts=STARTED_FORK_SERVER
        + """
# fixed: the pytest-timeout timer this test checks caps the world (asserted); the fork server started before
@pytest.mark.timeout(4, func_only=True)
def test_capped(started_fork_server, ddp_world):
    os.makedirs("pids_capped")
    # fixed: longer than the 4 s timer on purpose: the plugin must cap it below (asserted)
    result = ddp_world.run(rankfns_user.idle, world_size=2, timeout=60, args=("pids_capped",))
    assert result.outcome == "hung" and result.timeout < 4 * 0.9
    assert result.reason.startswith("hard timeout")

# fixed: the pytest-timeout timer this test checks ends the test; the world idles for ever
@pytest.mark.timeout(2.5, method="signal", func_only=True)
def test_signal_kill(started_fork_server):
    os.makedirs("pids_signal")
    # fixed: longer than the 2.5 s timer on purpose: pytest-timeout's signal must end it
    ddpfaults.run_world(rankfns_user.idle, world_size=2, timeout=60, args=("pids_signal",))

# fixed: the pytest-timeout timer this test checks ends the session; the world idles for ever
@pytest.mark.timeout(3, method="thread", func_only=True)
def test_thread_kill(started_fork_server):
    os.makedirs("pids_thread")
    # fixed: longer than the 3 s timer on purpose: pytest-timeout's thread must end it
    ddpfaults.run_world(rankfns_user.idle, world_size=2, timeout=60, args=("pids_thread",))
"""
    )
    result = user.runpytest_subprocess("-p", "ddpfaults", "test_timeouts.py", timeout=RUN_TIMEOUT)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*Timeout*"])  # the thread method's stack dump
    reports = (user.path / "reports.txt").read_text().splitlines()
    assert [line.split()[:2] for line in reports] == [["test_capped", "passed"], ["test_signal_kill", "failed"]]
    assert "Failed: Timeout (>2.5s) from pytest-timeout" in reports[1]
    assert "passed" not in result.stdout.str().splitlines()[-1], "the thread method did not end the session"
    pids = [assert_no_orphans(pid_dir=user.path / f"pids_{test}") for test in ("capped", "signal", "thread")]
    assert [len(p) for p in pids] == [2, 2, 2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_pytest_session_stopped_mid_world_leaves_no_process_behind(user, signum):
    """CI (SIGTERM) or the OOM killer (SIGKILL) stops ``pytest -p ddpfaults`` while a world runs: every process
    below pytest (fork server, resource tracker, ranks) must go with it, not only the ranks."""
    user.makepyfile(
        test_stopped="""
import os
import ddpfaults
import rankfns_user

def test_idles():
    os.makedirs("pids", exist_ok=True)
    # fixed: the guard's 600 s (EVENT_GUARD; tests/support is not importable in this session): no verdict depends on it
    ddpfaults.run_world(rankfns_user.idle, world_size=2, timeout=600, args=("pids",))
"""
    )
    with open(user.path / "pytest.out", "wb") as out:
        session = user.popen(
            [sys.executable, "-m", "pytest", "-p", "ddpfaults", "test_stopped.py"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while len(list((user.path / "pids").glob("*.pid"))) < 2 and time.monotonic() < deadline:
            assert session.poll() is None, (user.path / "pytest.out").read_text()
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.05)
        below = descendants(session.pid)
        ranks = [int(p.read_text()) for p in (user.path / "pids").glob("*.pid")]
        assert len(ranks) == 2 and set(ranks) < set(below), below  # the ranks and more: fork server, resource tracker
        session.send_signal(signum)
        session.wait(timeout=EVENT_GUARD)
        deadline = time.monotonic() + EVENT_GUARD
        while alive(below) and time.monotonic() < deadline:
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.05)
        assert alive(below) == [], f"still running after pytest got {signum.name}: {alive(below)}"
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()


TRAINS_FOR = '''
import time

import torch
import torch.distributed as dist


def trains_for(ctx, seconds):
    """All-reduce a ones tensor every 10 ms for ``seconds``: a healthy job that outlasts a short deadline."""
    t, step, end = torch.ones(1), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.step(step)
        dist.all_reduce(t)
        # fixed: a healthy job's pace (10 ms steps): it only has to outlast the 3 s deadline, which 60 s does
        time.sleep(0.01)
        step += 1
'''

TIMED_OUT_TEST = """
import pytest
from timedfns_user import trains_for

from ddpfaults.engine import pool


@pytest.fixture
def fork_server():
    # fixed: the guard's 600 s (EVENT_GUARD; tests/support is not importable in this session): no verdict depends on it
    assert pool.fork_server_ready(timeout=600)  # a cold start (torch imported under load) is not the world's time


def test_trains_past_its_deadline(fork_server, ddp_world):
    # fixed: the hard timeout this test checks fires: the job trains for 60 s, 20 times the 3 s deadline
    ddp_world.run(trains_for, world_size=2, timeout=3, stall=1, args=(60,), expect="completed")
"""


@pytest.mark.slow  # waits out its deadlines by design
def test_a_world_timed_out_fails_its_test_saying_what_to_raise_and_junit_records_the_verdict(pytester, monkeypatch):
    user = isolate(pytester, monkeypatch, timedfns_user=TRAINS_FOR, test_timed_out_user=TIMED_OUT_TEST)
    result, document = run(user, "test_timed_out_user.py", "--junitxml=junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            # one rank may already be in the next step's all_reduce: "step 256 on every rank" or "steps 256-257"
            "expected completed, observed timed out: still training at the deadline: step* last "
            "progress *.** s ago — raise the timeout (3 s)",
            "ddpfaults: 2-rank gloo world TIMED OUT in * (hard timeout of 3 s reached)",
            "*0*timed out*",
            "*1*timed out*",
        ]
    )
    result.stdout.no_fnmatch_line("first divergent collective*")
    case = next(ET.parse(user.path / "junit.xml").getroot().iter("testcase"))
    assert {p.get("name"): p.get("value") for p in case.iter("property")}["ddpfaults.verdict"] == "timed out"
    (world,) = document["worlds"]
    assert (world["outcome"], world["root_rank"], world["divergence"]) == ("timed out", None, None)
    steps = [rank["last_step"] for rank in world["ranks"]]
    assert None not in steps and max(steps) - min(steps) <= 1, steps  # lockstep training, caught in motion
    assert_no_orphans(document)
