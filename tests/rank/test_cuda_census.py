"""The CUDA mapping's census on the installed torch: every public callable of ``torch.cuda`` and
``torch.accelerator`` (their own: not what they import, nor exception classes) and the device methods of Tensor and
Module is either mapped (called inside a real rank: it answers) or refused (``UnmappableCudaCall`` naming the
caller's line), never torch's raw error and never unclassified. CI runs it on torch 2.8 and 2.15 (the fast tests)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import censusfns
from ddpfaults import Outcome, run_world


def test_every_cuda_and_accelerator_call_and_device_method_is_mapped_or_refused_in_a_rank():
    result = run_world(censusfns.call_every_entry, world_size=2, cuda_on_cpu=True)
    assert result.outcome == Outcome.COMPLETED, result.report()
    outcomes = result.values[0]
    assert len(outcomes) > 100 and outcomes == result.values[1]
    wrong = {
        name: (how, outcome)
        for name, (how, outcome) in outcomes.items()
        if not (
            (how == "mapped" and outcome == "answered")
            or (how == "refused" and outcome.startswith("refused at censusfns.py:"))
        )
    }
    assert wrong == {}
    for name in ("torch.cuda.set_device", "torch.accelerator.is_available", "Module.to", "Tensor.cuda"):
        assert outcomes[name] == ("mapped", "answered")
    assert outcomes["torch.cuda.Stream"] == ("mapped", "answered") and outcomes["torch.cuda.CUDAGraph"][0] == "refused"


def test_the_census_document_is_the_one_the_installed_torch_makes():
    """docs/cuda-census.md is generated from the census, so it cannot drift from the mapping; it is made on one torch
    (its first lines name it), and compared on that one (the README's command runs it)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cuda-census.md").read_text()
    made_on = re.search(r"Generated on torch (\S+) ", doc).group(1)
    if torch.__version__.split("+")[0] != made_on:
        pytest.skip(f"docs/cuda-census.md was made on torch {made_on}; this is {torch.__version__}")
    done = subprocess.run(
        [sys.executable, "-m", "ddpfaults.rank.cuda_on_cpu"], capture_output=True, text=True, check=True
    )
    assert done.stdout == doc, (
        "docs/cuda-census.md is stale: python -m ddpfaults.rank.cuda_on_cpu > docs/cuda-census.md"
    )
