"""No fixed waits in the tests (issue 51): every literal number of seconds a test waits, or gives a world to wait, is
either replaced by an event or a measure of the work (``tests/support/processes.py``: ``wait_for``, ``EVENT_GUARD``)
or says why it must be that number, on its line or in a comment line directly above it, as ``# fixed: <why>``.

What counts as a literal wait (read line by line from the source, strings included, so command lines count):
``timeout=5``, ``limit=5``, ``stall=0.5``, ``startup=120`` (any name ending so: ``ddpfaults_stall = 0.5``,
``STALL = 10``; a default ``limit: float = 60.0``; a dict key ``"timeout": 5``), ``sleep(1)``,
``pytest.mark.timeout(4)``, the command-line forms ``--timeout 60``, ``--stall=2``, ``"--startup", "120"``, a
deadline ``time.monotonic() + 10`` and ``wait_for``'s seconds given by position (``wait_for(done, 30, "the
file")``). A name, an expression of names (``EVENT_GUARD``, ``3 * start``) is not literal.

A module whose every such number is given to no real clock (a scripted observer with a fake clock, a pure function
of the judge) says so once, in a line of its own: ``# fixed throughout: <why>``. That covers its keyword values,
never a ``sleep(...)``: a sleep is real time wherever it is written.

Vendored third-party code (``tests/frameworks/pytorch_examples/``, ``tests/frameworks/nanogpt/``) is not ours to
annotate and is not read.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
VENDORED = ("frameworks/pytorch_examples", "frameworks/nanogpt")

_NAMES = r"(?:timeout|limit|stall|startup)"
#: a literal number that is the whole value (``3 * start`` is a measure, not a literal)
_NUMBER = r"[-+]?(?:[0-9][0-9_]*\.?[0-9]*|\.[0-9]+)(?:e[-+]?[0-9]+)?(?=\s*(?:[,)\]}'\"#\\]|$))"
#: each pattern finds one literal wait on a line; ``sleep`` is the one a module's marker does not cover
PATTERNS = {
    "keyword": re.compile(rf"(?i)(?<![a-z0-9]){_NAMES}\s*(?::\s*[a-z_][\w\[\]., |]*)?=\s*{_NUMBER}"),
    "key": re.compile(rf"(?i)(?<![a-z0-9]){_NAMES}[\"']\s*:\s*[\"']?{_NUMBER}"),
    "option": re.compile(rf"--(?:timeout|stall|startup)(?:\s*=\s*|\s+|[\"']\s*,\s*[\"'])[\"']?{_NUMBER}"),
    "mark": re.compile(rf"mark\.timeout\(\s*{_NUMBER}"),
    "deadline": re.compile(rf"monotonic\(\)\s*\+\s*{_NUMBER}"),
    "wait_for": re.compile(rf"wait_for\(.*,\s*{_NUMBER}\s*,\s*f?[\"']"),
    "sleep": re.compile(rf"(?<![a-z0-9_])sleep\(\s*{_NUMBER}"),
}
REASON = re.compile(r"#\s*fixed:\s*\S")
MODULE_REASON = re.compile(r"^#[ \t]*fixed throughout:[ \t]*\S", re.MULTILINE)


def fixed_waits(source: str) -> list[tuple[int, str, str]]:
    """(line number, kind, line) for each line of ``source`` holding a literal wait with no ``# fixed: <why>`` on it
    or on the comment lines directly above it; keyword values are all excused where the module says
    ``# fixed throughout: <why>``."""
    lines = source.splitlines()
    throughout = bool(MODULE_REASON.search(source))
    found = []
    for number, line in enumerate(lines, 1):
        kinds = [kind for kind, pattern in PATTERNS.items() if pattern.search(line)]
        if throughout:
            kinds = [kind for kind in kinds if kind == "sleep"]
        if not kinds or _says_why(lines, number - 1):
            continue
        found.append((number, kinds[0], line.strip()))
    return found


def _says_why(lines: list[str], index: int) -> bool:
    """The line at ``index`` or one of the comment lines directly above it says ``# fixed: <why>``."""
    if REASON.search(lines[index]):
        return True
    index -= 1
    while index >= 0 and lines[index].lstrip().startswith("#"):
        if REASON.search(lines[index]):
            return True
        index -= 1
    return False


def _test_files() -> list[Path]:
    """Every .py under tests/ but the vendored trainers and this file (its planted waits are the scanner's test)."""
    return [
        path
        for path in sorted(TESTS.rglob("*.py"))
        if not path.relative_to(TESTS).as_posix().startswith(VENDORED) and path != Path(__file__).resolve()
    ]


def test_no_fixed_waits_without_a_reason():
    """Every literal wait under tests/ is an event, a guard, a measure of the work, or says ``# fixed: <why>``."""
    found = [
        f"  tests/{path.relative_to(TESTS).as_posix()}:{number}: ({kind}) {line}"
        for path in _test_files()
        for number, kind, line in fixed_waits(path.read_text())
    ]
    assert not found, (
        f"{len(found)} literal waits without '# fixed: <why>' (tests/README.md: wait on an event, use EVENT_GUARD, "
        "or scale to the work):\n" + "\n".join(found)
    )


def test_the_scanner_reads_the_test_tree():
    """The scan covers tests/ (this file, support/, the subfolders) and leaves the vendored trainers out."""
    files = {path.relative_to(TESTS).as_posix() for path in _test_files()}
    assert {"test_layout.py", "support/processes.py", "engine/test_engine.py", "frameworks/test_nanogpt.py"} <= files
    assert not [f for f in files if f.startswith(VENDORED)]


def test_the_scanner_finds_planted_waits():
    """The scanner itself: each form is found without a reason, and none is with one (on the line or in the comment
    lines directly above it); names and expressions are not literal."""
    planted = "\n".join(
        [
            "run_world(f, timeout=60)",  # 1
            "wait_for(p, timeout=EVENT_GUARD, what='x')",  # 2: a name
            "time.sleep(0.5)",  # 3
            "run_world(f, stall=0.5)  # fixed: the world hangs at once; the stall only says when it is judged",  # 4
            "# fixed: a hard timeout this test checks fires",  # 5
            "# (and a second line of comment)",  # 6
            "run_world(f, timeout=3)",  # 7: excused by line 5
            "cmd = ['run', 'x', '--timeout', '60']",  # 8
            "cmd = 'run x --stall 2'",  # 9
            "@pytest.mark.timeout(4, func_only=True)",  # 10
            "STALL = 10",  # 11
            "env = {'DDPFAULTS_TIMEOUT': '3'}",  # 12
            "user.makeini('[pytest]\\nddpfaults_startup = 30\\n')",  # 13
            "x = 1",  # 14: not a comment: it ends the comment block above
            "run_world(f, timeout=3 * start)",  # 15: an expression of the measured start
            "sys.setrecursionlimit(max(limit, 10))",  # 16
            "deadline = time.monotonic() + 5",  # 17
            "deadline = time.monotonic() + EVENT_GUARD",  # 18
            "wait_for(lambda: not alive(ranks[1:2]), 30, 'rank 1 to die', process=p)",  # 19
            "wait_for(lambda: not alive(ranks[1:2]), EVENT_GUARD, f'rank {r} to die')",  # 20
            "def torchrun(tmp_path, *extra: str, limit: float = 60.0, restarts: int = 0):",  # 21: a default
        ]
    )
    assert [(n, kind) for n, kind, _ in fixed_waits(planted)] == [
        (1, "keyword"),
        (3, "sleep"),
        (8, "option"),
        (9, "option"),
        (10, "mark"),
        (11, "keyword"),
        (12, "key"),
        (13, "keyword"),
        (17, "deadline"),
        (19, "wait_for"),
        (21, "keyword"),
    ]
    reasoned = "\n".join(f"{line}  # fixed: planted" for line in planted.splitlines())
    assert fixed_waits(reasoned) == []
    assert [n for n, _, _ in fixed_waits("# fixed: a reason\ny = 1\nrun(timeout=3)\n")] == [3]  # not directly above
    assert fixed_waits("# fixed: a reason\n# more of it\nrun(timeout=3)\n") == []
    assert [n for n, _, _ in fixed_waits("run(timeout=3)  # fixed:\n")] == [1]  # a reason, not the bare form


def test_a_module_marker_covers_keyword_values_but_not_sleeps():
    """``# fixed throughout: <why>`` excuses a module's keyword values (a fake clock's), never a real sleep; a marker
    with no reason, or not on a line of its own, excuses nothing."""
    body = "run(timeout=5, stall=2)\ntime.sleep(1)\n"
    assert [n for n, _, _ in fixed_waits("# fixed throughout: a fake clock\n" + body)] == [3]
    assert [n for n, _, _ in fixed_waits("# fixed throughout:\n" + body)] == [2, 3]
    assert [n for n, _, _ in fixed_waits("x = 1  # fixed throughout: a fake clock\n" + body)] == [2, 3]
