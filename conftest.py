"""Project-wide test set-up: every test is followed by an orphan census of the ranks it launched."""

import os
import sys

import pytest

# The suite writes bytecode caches even where the environment says not to (PYTHONDONTWRITEBYTECODE): every rank
# imports its test's module (and rankfns, a scenario module...) by name to unpickle its function, and compiling it
# from source took a few ms per rank, in about 3000 rank processes a run; xdist's workers, their fork servers and
# every subprocess inherit this environment. (A user's ranks do as the user's environment says.)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# imported here once: pytester's in-process runs drop the modules they import, and importing torch's C extensions
# a second time in one process crashes it; a world started by an in-process run pickles ddpfaults.rank.main's
# functions, which must be the ones this process's pooled ranks and fork server know
import torch  # noqa: E402, F401

import ddpfaults.engine.launcher  # noqa: E402, F401
from ddpfaults.engine import census  # noqa: E402

try:  # Hypothesis profiles for tests/scenarios/test_properties.py (hypothesis is optional): HYPOTHESIS_PROFILE=ci|deep
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    settings.register_profile(
        "ci",
        max_examples=12,  # a property at scale 1 runs 12 worlds; the deep profile 200
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "deep", max_examples=200, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def fork_server():
    """The fork server up and forking. Starting it imports torch (seconds on a cold or busy machine); tests with a
    short start-up limit take this fixture so they never depend on how fast the first world starts."""
    from ddpfaults.engine import pool

    assert pool.fork_server_ready(timeout=600), "the fork server did not fork a process within 600 s"


@pytest.fixture(autouse=True)
def _fork_server_first(request):
    """Tests that run worlds (tests/engine, tests/scenarios) start with the fork server up: a test's own start-up limit
    or timeout must not pay a cold fork server importing torch (over 60 s at load 20 on 2 cores)."""
    parts = request.node.path.parts
    if "tests" in parts and parts[parts.index("tests") + 1] in ("engine", "scenarios"):
        request.getfixturevalue("fork_server")


@pytest.fixture
def own_cwd(tmp_path, monkeypatch):
    """The test's worlds work in a directory of its own (the test's ``tmp_path``), not in the directory pytest runs
    in: a resume check copies a script world's working directory for each of its two runs (this repository's, 350
    files, took 0.25-0.5 s a copy beside the suite's other workers)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


_censused = {"ranks": None}  # the ranks launched (and pooled) when the last census found no survivor


@pytest.fixture(autouse=True)
def _no_rank_survives():
    """After each test, no rank process launched by this test process (nor its children) may be alive. Counted
    again only once a rank was launched or pooled since the last census that found none: nothing of ours was alive
    then to start another process."""
    yield
    ranks = (len(census.LAUNCHED), frozenset(census.POOLED))
    if ranks == _censused["ranks"]:
        return
    left = census.survivors()
    assert not left, f"rank processes survived the test: {left}"
    _censused["ranks"] = ranks
