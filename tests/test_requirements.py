"""What ddpfaults needs of torch and of the operating system: refused with one error naming what is missing, before
any process starts. Pure: no world starts."""

from __future__ import annotations

import re
import sys

import pytest

import ddpfaults
from ddpfaults import errors, requirements
from ddpfaults.proc import platform


@pytest.mark.parametrize("version", ["2.7.1", "2.4.1+cu121", "1.13.1"])
def test_a_torch_older_than_the_floor_is_refused_naming_both_versions(version):
    expected = rf"needs torch >= 2\.8; the installed torch is {re.escape(version)} "
    with pytest.raises(errors.UnsupportedTorch, match=expected):
        requirements.check_torch(version)


@pytest.mark.parametrize("version", ["2.8.0", "2.13.0+cpu", "2.15.0+cu132", "3.0.0"])
def test_the_floor_and_newer_torches_pass(version):
    requirements.check_torch(version)
    assert requirements.check_torch() is None  # the installed one, which ddpfaults was imported with


def test_a_world_on_a_machine_without_linux_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(platform.sys, "platform", "darwin")
    monkeypatch.setattr(platform.os.path, "isdir", lambda path: False)
    with pytest.raises(errors.UnsupportedPlatform) as refused:
        ddpfaults.run_world(test_the_floor_and_newer_torches_pass, world_size=2)
    message = str(refused.value)
    assert message.startswith("local worlds (run_world, run_script, the matrix, the pytest plugin) need Linux")
    assert "this is darwin" in message and "prctl" in message and "per-thread scheduler states" in message


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux has it all")
def test_linux_has_what_a_world_needs():
    assert platform.missing() == []
    platform.require("worlds")
