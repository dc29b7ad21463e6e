"""Helpers for tests that run pytest with the plugin in a subprocess (pytester): isolation, runs, orphan census."""

from __future__ import annotations

import json
import os
import time

from ddpfaults.engine import census

RUN_TIMEOUT = 90  # seconds: a pytester run that takes longer is itself a failure, not a hang


def isolate(pytester, monkeypatch, **files):
    """``pytester`` with ``files`` written, no DDPFAULTS_* from outside, and plugin autoload on (the subprocess
    runs need pytest-xdist and pytest-timeout)."""
    for name in list(os.environ):
        if name.startswith("DDPFAULTS_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(**files)
    return pytester


def run(pytester, *args):
    """``runpytest_subprocess`` with the plugin and a JSON report; returns (result, report document)."""
    result = pytester.runpytest_subprocess(
        "-p", "ddpfaults", "--ddpfaults-report=worlds.json", *args, timeout=RUN_TIMEOUT
    )
    path = pytester.path / "worlds.json"
    document = json.loads(path.read_text()) if path.exists() else {"schema": None, "worlds": []}
    return result, document


def assert_no_orphans(document=None, pid_dir=None, wait=5.0):
    """Orphan census of a subprocess run: every rank pid (JSON report or pid files) must be gone."""
    pids = [r["pid"] for w in (document or {}).get("worlds", []) for r in w["ranks"] if r["pid"]]
    if pid_dir is not None:
        pids += [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    deadline = time.monotonic() + wait
    while census.survivors(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert census.survivors(pids) == []
    return pids
