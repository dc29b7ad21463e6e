"""The settings table (``RunSpec``'s fields, :mod:`ddpfaults.spec`) is the one list of run settings: the options of
every command line, the plugin's options and ini keys, the marker's keys, the scenario keywords and
``docs/options.md`` are made from it. Pure: no world starts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ddpfaults import settings, spec
from ddpfaults.scenario import SETTINGS, scenario, variant
from ddpfaults.torchrun import worker

DOC = Path(__file__).resolve().parents[1] / "docs" / "options.md"


def test_the_options_reference_is_the_one_the_code_makes():
    """docs/options.md is generated; regenerate it with ``python -m ddpfaults.settings > docs/options.md``."""
    assert DOC.read_text() == settings.reference(), "docs/options.md is stale: python -m ddpfaults.settings > it"


def test_every_runspec_field_is_a_setting_of_the_table():
    names = [f.name for f in dataclasses.fields(spec.RunSpec)]
    assert [p.name for p in spec.PARAMS] == names
    for param in spec.PARAMS:
        assert param.places <= set(spec.PLACES), param
        assert param.help and param.kind, param
        assert param.validate(param.default) == param.default, param


def test_each_place_takes_exactly_the_settings_the_table_gives_it():
    def names(place):
        return {p.name for p in spec.settable(place)}

    assert set(SETTINGS) == names(spec.SCENARIO)
    assert set(settings.MARKER_KEYS) == names(spec.MARKER)
    assert {o.name for o in settings.OPTIONS if o.name in spec.PARAM} == names(spec.PYTEST)
    torchrun = vars(worker.parse_args(["x.py"]))
    assert {n for n in torchrun if n in spec.PARAM} == names(spec.TORCHRUN)
    assert all(torchrun[n] is None for n in names(spec.TORCHRUN))  # unset: the scenario's, else the default
    cli = subprocess.run(
        [sys.executable, "-m", "ddpfaults", "run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    given = {word.strip("[]") for word in cli.split() if word.startswith(("--", "[--"))}
    assert {p.name for p in spec.PARAMS if p.option in given} == names(spec.CLI)


def test_a_scenario_keyword_outside_the_table_is_refused_as_python_would():
    with pytest.raises(TypeError, match=r"scenario\(\) got an unexpected keyword argument 'startup'"):
        # fixed: a value handed to a pure function or refused before any world starts: no real time passes
        scenario(startup=5)
    with pytest.raises(TypeError, match=r"variant\(\) got an unexpected keyword argument 'seed'"):
        variant("v", seed=1)
