"""Where each rank's control flow went: the branch on its own rank (``if rank == 0:``, ``if is_main_process():``,
``if trainer.is_world_process_zero():``, ``if master_process:``, ``if local_rank == 0:``) a rank stands inside,
read from its stack or traceback and the source of its frames outside torch, site-packages, the standard library
and ddpfaults. It is the evidence a reviewer looks at first when two ranks disagree and nothing else shows which
left the common path (:func:`ddpfaults.judge.attribution.branch_evidence` weighs it).

The one part of the judge that reads files: the source of the frames each rank's stack names, once per file.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
from dataclasses import dataclass, field

from ddpfaults.events import LIBRARY_PATHS
from ddpfaults.judge.flight import STACK_FRAME
from ddpfaults.judge.results import RankResult

#: names whose value says which rank the code runs on: a branch on one of them runs on some ranks only
RANK_NAMES = re.compile(
    r"\b(rank|local_rank|global_rank|get_rank|get_local_rank|is_main_process|is_local_main_process|"
    r"is_world_process_zero|is_local_process_zero|is_global_zero|master_process|is_master)\b"
)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARIES = tuple(
    {os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


@dataclass(frozen=True)
class Branch:
    """A rank standing inside a branch on its rank: the frame (``site``, ``file.py:51 in main``), the branch's
    condition as written (``if rank == 0``) and whether the rank is in its body (``taken``) or its ``else``."""

    site: str
    condition: str
    taken: bool = True
    block: tuple = field(default=(), compare=False)  # (file's base name, first line, last line) of the part stood in

    def holds(self, site: str) -> bool:
        """True if ``site`` (``train.py:14 in main``, a collective's) lies in the part of the branch stood in."""
        if not self.block:
            return False
        where = site.split(" in ", 1)[0]
        name, _, line = where.rpartition(":")
        return name == self.block[0] and line.isdigit() and self.block[1] <= int(line) <= self.block[2]

    def describe(self) -> str:
        """```if rank == 0` at train.py:51 in main`` (``the else of `if rank == 0` at ...``)."""
        where = f"`{self.condition}`" if self.taken else f"the else of `{self.condition}`"
        return f"{where} at {self.site}"


def is_user_file(path: str) -> bool:
    """True for a file of the code under test: not torch's, a site-package's, the standard library's or ddpfaults'."""
    if path.startswith("<") or any(piece in path for piece in LIBRARY_PATHS):
        return False
    real = os.path.realpath(path)
    return not real.startswith(_LIBRARIES) and not real.startswith(_PACKAGE + os.sep)


def user_frames(rank: RankResult) -> list[tuple[str, int, str]]:
    """The rank's frames in the code under test, innermost first: from its stack (a faulthandler dump, innermost
    first), else (no stack, or one taken after the rank raised, already out of that code: formatting its
    traceback) its traceback (outermost first)."""
    stack = STACK_FRAME.findall((rank.stack or "").split("\n\n")[0])  # the main thread's dump comes first
    traceback = list(reversed(STACK_FRAME.findall(rank.traceback or "")))
    for frames in (stack, traceback):
        found = [(path, int(line), fn) for path, line, fn in frames if is_user_file(path)]
        if found:
            return found
    return []


@functools.lru_cache(maxsize=64)
def _rank_ifs(path: str) -> tuple:
    """Every ``if`` of the file at ``path`` whose condition names the rank: (condition, body span, else span);
    () when the file cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError):
        return ()
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # the parser's lines, split once
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = _segment(lines, node.test)
        if not RANK_NAMES.search(test):
            continue
        condition = "if " + " ".join(test.split())
        body = (node.body[0].lineno, node.body[-1].end_lineno)
        orelse = (node.orelse[0].lineno, node.orelse[-1].end_lineno) if node.orelse else None
        found.append((condition, body, orelse))
    return tuple(found)


def _segment(lines: list[str], node: ast.expr) -> str:
    """``node``'s source text, as ``ast.get_source_segment`` gives it, from its file's ``lines`` (that function splits
    the whole file again for each node: a fifth of the launcher's CPU over the built-in scenarios, measured)."""
    rows = [line.encode() for line in lines[node.lineno - 1 : node.end_lineno]]  # offsets count UTF-8 bytes
    rows[-1] = rows[-1][: node.end_col_offset]
    rows[0] = rows[0][node.col_offset :]
    return "\n".join(row.decode() for row in rows)


def rank_branch(rank: RankResult) -> Branch | None:
    """The innermost branch on its rank that ``rank`` stands inside (its innermost such frame), or None."""
    for path, line, fn in user_frames(rank):
        inside = []
        for condition, body, orelse in _rank_ifs(path):
            for span, taken in ((body, True), (orelse, False)):
                if span is not None and span[0] <= line <= span[1]:
                    inside.append((span[1] - span[0], condition, taken, span))
        if inside:
            _, condition, taken, span = min(inside)
            site = f"{os.path.basename(path)}:{line} in {fn}"
            text = condition if len(condition) <= 100 else condition[:97] + "..."
            return Branch(site, text, taken, (os.path.basename(path), *span))
    return None


def find(ranks: list[RankResult]) -> dict[int, Branch | None]:
    """Each rank's :func:`rank_branch`, for the ranks seen in the code under test (their frames there known): a
    Branch for a rank inside one, None for a rank seen in none (a rank with no such frame, dead or finished, is
    left out: where it stood is unknown)."""
    return {r.rank: rank_branch(r) for r in ranks if user_frames(r)}
