"""torch's flight recorder inside a rank: switched on before the process group exists, dumped on request.

With ``TORCH_FR_BUFFER_SIZE`` set before ``init_process_group``, torch records every collective of every
process group (gloo included: DDP's buckets and forward broadcasts, FSDP's, any library's) with its sizes,
sequence ids and Python frames. A rank dumps that record (torch's own pickle, the format
``python -m torch.distributed.flight_recorder.fr_trace`` reads) at the end of each job, before a failed rank
exits, and whenever the judge asks: a :class:`DumpOnRequest` thread polls a request file, so a rank whose
main thread is blocked in a gloo collective (the GIL released) still answers.

A warm rank empties the record as each job starts (:func:`forget`): torch's dump copies out every entry it holds,
so a record that kept every earlier job's collectives made each job's dump slower than the last.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import threading

from ddpfaults import jobfiles
from ddpfaults.rank import forkserver, torch_private

BUFFER_ENTRIES = "4000"  # collectives kept per rank (torch's ring buffer) unless the user set the variable
POLL = 0.02  # seconds between looks at the request file


#: ``{name: {"name", "desc", "ranks"}}`` of the groups destroyed in this process (:func:`remember_groups`): the
#: record still holds their collectives, known to torch by name only, once c10d's registry has forgotten them
_remembered: dict = {}


def enable() -> None:
    """Switch the flight recorder on for process groups created from now on (the user's size wins)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER_ENTRIES)


def remember_groups() -> None:
    """Keep this process's groups as they are now for its later dumps: a script's ``destroy_process_group`` empties
    c10d's registry before the job's last dump, which then knew its subgroups' collectives by name only (called by
    the destroy seam, :func:`ddpfaults.rank.seams.keep_destroyed_groups`, before c10d forgets them)."""
    try:
        _remembered.update(_process_groups())
    except Exception:  # noqa: BLE001 - no registry on this torch: the dump describes the groups it can
        pass


def dump(since_wall: float | None = None) -> bytes | None:
    """The flight recorder's record of this process (torch's pickle, made self-describing: every process group
    with its ranks, which gloo's dumps leave out), or None where torch cannot give it.

    ``since_wall`` (wall-clock seconds, the clock torch stamps entries with) keeps only the collectives made since
    then: a warm rank's job start, so a job's record holds that job's collectives, not every earlier job's (the
    judge reads no others, and reading them made each job slower than the last)."""
    try:
        record = torch_private.flight_record()
        groups = _process_groups()
    except Exception:  # noqa: BLE001 - no recorder (older torch, no process group): the tracing is the record
        return None
    if since_wall is not None:
        record["entries"] = [e for e in record.get("entries") or [] if e.get("time_created_ns", 0) >= since_wall * 1e9]
    groups = {**_remembered, **groups}  # a name torch gave again names the group that has it now
    if groups:
        record["pg_config"] = groups
    return pickle.dumps(record)


_forgets = None  # None: not tried yet in this process; then whether forgetting was seen to work


def forget() -> bool:
    """Empty the flight record, so that dumps hold only the collectives recorded from now on; True if it is
    empty now. The first time in a process the record is dumped after the reset and must be empty: if it is not,
    or torch's symbols are not found, this returns False from then on (the dump's ``since_wall`` cut still keeps
    a job's collectives apart; the record just keeps growing)."""
    global _forgets
    _remembered.clear()
    if _forgets is False:
        return False
    reset = torch_private.reset_flight_record()
    if reset is None:
        return False
    if not reset:  # no process group has made one yet: nothing is recorded
        return True
    if _forgets is None:
        try:
            left = torch_private.flight_record(stacks=False).get("entries")
        except Exception:  # noqa: BLE001 - no dump to check against: do not rely on the reset
            left = None
        _forgets = left == []
    return _forgets


def _process_groups() -> dict:
    """``{name: {"name", "desc", "ranks"}}`` of this process's groups, as torch's analyzer expects them."""
    world = torch_private.groups()
    found = {}
    for group, name in list(world.pg_names.items()):
        desc = "default_pg" if group is world.default_pg else getattr(group, "group_desc", "undefined")
        ranks = sorted(world.pg_group_ranks.get(group, {}))
        found[name] = {"name": name, "desc": desc, "ranks": str(ranks)}
    return found


def write(path: str, since_wall: float | None = None) -> bool:
    """Write :func:`dump` (since ``since_wall``) to ``path`` atomically (each thread through its own temporary
    file); False if there was nothing to write or it could not be written: the record is a help, never a reason
    for a rank to fail."""
    data = dump(since_wall)
    if data is None:
        return False
    temporary = f"{path}.{threading.get_ident()}.tmp"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except OSError:
        return False
    return True


class DumpOnRequest(threading.Thread):
    """Dumps the record to ``path`` each time the request file ``path + ".req"`` changes, and every thread's
    Python stack into the open file ``stacks`` each time ``stacks.name + ".req"`` changes (one per job).

    Stacks are dumped from this thread, holding the GIL, not by faulthandler on a signal: a signal's dump runs
    while the interrupted thread's state may be changing, and killed ranks with SIGSEGV (docs/measurements.md)."""

    def __init__(self, path: str, stacks=None, since_wall: float | None = None):
        super().__init__(name="ddpfaults-flight-recorder", daemon=True)
        self.path = path
        self.since_wall = since_wall
        self.stacks = stacks
        self.stopped = threading.Event()

    def run(self) -> None:
        """Poll the request files until stopped."""
        served = {}
        requests = [(jobfiles.request(self.path), lambda: write(self.path, self.since_wall))]
        if self.stacks is not None:
            requests.append((jobfiles.request(self.stacks.name), self._dump_stacks))
        while not self.stopped.wait(POLL):
            for request, serve in requests:
                try:
                    asked = os.stat(request).st_mtime_ns
                except FileNotFoundError:
                    continue
                if asked != served.get(request):
                    served[request] = asked
                    serve()

    def _dump_stacks(self) -> None:
        faulthandler.dump_traceback(file=self.stacks, all_threads=True)
        self.stacks.flush()

    def stop(self) -> None:
        """Stop polling (the job is over) and wait for a dump in progress, so that the job's last dump is the
        one written after this."""
        self.stopped.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=5)


if forkserver.in_fork_server():  # resolved once there: every rank it forks inherits the addresses
    torch_private._reset_all()
