"""A fault plan written as text (``--faults '[EmptyBatch(rank=1, step=1)]'``), parsed, never evaluated.

Accepted: a list or tuple of fault constructor calls (a single call outside a list is refused, as a lone fault is
everywhere a plan is given), each naming a public fault class of
:mod:`ddpfaults.faults` with keyword arguments whose values are literals (numbers, strings, lists, None...),
``signal.SIGTERM``-style signal names, or a built-in exception built from literals (``RuntimeError('x')``,
as ``RankCrash``'s repr writes it). Every fault's ``repr`` parses back to an equal fault.
"""

from __future__ import annotations

import ast
import builtins
import signal

from ddpfaults.errors import FaultError


def _fault_classes() -> dict:
    from ddpfaults import faults
    from ddpfaults.faults.base import Fault

    return {
        name: value
        for name in faults.__all__
        if isinstance(value := getattr(faults, name), type) and issubclass(value, Fault) and value is not Fault
    }


def _value(node: ast.AST, where: str):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "signal":
        if isinstance(getattr(signal, node.attr, None), signal.Signals):
            return getattr(signal, node.attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        exc = getattr(builtins, node.func.id, None)
        if isinstance(exc, type) and issubclass(exc, BaseException):
            return exc(*(_value(a, where) for a in node.args))
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise FaultError(f"{where}: {ast.unparse(node)!r} is not a literal (numbers, strings, lists, None)") from None


def _fault(node: ast.AST, classes: dict, text: str):
    source = ast.get_source_segment(text, node) or ast.unparse(node)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise FaultError(f"--faults: {source!r} is not a fault constructor call like EmptyBatch(rank=1, step=1)")
    kind = classes.get(node.func.id)
    if kind is None:
        raise FaultError(f"--faults: unknown fault {node.func.id!r}; known faults: {', '.join(sorted(classes))}")
    if node.args or any(k.arg is None for k in node.keywords):
        raise FaultError(f"--faults: {source!r}: fault arguments are keyword-only (e.g. rank=1, step=2)")
    kwargs = {k.arg: _value(k.value, f"--faults: {source}") for k in node.keywords}
    try:
        return kind(**kwargs)
    except TypeError as exc:
        raise FaultError(f"--faults: {source!r}: {exc}") from None


def parse_plan(text: str) -> list:
    """The faults written in ``text``; :class:`~ddpfaults.errors.FaultError` naming the bad part otherwise."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FaultError(f"--faults {text!r}: not a list of faults ({exc.msg})") from None
    if not isinstance(tree, (ast.List, ast.Tuple)):
        source = text.strip()
        raise FaultError(
            f"--faults {source!r}: a plan is a list of faults; wrap it in a list: --faults '[{source}]'"
            if isinstance(tree, ast.Call)
            else f"--faults {source!r}: not a list of faults like [EmptyBatch(rank=1, step=1)]"
        )
    items = tree.elts
    classes = _fault_classes()
    return [_fault(node, classes, text) for node in items]
