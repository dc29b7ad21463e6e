"""``python -m ddpfaults ...`` run in the test process: the command's ``main`` with the same argv and its output
captured. A subprocess would pay an interpreter importing torch and a fork server of its own (~4 s of CPU on this
machine) before its first world; here the test process's fork server serves the worlds. Tests about the process
itself (signals, exit status of the interpreter, bad input before torch is imported) still run a subprocess."""

from __future__ import annotations

import dataclasses
import os

from ddpfaults.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


@dataclasses.dataclass(frozen=True)
class CliRun:
    """What one command printed and returned."""

    returncode: int
    stdout: str
    stderr: str


def ddpfaults_cli(capsys, monkeypatch, *argv: str, cwd=ROOT) -> CliRun:
    """``python -m ddpfaults *argv`` in directory ``cwd``, in this process (``capsys``/``monkeypatch``: the
    test's fixtures; the working directory is restored after the test)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return CliRun(code, out, err)
