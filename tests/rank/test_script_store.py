"""A script's own ``init_process_group`` under a real torchrun gets the attempt's store (pytorch#135712) when it
initialises from torchrun's environment, and is left alone otherwise (the real restart: tests/torchrun)."""

import inspect

import pytest
import torch.distributed.distributed_c10d as c10d

from ddpfaults.rank import script


@pytest.fixture
def attempt_store(monkeypatch):
    store = object()
    monkeypatch.setattr(script, "_attempt_store", store)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    return store


def _given(args, kwargs) -> dict:
    return dict(inspect.signature(c10d.init_process_group).bind_partial(*args, **kwargs).arguments)


@pytest.mark.parametrize("args, kwargs", [(("gloo",), {}), (("gloo", "env://"), {}), ((), {"backend": "gloo"})])
def test_an_env_init_gets_the_attempts_store_and_torchruns_rank(attempt_store, args, kwargs):
    given = _given(*script._with_attempt_store(c10d.init_process_group, args, kwargs))
    assert given == {"backend": "gloo", "store": attempt_store, "rank": 1, "world_size": 4}


@pytest.mark.parametrize(
    "kwargs",
    [{"init_method": "tcp://localhost:1234"}, {"store": "theirs", "rank": 0, "world_size": 2}],
)
def test_an_init_with_its_own_store_or_method_is_left_alone(attempt_store, kwargs):
    assert script._with_attempt_store(c10d.init_process_group, ("gloo",), kwargs) == (("gloo",), kwargs)


def test_without_torchrun_nothing_changes(monkeypatch):
    monkeypatch.setattr(script, "_attempt_store", None)
    assert script._with_attempt_store(c10d.init_process_group, ("gloo", "env://"), {}) == (("gloo", "env://"), {})
