"""The package's modules parsed once per test session, for the tests that scan its source with ``ast``."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ddpfaults"


@cache
def package_trees() -> tuple[tuple[str, ast.Module], ...]:
    """(path relative to the repository, parsed module) of every ``ddpfaults/**/*.py``, in path order."""
    return tuple((str(p.relative_to(ROOT)), ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py")))


def findings(finder) -> list[tuple[str, object]]:
    """(path, what) for each thing ``finder`` (a parsed module -> the things it finds) finds in the package."""
    return [(path, what) for path, tree in package_trees() for what in finder(tree)]
