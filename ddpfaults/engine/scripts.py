"""Script worlds: a user's ``train.py`` (or ``-m pkg.module``), unmodified, run on N local ranks as torchrun would.

The launcher plays torchrun's agent: it hosts the TCPStore the workers rendezvous on (on a port the OS picks,
so concurrent worlds never collide) and gives each rank a worker's environment; the ranks run the script
(:mod:`ddpfaults.rank.script`) with tracing, the flight recorder and the seams installed, and the world is
judged like any ``run_world`` world. Script worlds are never reused (the script owns its process group).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import pickle
import shlex
import shutil
import sys
import tempfile
from datetime import timedelta
from typing import ClassVar

from ddpfaults.argv import argv_of
from ddpfaults.engine import restarts, world
from ddpfaults.engine.folders import check_cwd
from ddpfaults.engine.launcher import FunctionTarget, LocalWorld
from ddpfaults.errors import ConfigError, ScriptError
from ddpfaults.judge.results import WorldResult
from ddpfaults.rank import script, seams
from ddpfaults.rank.main import Runnable
from ddpfaults.replay import script_command
from ddpfaults.spec import PARAM, RunSpec, check_step_clock

_RUNS = itertools.count()


def run_script(
    path: str | os.PathLike | None = None,
    argv=(),
    *,
    module: str | None = None,
    world_size: int,
    faults=(),
    step_clock: str = seams.OPTIMIZER,
    spec: RunSpec | None = None,
    cwd: str | os.PathLike | None = None,
    flight_recorder_dir: str | os.PathLike | None = None,
    require_faults_fire: bool = True,
    **settings,
) -> WorldResult:
    """Run the script at ``path`` (as ``__main__``), or ``module`` (as ``python -m``), with ``argv`` on
    ``world_size`` ranks, as torchrun's workers, and judge the world; returns the same :class:`WorldResult`
    as :func:`~ddpfaults.run_world` (each rank's value is None).

    The script initialises its own process group (``init_process_group("gloo")`` from the environment).
    ``step_clock`` counts the steps step-keyed faults use: ``"optimizer"`` (step n+1 starts when the n-th
    optimizer step returns; step 0 when the process group is up) or ``"dataloader"`` (step n is the n-th batch
    a DataLoader yields on the rank). ``cwd`` is the ranks' working directory (default: this process's).
    Other settings as for ``run_world``, except that script worlds are never reused (no ``reuse``). As there, a
    fault that never fires although a rank it targets ran the script to its end raises
    :class:`~ddpfaults.errors.FaultNeverFired` carrying the result, unless ``require_faults_fire=False``.
    """
    run = ScriptRun.of(path, argv, module=module, step_clock=step_clock, cwd=cwd)
    request = world.WorldRequest.of(
        run, faults, spec, flight_recorder_dir, require_faults_fire, world_size=world_size, **settings
    )
    return world.run(request)


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """A script's world (:class:`~ddpfaults.engine.world.Target`): ``target`` as validated, and where its working
    directory came from for its replay line (``moved``: given by the caller; ``fresh``: a fresh one of its own)."""

    call: ClassVar[str] = "run_script"
    settings: ClassVar[tuple] = tuple(name for name in PARAM if name != "reuse")
    fixed: ClassVar[dict] = {"reuse": False}  # script worlds are never reused: the script owns its process group

    target: script.ScriptTarget
    moved: bool = False
    fresh: bool = False

    @classmethod
    def of(cls, path=None, argv=(), *, module=None, step_clock: str = seams.OPTIMIZER, cwd=None) -> ScriptRun:
        """The script at ``path`` (or ``module``) with ``argv``, validated (:func:`run_script`'s keywords)."""
        target = _target(path, argv, module, step_clock, cwd)
        return cls(target, moved=cwd is not None, fresh=isinstance(cwd, FreshDirectory))

    @contextlib.contextmanager
    def kept(self, spec: RunSpec):
        """One run's id (torchrun's run id, the same for its attempts), its target (in a copy of its working directory
        of its own when the resume check runs it twice: both runs start from the same files, each run's files its
        own) and its :data:`RUN_DIR` directory (None when its arguments name none)."""
        run_id = f"ddpfaults-{os.getpid()}-{next(_RUNS)}"
        with (
            restarts.kept_dir("ddpfaults-cwd-", spec.check_resume) as scratch,
            run_directory(self.target.argv, spec) as run_dir,
        ):
            where = self.target if scratch is None else _moved(self.target, copy_cwd(self.target.cwd, scratch))
            yield run_id, where, run_dir

    def attempt(self, request, plan, attempt: int, resume_watch: frozenset, kept) -> WorldResult:
        """One attempt of a script world, on a store of its own (torchrun's agent's, fresh for each attempt);
        ``resume_watch``: :attr:`LocalWorld.resume_watch <ddpfaults.engine.launcher.LocalWorld>`."""
        import torch.distributed as dist

        spec, (run_id, where, run_dir) = request.spec, kept
        target = attempt_target(where, spec, attempt, run_dir)
        timeout = timedelta(seconds=spec.timeout + 30)
        store = dist.TCPStore(script.LOOPBACK, 0, None, True, timeout, wait_for_workers=False)
        try:
            target = dataclasses.replace(
                target, master_port=store.port, run_id=run_id, restart=attempt, max_restarts=spec.max_restarts
            )
            runner = FunctionTarget(
                runnable=Runnable(pickle.dumps((script.run, (target, spec.threads), {})), script.__name__, script=True),
                function=target.name,
                kwargs=shlex.join(target.argv),
                replay=script_command(self.target, spec, plan, moved=self.moved, fresh=self.fresh),
                step_clock=target.clock,
            )
            return LocalWorld(runner, plan, spec, request.flight_recorder_dir, attempt, resume_watch=resume_watch).run()
        finally:
            del store


#: the placeholder a script's arguments may hold where a path outside its working directory goes (a checkpoint
#: directory): each run of the world (the faulted run, the resume check's uninterrupted run) fills it with a
#: directory of its own, kept across its restarts
RUN_DIR = "{run_dir}"


def _moved(target: script.ScriptTarget, cwd: str) -> script.ScriptTarget:
    """``target`` run in ``cwd``, a copy of its working directory: a script inside that directory runs from the copy
    (what it writes beside itself stays the run's)."""
    path = target.path
    if path is not None and not os.path.relpath(path, target.cwd).startswith(".."):
        path = os.path.join(cwd, os.path.relpath(path, target.cwd))
    return dataclasses.replace(target, cwd=cwd, path=path)


#: what no training run writes and Python or a tool rebuilds: left out of the resume check's copies
NOT_COPIED = frozenset(
    {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox", ".ipynb_checkpoints"}
)
#: version-control history: linked into the copies (a script may read it, ``git rev-parse HEAD``), never copied
LINKED = frozenset({".git", ".hg", ".svn"})


def copy_cwd(cwd: str, into: str) -> str:
    """``into``, holding a copy of the working directory ``cwd`` as it is now (files copied, symlinks kept as links):
    the resume check runs each of its two runs in a copy of its own, so both start from the same files and neither
    sees what the other wrote (and the caller's directory is left as it was). What a run never writes is not copied:
    caches (:data:`NOT_COPIED`) are left out, version control (:data:`LINKED`) and virtual environments (a folder
    holding ``pyvenv.cfg``) are symlinks to the originals. Measured: bench/bench_cwd_copy.py."""
    linked: list[tuple[str, str]] = []

    def left_out(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in NOT_COPIED}
        for name in names:
            path = os.path.join(directory, name)
            if name in LINKED or os.path.isfile(os.path.join(path, "pyvenv.cfg")):
                if not os.path.islink(path):
                    linked.append((path, os.path.join(into, os.path.relpath(path, cwd))))
                    skipped.add(name)
        return skipped

    try:
        shutil.copytree(cwd, into, symlinks=True, dirs_exist_ok=True, ignore=left_out)
        for original, link in linked:
            os.symlink(original, link, target_is_directory=True)
    except (OSError, shutil.Error) as exc:
        raise ConfigError(
            f"check_resume: the working directory {cwd} cannot be copied for the resume check's runs ({exc}); give "
            f"the script a directory of its own (cwd=, --cwd)"
        ) from None
    return into


@contextlib.contextmanager
def run_directory(argv, spec: RunSpec):
    """A fresh directory for :data:`RUN_DIR` when the script's arguments (or restarted attempts') name it, removed
    when the block ends; else None."""
    restart = argv_of(spec.restart_argv) or ()
    if not any(RUN_DIR in a for a in (*argv, *restart)):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ddpfaults-run-", ignore_cleanup_errors=True) as directory:
        yield directory


def attempt_target(target: script.ScriptTarget, spec: RunSpec, attempt: int, run_dir) -> script.ScriptTarget:
    """``target`` as attempt ``attempt`` runs it: a restarted attempt with ``spec.restart_argv`` if given, and
    :data:`RUN_DIR` in its arguments replaced by ``run_dir``."""
    argv = argv_of(spec.restart_argv) if attempt > 0 and spec.restart_argv is not None else target.argv
    if run_dir is not None:
        argv = tuple(a.replace(RUN_DIR, run_dir) for a in argv)
    return dataclasses.replace(target, argv=tuple(argv))


class FreshDirectory(str):
    """A world's fresh, empty working directory (:func:`world_directory`): its replay gets a fresh one too."""


@contextlib.contextmanager
def world_directory(cwd=None):
    """The working directory of one world (a script's, or the fixture's rank function's): ``cwd`` as it is, or
    (None) a fresh empty directory, removed when the block ends. A world that must find what an earlier one left (a
    restart) is given that one's."""
    if cwd is not None:
        yield cwd
        return
    with tempfile.TemporaryDirectory(prefix="ddpfaults-cwd-", ignore_cleanup_errors=True) as directory:
        yield FreshDirectory(directory)


def _target(path, argv, module, step_clock, cwd) -> script.ScriptTarget:
    """The validated script target (the store's port and run id are filled in later)."""
    if (path is None) == (module is None):
        raise ScriptError(
            f"run_script: give a script path or module=, exactly one (got path={path!r}, module={module!r})"
        )
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ScriptError(f"run_script: path must be the script's path, got {path!r}")
    if module is not None and not isinstance(module, str):
        raise ScriptError(f"run_script: module must be a module name such as 'pkg.train', got {module!r}")
    if not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"run_script: argv must be a list of strings (the script's arguments), got {argv!r}")
    check_step_clock(step_clock, "run_script")
    cwd = check_cwd(cwd, "run_script") or os.getcwd()
    if path is not None:
        path = os.path.join(cwd, os.fspath(path))
        if not os.path.isfile(path):
            raise ScriptError(f"script {os.fspath(path)!r} not found (working directory {cwd})")
    elif not _module_exists(module, cwd):
        raise ScriptError(f"module {module!r} not found (python -m {module} from {cwd} would fail)")
    shown = path and (os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path)
    return script.ScriptTarget(path, module, tuple(argv), cwd, step_clock, master_port=0, run_id="", shown=shown)


def _module_exists(module: str, cwd: str) -> bool:
    sys.path.insert(0, cwd)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path.remove(cwd)
