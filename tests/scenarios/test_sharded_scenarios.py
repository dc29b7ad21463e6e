"""The FSDP2 and DCP scenario families at 2 ranks (the matrix runs them at their declared 4: test_scenarios.py): each
naive and fixed case meets its expectation, except where one rank against one leaves nothing to tell which diverged;
there the verdict says so and never blames the rank gloo aborted."""

import dataclasses

import pytest

from ddpfaults.scenario import discover
from ddpfaults.spec import RunSpec

#: the naive and fixed case of each sharded family (the matrix has the other variants)
CASES = [
    case
    for case in discover()
    if case.scenario.fn is not None
    and case.scenario.fn.__module__ in ("scenario_fsdp", "scenario_dcp")
    and case.variant.name in ("naive", "fixed")
]
#: naive cases whose two ranks did symmetric things: the two ranks wrapped the model differently (which config was
#: stale?). Rank 0 saving alone (``if ctx.rank == 0: dcp.save(...)``) is named by the branch on its rank it stood in
SYMMETRIC = {"fsdp_wrap_config[naive]"}


def test_every_sharded_family_has_a_naive_and_a_fixed_case():
    families = {c.scenario.name for c in CASES}
    assert families == {
        "fsdp_empty_batch",
        "fsdp_wrap_config",
        "dcp_rank0_save",
        "dcp_exists_check",
        "dcp_torn",
        "dcp_async_save",
    }
    assert len(CASES) == 2 * len(families)
    assert all(c.scenario.settings["world_size"] == 4 for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_sharded_case_at_two_ranks(case):
    settings = {**case.scenario.settings, "world_size": 2}
    small = dataclasses.replace(case, scenario=dataclasses.replace(case.scenario, settings=settings))
    result = small.run(RunSpec())
    mismatches = case.expect.mismatches(result)
    if case.id not in SYMMETRIC:
        assert mismatches == [], f"{case.id}: {mismatches}\n\n{result.report()}"
        if case.id == "dcp_rank0_save[naive]":
            assert "rank 0 stood inside a branch on its rank, `if who == " in result.root_cause, result.report()
        return
    assert [m.kind for m in mismatches] == ["rank"], f"{case.id}: {mismatches}\n\n{result.report()}"
    assert result.root_rank is None and "nothing shows which diverged" in result.root_cause, result.report()
