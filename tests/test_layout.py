"""The package layout's rules, checked on the source with ``ast`` (fast: no worlds, nothing of ddpfaults imported).

The import graph covers every ``ddpfaults/**/*.py`` module. Each import statement is resolved to the ddpfaults
module it loads: ``import ddpfaults.x.y`` to ``ddpfaults.x.y``; ``from ddpfaults.x import y`` to ``ddpfaults.x.y``
if that is a module, else to ``ddpfaults.x``; relative imports likewise; a package stands for its ``__init__.py``.
Each import is also classed by when it runs: ``module`` (at import time: module level, class bodies, ``try``/``if``
blocks), ``function`` (inside a function body: when the function is called) or ``typing`` (under
``if TYPE_CHECKING:``: never at run time). Dynamic imports (``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import shutil
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

from package_source import findings
from processes import EVENT_GUARD

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddpfaults"
SCENARIOS = ROOT / "scenarios"
SOFT_LINES = 450  # past this a module is worth a look: a warning, not a failure (splits are made by role, not to fit)
HARD_LINES = 900  # twice that: a module this long holds more than one role


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported name of one import statement."""

    source: str  # the importing module (dotted), or the scenario file's stem
    path: Path
    line: int
    kind: str  # "module", "function" or "typing"
    raw: str  # the module named in the statement, absolute (``torch.distributed``, ``ddpfaults.x.y``)
    target: str | None  # the ddpfaults module it loads, None if it is not ddpfaults

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.kind}-level)"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _package_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by their ``__init__.py``)."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The ddpfaults module that importing ``name`` loads last: the longest prefix of it that is a module."""
    modules = _package_files()
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, source: str, path: Path, package: str):
        self.source, self.path, self.package = source, path, package
        self.kind = "module"
        self.found: list[Import] = []

    def _within(self, kind: str, nodes) -> None:
        saved, self.kind = self.kind, (self.kind if self.kind == "typing" else kind)
        for node in nodes:
            self.visit(node)
        self.kind = saved

    def visit_FunctionDef(self, node):
        # decorators and defaults run at definition time; the body when called
        self._within(self.kind, [*node.decorator_list, node.args])
        self._within("function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._within("function", [node.body])

    def visit_If(self, node):
        if _is_type_checking(node.test):
            self._within("typing", node.body)
            self._within(self.kind, node.orelse)
        else:
            self.generic_visit(node)

    def _add(self, node, raw: str, target: str | None) -> None:
        self.found.append(Import(self.source, self.path, node.lineno, self.kind, raw, target))

    def visit_Import(self, node):
        for alias in node.names:
            self._add(node, alias.name, _resolve(alias.name))

    def visit_ImportFrom(self, node):
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            raw = ".".join([*base, node.module] if node.module else base)
        else:
            raw = node.module or ""
        for alias in node.names:
            candidate = f"{raw}.{alias.name}"
            if alias.name != "*" and candidate in _package_files():
                self._add(node, candidate, candidate)
            else:
                self._add(node, raw, _resolve(raw))


def _imports_of(path: Path, source: str, package: str) -> list[Import]:
    collector = _Collector(source, path, package)
    collector.visit(ast.parse(path.read_text(), filename=str(path)))
    return collector.found


@cache
def package_imports() -> tuple[Import, ...]:
    """Every import statement of every ddpfaults module."""
    found = []
    for name, path in _package_files().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found += _imports_of(path, name, package)
    return tuple(found)


def _under(name: str | None, *prefixes: str) -> bool:
    return name is not None and any(name == p or name.startswith(p + ".") for p in prefixes)


def _listing(imports) -> str:
    return "\n".join(dict.fromkeys(f"  {i.where()}: {i.source} imports {i.raw}" for i in imports))


# -- import cycles ---------------------------------------------------------------------------------


def _graph(kinds: set[str], imports=None) -> dict[str, dict[str, list[Import]]]:
    """module -> imported ddpfaults module -> the imports making that edge (self-imports dropped); ``imports``:
    the package's own unless given."""
    graph: dict[str, dict[str, list[Import]]] = {m: {} for m in _package_files()}
    for i in package_imports() if imports is None else imports:
        if i.kind in kinds and i.target is not None and i.target != i.source:
            graph[i.source].setdefault(i.target, []).append(i)
    return graph


def _strongly_connected(graph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node, each sorted, largest first."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=lambda c: (-len(c), c))


def _shortest_cycle(graph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as its list of modules (first one repeated)."""
    start, members = component[0], set(component)
    parents, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # a component always has one


def _explain_cycles(graph, components) -> str:
    lines = []
    for component in components:
        cycle = _shortest_cycle(graph, component)
        lines.append(f"cycle among {len(component)} modules: {', '.join(component)}")
        lines.append("  e.g. " + " -> ".join(cycle))
        for a, b in itertools.pairwise(cycle):
            lines += dict.fromkeys(f"    {i.where()}: {a} imports {i.raw}" for i in graph[a][b])  # one per line
    return "\n".join(lines)


def test_no_import_cycle_at_module_level():
    """No cycle among ddpfaults modules in the imports that run at import time (module level, class bodies,
    try/if blocks). Such a cycle makes the import order decide whether a name exists yet."""
    graph = _graph({"module"})
    components = _strongly_connected(graph)
    assert not components, "import cycles (module-level imports):\n" + _explain_cycles(graph, components)


def test_no_import_cycle_counting_function_level_imports():
    """No cycle among ddpfaults modules even counting the imports inside functions (deferred imports are not a
    licence for two modules to depend on each other: the layers stay a DAG). Module-level and function-level
    imports both count here; ``if TYPE_CHECKING:`` imports do not (they never run)."""
    graph = _graph({"module", "function"})
    components = _strongly_connected(graph)
    assert not components, "import cycles (module- and function-level imports):\n" + _explain_cycles(graph, components)


def test_no_import_cycle_counting_type_checking_imports():
    """No cycle even counting the imports under ``if TYPE_CHECKING:``: two modules that name each other's types
    are one unit in two files (the judge's loop and its prover shared the observer protocol that way; it has a
    module of its own, ddpfaults.judge.live.observer)."""
    graph = _graph({"module", "function", "typing"})
    components = _strongly_connected(graph)
    assert not components, "import cycles (any level, TYPE_CHECKING too):\n" + _explain_cycles(graph, components)


def test_cycle_finder_finds_a_planted_cycle():
    """The cycle finder itself: a planted three-module cycle (and a self-import, which is not one) is found."""
    graph = {"a": {"b": []}, "b": {"c": []}, "c": {"a": [], "d": []}, "d": {}, "e": {"e": []}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert _shortest_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_a_planted_function_level_cycle_is_found():
    """The graph the function-level rule checks counts an import inside a function: a module importing another at
    module level, which imports it back inside a function, is a cycle there (and only there)."""
    planted = [
        *_imports_of_source("from ddpfaults.rank import links\n", "ddpfaults.faults.link", "ddpfaults.faults"),
        *_imports_of_source("def drop():\n    from ddpfaults.faults import link\n", "ddpfaults.rank.links", ""),
    ]
    assert [i.kind for i in planted] == ["module", "function"]
    assert _strongly_connected(_graph({"module", "function"}, planted)) == [
        ["ddpfaults.faults.link", "ddpfaults.rank.links"]
    ]
    assert _strongly_connected(_graph({"module"}, planted)) == []


def _imports_of_source(source: str, module: str, package: str) -> list[Import]:
    collector = _Collector(module, _package_files()[module], package or module.rpartition(".")[0])
    collector.visit(ast.parse(source))
    return collector.found


def test_import_resolution():
    """The resolver maps each import form to the module it loads (a check of the graph the rules rely on)."""
    assert _resolve("ddpfaults.judge.results") == "ddpfaults.judge.results"
    assert _resolve("ddpfaults.judge.results.Outcome") == "ddpfaults.judge.results"
    assert _resolve("ddpfaults") == "ddpfaults"
    assert _resolve("torch.distributed") is None
    source = "from ddpfaults import errors, run_world\nfrom . import verdict\nfrom ..engine import census\n"
    path = PACKAGE / "judge" / "_probe.py"
    collector = _Collector("ddpfaults.judge._probe", path, "ddpfaults.judge")
    collector.visit(ast.parse(source))
    assert [i.target for i in collector.found] == [
        "ddpfaults.errors",
        "ddpfaults",
        "ddpfaults.judge.verdict",
        "ddpfaults.engine.census",
    ]


# -- module size ------------------------------------------------------------------------------------


def test_module_sizes():
    """No module in ddpfaults/ is over 900 lines (it would hold more than one role: split it by what its parts do);
    one over 450 gets a warning, shown in the summary, so that a split is weighed where it reads better, not made to
    fit a count."""
    sizes = {p: len(p.read_text().splitlines()) for p in _package_files().values()}
    over = sorted((n, p) for p, n in sizes.items() if n > HARD_LINES)
    assert not over, f"modules over {HARD_LINES} lines:\n" + "\n".join(
        f"  {p.relative_to(ROOT)}: {n} lines" for n, p in reversed(over)
    )
    long = sorted((n, p) for p, n in sizes.items() if n > SOFT_LINES)
    if long:
        listing = ", ".join(f"{p.relative_to(ROOT)} ({n})" for n, p in reversed(long))
        warnings.warn(f"modules over {SOFT_LINES} lines, worth a look: {listing}", stacklevel=1)


# -- layering ---------------------------------------------------------------------------------------


def test_rank_side_imports_no_launcher_and_no_plugin():
    """ddpfaults/rank/ imports nothing of ddpfaults.engine, ddpfaults.torchrun, ddpfaults.plugin or
    ddpfaults.settings, at any level (module, function or TYPE_CHECKING): the rank side runs inside the rank
    processes and knows nothing of who launched them."""
    forbidden = ("ddpfaults.engine", "ddpfaults.torchrun", "ddpfaults.plugin", "ddpfaults.settings")
    bad = [i for i in package_imports() if _under(i.source, "ddpfaults.rank") and _under(i.target, *forbidden)]
    assert not bad, "the rank side imports the launchers or the plugin:\n" + _listing(bad)


def _fields_of(path: Path, name: str) -> dict[str, str]:
    """The annotated names of class ``name`` in ``path`` (its dataclass fields, class variables too), with their
    annotations as written."""
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_a_job_carries_the_launcher_s_runnable_and_repeats_none_of_it():
    """One description of what a world's ranks run (issue 51): the launcher's ``FunctionTarget`` holds a
    ``rank.main.Runnable`` (the pickled call, its module and file, script or not, the working directory) and each
    rank's ``Job`` carries that one, as it is; neither repeats a field of it. A job's own fields are its run's (folders,
    settings, faults, environment, attempt), the target's how reports name it."""
    runnable = _fields_of(PACKAGE / "rank" / "main.py", "Runnable")
    job = _fields_of(PACKAGE / "rank" / "main.py", "Job")
    target = _fields_of(PACKAGE / "engine" / "launcher.py", "FunctionTarget")
    assert {"payload", "module", "file", "script", "cwd"} <= set(runnable)
    assert job["runnable"] == target["runnable"] == "Runnable"
    assert set(job) & set(target) == {"runnable"}, "a field both the job and the target describe"
    assert not set(runnable) & (set(job) | set(target)), "a field of Runnable repeated beside it"


def test_judge_never_imports_torch():
    """ddpfaults/judge/ never imports torch (no ``import torch`` / ``from torch ...`` anywhere in those files,
    functions included): judging a world is pure Python over the ranks' results."""
    bad = [i for i in package_imports() if _under(i.source, "ddpfaults.judge") and _under(i.raw, "torch")]
    assert not bad, "the judge imports torch:\n" + _listing(bad)


#: the judge by role: what watches a running world, what checks a finished one after the fact; the rest of
#: ddpfaults/judge/ is the pure verdict
LIVE, CHECKS = "ddpfaults.judge.live", "ddpfaults.judge.checks"
#: modules that read the clock, files, processes or the interpreter's state: none of them in the pure verdict
IO_MODULES = (
    "time", "datetime", "sys", "io", "pathlib", "glob", "shutil", "tempfile", "pickle", "linecache", "sysconfig",
    "subprocess", "signal", "socket", "select", "selectors", "threading", "multiprocessing", "concurrent", "asyncio",
    "fcntl", "mmap", "resource", "psutil",
)  # fmt: skip
#: what the pure verdict may use of ``os``: path strings, no file system and no working directory
OS_STRINGS = {"os.sep", "os.path.basename", "os.path.dirname", "os.path.join", "os.path.split", "os.path.splitext"}
BUILTIN_IO = ("open", "print", "input")


def _pure_verdict() -> list[str]:
    """The pure verdict's modules: ddpfaults.judge and its modules outside the live and after-the-fact packages."""
    return [m for m in _package_files() if _under(m, "ddpfaults.judge") and not _under(m, LIVE, CHECKS)]


def _io_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each use of ``os`` beyond :data:`OS_STRINGS` (the longest ``os.a.b`` chain counts) and each
    call of a builtin of :data:`BUILTIN_IO` in ``tree``, in line order."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = ast.unparse(node)
            if chain.startswith("os.") and chain not in OS_STRINGS:
                found.append((node.lineno, chain))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] == "os":
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTIN_IO:
            found.append((node.lineno, f"{node.func.id}(...)"))
    return sorted(found)


def test_pure_verdict_imports_nothing_live():
    """The pure verdict (ddpfaults/judge/ outside live/ and checks/) imports nothing of ddpfaults.judge.live at any
    level (module, function or TYPE_CHECKING): the loop, the prover and the watches call the verdict, never the other
    way round."""
    pure = set(_pure_verdict())
    assert {"ddpfaults.judge.results", "ddpfaults.judge.verdict", "ddpfaults.judge.deadlock"} <= pure
    bad = [i for i in package_imports() if i.source in pure and _under(i.target, LIVE)]
    assert not bad, "the pure verdict imports the live judge:\n" + _listing(bad)


def test_pure_verdict_imports_no_check_after_the_fact_and_no_report_at_module_level():
    """The pure verdict imports nothing of ddpfaults.judge.checks (resume, recovery, fidelity) nor of
    ddpfaults.report at module level: the checks read its results, the reports render them; ``WorldResult.report()``
    imports the text renderer when called."""
    pure = set(_pure_verdict())
    bad = [
        i
        for i in package_imports()
        if i.source in pure and i.kind == "module" and _under(i.target, CHECKS, "ddpfaults.report")
    ]
    assert not bad, "module-level imports the pure verdict must not make:\n" + _listing(bad)


def test_pure_verdict_does_no_io():
    """The pure verdict imports none of :data:`IO_MODULES` (clock, files, processes, threads, the interpreter's
    state) at any level, uses ``os`` only for path strings (:data:`OS_STRINGS`) and calls no ``open``, ``print`` or
    ``input``: it is functions over results. A module that needs I/O belongs with its reader (the live judge, a
    check after the fact, a launcher)."""
    pure = set(_pure_verdict())
    bad = [i for i in package_imports() if i.source in pure and _under(i.raw, *IO_MODULES)]
    assert not bad, "the pure verdict imports I/O modules:\n" + _listing(bad)
    uses = [
        f"  {path.relative_to(ROOT)}:{line}: {what}"
        for name, path in _package_files().items()
        if name in pure
        for line, what in _io_uses(ast.parse(path.read_text()))
    ]
    assert not uses, "the pure verdict does I/O:\n" + "\n".join(uses)


def test_the_io_finder_finds_planted_uses():
    """The finder itself: file system, working directory and builtin I/O are found; path strings are not."""
    planted = (
        "os.path.relpath(p)\nos.sep + 'x'\nwith open(p) as f: pass\nos.environ.get('X')\nos.path.basename(p)\n"
        "from os.path import exists\nprint(1)\n"
    )
    assert [line for line, _ in _io_uses(ast.parse(planted))] == [1, 3, 4, 6, 7]


def test_checks_after_the_fact_import_nothing_live():
    """ddpfaults.judge.checks (the checks of a finished world) imports nothing of ddpfaults.judge.live at any level:
    they read a result, never a running world."""
    bad = [i for i in package_imports() if _under(i.source, CHECKS) and _under(i.target, LIVE)]
    assert not bad, "the after-the-fact checks import the live judge:\n" + _listing(bad)


def test_faults_import_no_rank_engine_toy_or_torch_at_module_level():
    """ddpfaults/faults/ imports none of ddpfaults.rank, ddpfaults.engine, ddpfaults.toy or torch at module level
    (import time): faults are values a launcher builds and pickles; what they apply inside a rank is imported when
    it is applied."""
    forbidden = ("ddpfaults.rank", "ddpfaults.engine", "ddpfaults.toy")
    bad = [
        i
        for i in package_imports()
        if _under(i.source, "ddpfaults.faults")
        and i.kind == "module"
        and (_under(i.target, *forbidden) or _under(i.raw, "torch"))
    ]
    assert not bad, "module-level imports the faults must not make:\n" + _listing(bad)


def test_faults_never_import_the_rank_side():
    """ddpfaults/faults/ imports nothing of ddpfaults.rank at any level (module, function or TYPE_CHECKING): faults are
    values; a kind's effect that needs the rank's machinery lives in ddpfaults.rank.effects, which looks the kind up
    (the arrow runs from the rank side to the faults, never back)."""
    bad = [i for i in package_imports() if _under(i.source, "ddpfaults.faults") and _under(i.target, "ddpfaults.rank")]
    assert not bad, "the faults import the rank side:\n" + _listing(bad)


def test_no_eval_or_exec_in_the_package():
    """No module of ddpfaults calls ``eval`` or ``exec``: text (a ``--faults`` plan, a replay command's plan) is
    parsed (``ddpfaults.faults.plan``, ``ast.literal_eval``), never evaluated."""
    calls = [
        f"  {path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(...)"
        for path in _package_files().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec")
    ]
    assert not calls, "eval/exec in the package:\n" + "\n".join(calls)


SCENARIO_API = ("ddpfaults", "ddpfaults.faults", "ddpfaults.remedies")


def test_scenarios_use_only_the_public_api():
    """scenarios/*.py import from ddpfaults only ``ddpfaults`` itself, ``ddpfaults.faults``, ``ddpfaults.remedies``
    and ``ddpfaults.toy.*`` (the public API a user's scenario has), or a sibling module of scenarios/; at any level.
    """
    files = sorted(SCENARIOS.glob("*.py"))
    assert files, f"no scenario modules in {SCENARIOS}"
    siblings = {p.stem for p in files}
    bad = []
    for path in files:
        for i in _imports_of(path, path.stem, ""):
            top = i.raw.partition(".")[0]
            if top in siblings or not _under(i.raw, "ddpfaults"):
                continue
            if not (i.target in SCENARIO_API or _under(i.target, "ddpfaults.toy")):
                bad.append(i)
    assert not bad, "scenarios importing beyond the public API:\n" + _listing(bad)


# -- ruff -------------------------------------------------------------------------------------------


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    pytest.skip("ruff is not installed (it comes with the test extra: pip install -e '.[test]')")


def test_ruff_check_is_clean():
    """``ruff check`` reports nothing for the whole repository (rules: [tool.ruff] in pyproject.toml)."""
    done = subprocess.run(
        [*_ruff(), "check", "--output-format", "concise", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EVENT_GUARD,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    """``ruff format --check`` finds nothing to reformat in the whole repository."""
    done = subprocess.run(
        [*_ruff(), "format", "--check", "--output-format", "concise", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EVENT_GUARD,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _note_reads(tree: ast.AST) -> list[int]:
    """Lines that read a ``.note`` (prose for people) as data: a string test on it, or a comparison with it."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if node.func.attr in ("startswith", "endswith", "find", "index", "split") and _is_note(target):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(_is_note(x) for x in (node.left, *node.comparators)):
            lines.append(node.lineno)
    return lines


def _is_note(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "note"


def test_no_module_reads_a_note_back_as_data():
    """What a collective is (DDP's bucket, FSDP's, DCP's) is its ``maker``; its ``note`` is only shown to people."""
    found = [f"{path}:{line}" for path, line in findings(_note_reads)]
    assert not found, "a note read as data (use the call's maker): " + ", ".join(found)


def test_the_note_reader_finder_finds_planted_reads():
    planted = 'if call.note.startswith("DDP"):\n    pass\nx = "DDP" in c.note\ny = c.maker == "dcp"\n'
    assert _note_reads(ast.parse(planted)) == [1, 3]
