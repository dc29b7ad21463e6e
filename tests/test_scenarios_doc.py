"""``docs/scenarios.md`` is generated from the built-in scenario modules (:func:`ddpfaults.matrix.reference`): the
doc lists exactly the cases the matrix runs, with the faults and expectations the code declares. Pure: no world
starts."""

from __future__ import annotations

from pathlib import Path

from ddpfaults import matrix
from ddpfaults.scenario import discover

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


def test_the_scenario_reference_is_the_one_the_code_makes():
    """Regenerate it with ``python -m ddpfaults.matrix > docs/scenarios.md``."""
    assert DOC.read_text() == matrix.reference(), "docs/scenarios.md is stale: python -m ddpfaults.matrix > it"


def test_every_case_of_the_matrix_has_one_row_naming_its_expectation():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    cases = discover()
    assert len(rows) == len(cases)
    for row, case in zip(rows, cases, strict=True):
        expected = case.expect.describe().replace("|", "\\|")
        assert row.startswith(f"| `{case.id}` |") and row.endswith(f"| {expected} |"), (row, case.id)
