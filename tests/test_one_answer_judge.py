"""One answer to each of the judge's questions (issue 51), checked on the source with ``ast``: whether a rank computes
is asked of the observer in one module (``judge/live/activity.py``), and deadlocks are proved by one wait-for graph
(``judge/deadlock.py``), point-to-point waits included. Each rule is also run on a planted use, so it can fail."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "ddpfaults" / "judge"
#: the observer's evidence of computing (``Observer.cpu``, ``.demand``, ``.runnable``) and the looks once built on it
EVIDENCE = frozenset({"cpu", "demand", "runnable", "seen_runnable", "any_runnable"})
PREDICATE_HOME = "ddpfaults/judge/live/activity.py"
PROOF_HOME = "ddpfaults/judge/deadlock.py"


def _judge_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(JUDGE.rglob("*.py"))}


def evidence_reads(sources: dict[str, str]) -> list[str]:
    """``path:line .name(...)`` for each call of an observer's evidence of computing outside the predicate's home."""
    found = []
    for path, text in sources.items():
        if path == PREDICATE_HOME:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EVIDENCE:
                found.append(f"{path}:{node.lineno} .{node.func.attr}(...)")
    return found


def second_proofs(sources: dict[str, str]) -> list[str]:
    """``path:line name`` for each deadlock proof outside the one wait-for graph's module: a module-level function
    named ``prove*``, or a class named ``*Proof``."""
    found = []
    for path, text in sources.items():
        if path == PROOF_HOME:
            continue
        for node in ast.parse(text).body:
            proof_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("prove")
            if proof_function or (isinstance(node, ast.ClassDef) and node.name.endswith("Proof")):
                found.append(f"{path}:{node.lineno} {node.name}")
    return found


def test_only_the_predicates_home_reads_the_observers_evidence_of_computing():
    assert (JUDGE / "live" / "activity.py").exists()
    assert evidence_reads(_judge_sources()) == []


def test_a_rule_asking_the_observer_itself_whether_a_rank_computes_is_found():
    planted = {
        "ddpfaults/judge/live/rendezvous.py": "def idle(observer, i):\n    return observer.demand(i) < 0.5\n",
        "ddpfaults/judge/live/prover.py": "def f(self, r):\n    return self.observer.runnable(r, threads=True)\n",
        "ddpfaults/judge/live/loop.py": "x = observer.any_runnable([0])\ny = {'cpu': 1}['cpu']\n",
        PREDICATE_HOME: "def mark(observer, i):\n    return observer.cpu(i, main=True)\n",
    }
    assert evidence_reads(planted) == [
        "ddpfaults/judge/live/rendezvous.py:2 .demand(...)",
        "ddpfaults/judge/live/prover.py:2 .runnable(...)",
        "ddpfaults/judge/live/loop.py:1 .any_runnable(...)",
    ]


def test_deadlocks_are_proved_by_the_one_wait_for_graph_alone():
    sources = _judge_sources()
    assert "def prove(" in sources[PROOF_HOME]
    assert second_proofs(sources) == []


def test_a_second_proof_beside_the_wait_for_graph_is_found():
    planted = {
        "ddpfaults/judge/p2p.py": "class P2PProof:\n    pass\n\n\ndef prove_p2p(ends):\n    return None\n",
        "ddpfaults/judge/live/prover.py": "class Prover:\n    def proved(self):\n        return False\n",
        PROOF_HOME: "def prove(standings):\n    return None\n",
    }
    assert second_proofs(planted) == ["ddpfaults/judge/p2p.py:1 P2PProof", "ddpfaults/judge/p2p.py:5 prove_p2p"]
