"""Process helpers for tests: which of a set of pids are still alive (zombies count as gone)."""


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
