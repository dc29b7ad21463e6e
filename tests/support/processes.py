"""Process helpers for tests: which of a set of pids are still alive (zombies count as gone), a process's
descendants, waiting for a condition, and a child that Ctrl-C interrupts whatever its parent inherited."""

import os
import signal
import time


def alive(pids) -> list[int]:
    """The pids in ``pids`` whose process exists and is not a zombie."""
    left = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            left.append(pid)
    return left


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` in the parent tree (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return alive(sorted(found))


#: seconds a test waits for an event of a process that is still running (a launcher starting its world): only a guard
#: against a hang, never a measure of speed (a cold fork server under load 12 on 2 cores takes over a minute)
EVENT_GUARD = 600  # fixed: a guard only: a wait that reaches it has failed its test; nothing passes by its length

#: seconds: the hard timeout of a world whose test judges it by something else (it completes, crashes, the stall rule
#: or a deadlock proof ends it). It only ends a world that has already failed its test, and it bounds start-up too
#: (start-up may take at most the timeout), so a short one would fail a cold start under load, never a hang sooner
WORLD_GUARD = EVENT_GUARD

#: seconds between two looks of a polling wait: the event ends the wait, this only spaces the looks
POLL = 0.05


def wait_for(predicate, timeout: float, what: str, *, process=None):
    """``predicate()``'s first truthy value, polled every 50 ms; AssertionError naming ``what`` after ``timeout`` s,
    or at once if ``process`` (a Popen whose work brings the event) ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended (exit code {process.returncode}) before {what}")
        time.sleep(POLL)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def interruptible() -> None:
    """``preexec_fn`` giving the child SIGINT's default action, so Python turns it into KeyboardInterrupt: a test
    run started in the background of a non-interactive shell ignores SIGINT, and its children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
