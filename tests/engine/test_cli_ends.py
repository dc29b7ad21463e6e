"""How ``python -m ddpfaults run`` ends when its caller goes: Ctrl-C (one line, nothing left running), a stdout
closed early (``| head``: the ``--json`` document is written first all the same); and ``--cwd``, where a script's
relative paths lead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import ddpfaults.__main__ as cli_main
import rankfns
from cli import ROOT, ddpfaults_cli
from processes import EVENT_GUARD, alive, descendants, interruptible, wait_for

PLAIN = f"{ROOT}/tests/support/scripts/plain_train.py"


def test_ctrl_c_ends_a_run_with_one_line_and_leaves_no_process(tmp_path):
    """Ctrl-C while the ranks (and their DataLoader workers) run: one line, status 130; every process below gone
    (the fork server too) and the world's temp dir with them. (SIGTERM to a launcher: tests/engine/test_teardown.py.)"""
    command = [sys.executable, "-m", "ddpfaults", "run", f"{rankfns.__file__}:record_pids", "--world-size", "2"]
    # the world's timeout only guards: the Ctrl-C ends it (a world slow to start under load must not time out first)
    command += ["--kwargs", f"{{'directory': {str(tmp_path)!r}, 'workers': 1, 'hang': 'sleep'}}"]
    command += ["--timeout", str(EVENT_GUARD)]
    run = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
    )
    try:
        deadline = time.monotonic() + EVENT_GUARD
        while len(list(tmp_path.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.05)
        below = descendants(run.pid)
        ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
        workers = [w for rank in ranks for w in rank["workers"]]
        fork_server = {rank["ppid"] for rank in ranks}
        assert len(below) >= 5 and set(workers) | fork_server <= set(below), below  # ranks, workers, fork server
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=EVENT_GUARD)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert (run.returncode, err.splitlines(), out) == (
        130,
        ["ddpfaults: interrupted (Ctrl-C); the world was stopped, nothing it started is left running"],
        "",
    )
    wait_for(lambda: not alive(below), EVENT_GUARD, "every rank, worker and the fork server to die")
    wait_for(lambda: not os.path.exists(ranks[0]["shared_dir"]), EVENT_GUARD, "the world's temp dir to be removed")


class _ClosedPipe:
    """A stdout whose reader has gone (``| head`` after its lines)."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_json_is_written_before_the_report_is_printed_to_a_closed_stdout(tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    monkeypatch.setattr(cli_main, "_stdout_closed", lambda: closed.append(True) or 1)
    out = tmp_path / "out.json"
    argv = ["run", f"{rankfns.__file__}:all_reduce_steps", "--world-size", "2", "--json", str(out)]
    assert cli_main.main(argv) == 1 and closed == [True]
    (world,) = json.loads(out.read_text())["worlds"]
    assert world["outcome"] == "completed"


def test_cwd_is_where_a_scripts_relative_paths_lead(tmp_path, capsys, monkeypatch):
    run = ddpfaults_cli(capsys, monkeypatch, "run", PLAIN, "--world-size", "2", "--cwd", tmp_path, "--", "--checkpoint",
                        "model.pt")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "model.pt").exists() and not (tmp_path.parent / "model.pt").exists()


BELOW_ME = f"{ROOT}/tests/support/below_me.py"


@pytest.mark.parametrize(
    "what", [f"{ROOT}/tests/support/rankfns.py:all_reduce_steps", PLAIN], ids=["function", "script"]
)
def test_a_run_reaps_every_process_it_started_before_it_exits_not_even_a_zombie_is_left(what):
    """Run by a child subreaper (what a command leaves re-parents there, as it would to init): once ``python -m
    ddpfaults run`` has exited, nothing of its world is left below it, not even a zombie (its fork server and
    resource tracker outlived it by a moment and ended as init's zombies, which a CI container whose init does not
    reap keeps)."""
    command = [sys.executable, BELOW_ME, sys.executable, "-m", "ddpfaults", "run", what, "--world-size", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["returncode"] == 0, report["stderr"]
    assert report["left"] == {}, report
