"""The files of a job's directory, named in one place: the rank writes them, the launcher and the judge read them.

- ``rank{r}.events``: one JSON object per line, written unbuffered (progress, collectives entered and left, faults
  fired, the end);
- ``rank{r}.out``: the rank's stdout and stderr (fd level, so C++ messages too);
- ``rank{r}.stack``: every thread's Python stack, dumped on request (its request file, :func:`request`);
- ``rank{r}.fr``: the rank's flight record, dumped on request and at the end;
- ``rank{r}.result``: the pickled outcome, written atomically before the final event;
- ``rank{r}.resume``: the resume check's records (one JSON object per line), when the check is on.
"""

from __future__ import annotations

import os

#: the kinds of file a rank keeps in its job's directory
KINDS = ("events", "out", "stack", "fr", "result", "resume")
#: how a line of a ``resume`` file that holds one file event begins (``{"file": {...}}``): the judge reads such a
#: line only where no step record follows it, and tells it by this beginning, unparsed
RESUME_FILE_LINE = '{"file": '


def path(job_dir: str, rank: int, kind: str) -> str:
    """Rank ``rank``'s file of ``kind`` (one of :data:`KINDS`) in ``job_dir``."""
    if kind not in KINDS:
        raise ValueError(f"no job file of kind {kind!r} (one of {', '.join(KINDS)})")
    return os.path.join(job_dir, f"rank{rank}.{kind}")


def request(file: str) -> str:
    """The file whose change asks a rank to dump ``file`` (its stacks or its flight record) again."""
    return file + ".req"
