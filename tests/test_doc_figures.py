"""Every count the README and docs/ state about the code is held to the code: the built-in cases, scenarios and
scenario modules, the hung variants among them, the slow tests. A figure is found by the words that follow it (``105
built-in cases``); a dated measurement's recorded output (a fenced code block) is a record of its day and is not
read. Pure: no world starts (the slow tests are counted from the source, parametrizations included)."""

from __future__ import annotations

import ast
import math
import re
from functools import cache
from pathlib import Path

import pytest

from ddpfaults.scenario import builtin_dir, discover

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


@cache
def _cases():
    return discover()


def _scenario_modules() -> int:
    return len(list(Path(builtin_dir()).glob("scenario_*.py")))


def _slow_tests() -> int:
    """Tests marked slow (a module's ``pytestmark`` or the function's decorator), each parametrization counted."""
    count = 0
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_slow = any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            and "mark.slow" in ast.unparse(node.value)
            for node in tree.body
        )
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            marks = [ast.unparse(d) for d in node.decorator_list]
            if module_slow or any(m.endswith("mark.slow") for m in marks):
                count += math.prod(_cases_of(d) for d in node.decorator_list)
    return count


def _cases_of(decorator: ast.expr) -> int:
    """How many cases a ``pytest.mark.parametrize(names, [...])`` decorator makes (1 for any other decorator)."""
    if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("mark.parametrize"):
        values = decorator.args[1]
        assert isinstance(values, (ast.List, ast.Tuple)), f"a parametrize the count cannot read: {ast.unparse(values)}"
        return len(values.elts)
    return 1


#: a figure's pattern (its number is the first group) -> what the code counts
FIGURES = {
    r"(\d+) built-in cases": lambda: len(_cases()),
    r"(\d+) scenarios in": lambda: len({case.scenario.name for case in _cases()}),
    r"(\d+) scenario modules": _scenario_modules,
    r"(\d+) built-in hung variants": lambda: sum(1 for case in _cases() if str(case.expect.outcome) == "hung"),
    r"The slow real-world tests \([^)]*?(\d+) tests": _slow_tests,
}


def _stated() -> list[tuple[str, str, int]]:
    found = []
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text())
        for pattern in FIGURES:
            found += [
                (f"{doc.relative_to(ROOT)}: {m.group(0)!r}", pattern, int(m.group(1)))
                for m in re.finditer(pattern, text)
            ]
    return found


def test_the_docs_state_the_figures_this_test_holds():
    """The README states the matrix's cases, scenarios and modules, and the slow tests: a reword that drops one from
    the patterns would leave it unheld."""
    readme = [where for where, *_ in _stated() if where.startswith("README.md")]
    assert len(readme) >= 4, readme


@pytest.mark.parametrize("where, pattern, stated", _stated(), ids=[w for w, *_ in _stated()])
def test_a_figure_the_docs_state_is_the_codes(where, pattern, stated):
    assert stated == FIGURES[pattern](), f"{where}: the code counts {FIGURES[pattern]()}"


def test_the_slow_count_reads_parametrizations():
    tree = ast.parse("@pytest.mark.parametrize('a, b', [(1, 2), (3, 4), (5, 6)])\ndef test_x(a, b): pass\n")
    assert math.prod(_cases_of(d) for d in tree.body[0].decorator_list) == 3
