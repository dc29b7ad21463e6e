"""Helpers for tests that run pytest with the plugin in a subprocess (pytester): isolation, runs, orphan census."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest

from ddpfaults.engine import census
from processes import EVENT_GUARD

#: seconds: a pytester run that takes longer is itself a failure, not a hang. A guard, not a measure of speed: a
#: session starting its fork server cold and running a few worlds took over 90 s at load 6-12 on 2 cores
RUN_TIMEOUT = EVENT_GUARD


def isolate(pytester, monkeypatch, **files):
    """``pytester`` with ``files`` written, no DDPFAULTS_* from outside, and plugin autoload on (the subprocess
    runs need pytest-xdist and pytest-timeout)."""
    for name in list(os.environ):
        if name.startswith("DDPFAULTS_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(**files)
    return pytester


def run(pytester, *args, timeout=None):
    """``runpytest_subprocess`` with the plugin and a JSON report; returns (result, report document). ``timeout``:
    the session's seconds (default :data:`RUN_TIMEOUT`)."""
    result = pytester.runpytest_subprocess(
        "-p", "ddpfaults", "--ddpfaults-report=worlds.json", *args, timeout=timeout or RUN_TIMEOUT
    )
    return result, _report(pytester.path)


def _report(directory):
    """The session's JSON report (``worlds.json`` in ``directory``), or an empty document if it wrote none."""
    path = directory / "worlds.json"
    return json.loads(path.read_text()) if path.exists() else {"schema": None, "worlds": []}


def assert_no_orphans(document=None, pid_dir=None, wait=EVENT_GUARD):
    """Orphan census of a subprocess run: every rank pid (JSON report or pid files) must be gone."""
    pids = [r["pid"] for w in (document or {}).get("worlds", []) for r in w["ranks"] if r["pid"]]
    if pid_dir is not None:
        pids += [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    deadline = time.monotonic() + wait
    while census.survivors(pids) and time.monotonic() < deadline:
        # fixed: the poll interval: the event ends the wait, this only spaces the looks
        time.sleep(0.05)
    assert census.survivors(pids) == []
    return pids


def run_once(tmp_path_factory, name: str, files: dict, *args, env: dict | None = None):
    """One pytest session with the plugin over ``files`` (name -> source), run in a subprocess as ``run`` does, for
    the tests that each check one part of it: it runs once per test run (an xdist worker that finds it done, or
    running, waits for it and reads what it left) and pays one interpreter and fork server for all of them.
    ``env``: variables set for the session. Returns (``pytest.RunResult``, report document, the session's
    directory)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist workers' basetemps are siblings
    directory, saved = shared / name, shared / name / "session.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            directory.mkdir(exist_ok=True)
            for module, source in files.items():
                (directory / f"{module}.py").write_text(source)
            dropped = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS")
            environ = {k: v for k, v in os.environ.items() if not k.startswith("DDPFAULTS_") and k not in dropped}
            command = [sys.executable, "-m", "pytest", f"--basetemp={directory / 'tmp'}", "-p", "ddpfaults"]
            t0 = time.monotonic()
            done = subprocess.run(
                [*command, "--ddpfaults-report=worlds.json", *args],
                cwd=directory,
                env={**environ, **(env or {})},
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
            )
            session = {"ret": done.returncode, "out": done.stdout, "err": done.stderr, "seconds": time.monotonic() - t0}
            saved.write_text(json.dumps(session))
    session = json.loads(saved.read_text())
    result = pytest.RunResult(
        session["ret"], session["out"].splitlines(), session["err"].splitlines(), session["seconds"]
    )
    return result, _report(directory), directory
