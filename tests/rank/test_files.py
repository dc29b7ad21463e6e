"""The file record of a rank (ddpfaults.rank.files), in this process: every door (open, os.open, os.replace,
os.remove, numpy, torch.load of a path, torch.save to a path through its one call) is one ``file`` event with the
resolved path, mode and size; ddpfaults' own files and the interpreter's are not; a job records nothing of another job
(a warm rank's next, or between jobs), nor of a process forked from it."""

import os
import sys
from types import SimpleNamespace

import numpy
import torch

from ddpfaults import events
from ddpfaults.rank import files, running


def _recorded(tmp_path, act, *, active=True) -> list[dict]:
    """The file events of a job whose directory is ``tmp_path / "job"`` while ``act(ctx)`` runs."""
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    ctx, noted = SimpleNamespace(current_step=3), []
    running.activate(ctx if active else SimpleNamespace())
    files.begin(ctx, ignore=(str(job),))
    files.listen(ctx, noted.append)
    try:
        act(ctx)
    finally:
        files.unlisten(ctx, noted.append)
        running.activate(None)
    return noted


def test_every_door_is_one_event_with_the_resolved_path_mode_and_size(tmp_path):
    data = tmp_path / "data"
    data.mkdir()

    def act(ctx):
        with open(data / ".." / "data" / "a.bin", "wb") as f:  # recorded resolved
            f.write(b"x" * 10)
        with open(data / "a.bin", "rb") as f:
            f.read()
        os.close(os.open(data / "b.tmp", os.O_WRONLY | os.O_CREAT))
        os.replace(data / "b.tmp", data / "b.bin")
        os.remove(data / "a.bin")
        numpy.save(data / "c.npy", numpy.zeros(3))
        torch.save({}, data / "d.pt")  # torch's C++ writer opens it: torch.save notes it (files.install)
        torch.load(data / "d.pt")
        (tmp_path / "job" / "rank0.resume").write_text("own")  # the job's directory: ddpfaults' own
        import json  # noqa: F401  (an import opens sources: none recorded)

    noted = _recorded(tmp_path, act)
    real = os.path.realpath(data)
    assert [(e["how"], e["path"]) for e in noted] == [
        ("wrote", f"{real}/a.bin"),
        ("read", f"{real}/a.bin"),
        ("wrote", f"{real}/b.tmp"),
        ("renamed", f"{real}/b.bin"),
        ("removed", f"{real}/a.bin"),
        ("wrote", f"{real}/c.npy"),
        ("wrote", f"{real}/d.pt"),
        ("read", f"{real}/d.pt"),
    ]
    assert all(e["k"] == "file" and set(e) <= events.KINDS["file"] | {"k", "wall"} for e in noted)
    assert [e["mode"] for e in noted if e["how"] in ("wrote", "read")][:2] == ["w", "r"]  # FileIO's
    assert noted[1]["size"] == 10 and noted[3]["src"] == f"{real}/b.tmp" and noted[4]["size"] == 10
    assert all(e["step"] == 3 for e in noted)
    assert files.measured(noted[5])["size"] == os.path.getsize(data / "c.npy") > 0  # measured once written


def test_a_path_through_a_linked_directory_or_to_a_linked_file_is_recorded_as_realpath_resolves_it(tmp_path):
    """The directory's resolution is kept for the job; a link met later (a file, or a directory made after it) is
    still resolved."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    (real / "target.pt").write_bytes(b"x")

    def act(ctx):
        for _ in range(2):  # the second time from the kept resolution
            open(tmp_path / "via" / "a.pt", "wb").close()
        (real / "link.pt").symlink_to(real / "target.pt")
        open(tmp_path / "via" / "link.pt", "rb").close()
        (tmp_path / "later").symlink_to(real)
        open(tmp_path / "later" / "a.pt", "rb").close()

    noted = _recorded(tmp_path, act)
    resolved = os.path.realpath(real)
    assert [(e["how"], e["path"]) for e in noted] == [
        ("wrote", f"{resolved}/a.pt"),
        ("wrote", f"{resolved}/a.pt"),
        ("read", f"{resolved}/target.pt"),
        ("read", f"{resolved}/a.pt"),
    ]


def test_only_the_files_directly_in_the_job_s_directory_are_ddpfaults_own_not_its_shared_directory_s(tmp_path):
    def act(ctx):
        (tmp_path / "job" / "rank0.events").write_text("ddpfaults' own")
        (tmp_path / "job" / "shared").mkdir()
        (tmp_path / "job" / "shared" / "best.pth").write_bytes(b"a rank function's checkpoint in ctx.shared_dir")

    noted = _recorded(tmp_path, act)
    assert [(e["how"], e["path"]) for e in noted] == [("wrote", os.path.realpath(tmp_path / "job/shared/best.pth"))]


def test_another_job_s_context_and_no_listener_record_nothing(tmp_path):
    def act(ctx):
        (tmp_path / "x").write_text("x")

    assert _recorded(tmp_path, act, active=False) == []  # another job runs (a warm rank's next)
    assert _recorded(tmp_path, act) != []
    (tmp_path / "y").write_text("after the job stopped listening: nothing, and no error")


def test_a_process_forked_from_the_rank_records_nothing(tmp_path):
    def act(ctx):
        pid = os.fork()
        if pid == 0:
            (tmp_path / "child").write_text("a DataLoader worker's file")
            os._exit(0)
        os.waitpid(pid, 0)
        (tmp_path / "parent").write_text("the rank's")

    assert [os.path.basename(e["path"]) for e in _recorded(tmp_path, act)] == ["parent"]


def test_a_tracer_sees_the_listeners_the_audit_hook_calls(tmp_path):
    """The interpreter calls an audit hook with tracing off unless the hook says it may be traced: without that,
    coverage.py (and a debugger, a profiler) never saw the code the hook runs (a checkpoint fault's reader, the resume
    check's capture)."""
    traced = []

    def tracer(frame, event, arg):
        if event == "call":
            traced.append(frame.f_code.co_name)

    def listener_of_the_job(event):
        pass

    job = tmp_path / "job"
    job.mkdir()
    ctx = SimpleNamespace(current_step=0)
    running.activate(ctx)
    files.begin(ctx, ignore=(str(job),))
    files.listen(ctx, listener_of_the_job)
    previous = sys.gettrace()  # coverage.py's, when it measures this run
    sys.settrace(tracer)
    try:
        open(tmp_path / "a.bin", "wb").close()
    finally:
        sys.settrace(previous)
        files.unlisten(ctx, listener_of_the_job)
        running.activate(None)
    assert "_hook" in traced and "listener_of_the_job" in traced, traced
