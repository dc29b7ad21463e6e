"""The resume check's capture, in this process: optimizer and RNG states recorded at the first step and where the
parameters entering a step are watched; each global generator's digest follows its state; the final state's values
tell a difference's size."""

import json
import random
from types import SimpleNamespace

import numpy
import torch

from ddpfaults.judge.checks.resume import relative_difference
from ddpfaults.rank import resume, running
from ddpfaults.rank.resume import rng_digests, values


def _captured(path, watch=frozenset(), steps=4) -> list[dict]:
    """The records of ``steps`` SGD steps of a seeded model, captured with ``watch``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ctx = SimpleNamespace()
    running.activate(ctx)
    try:
        resume.start(ctx, str(path), watch)
        for _ in range(steps):
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
        resume.finish(ctx)
    finally:
        running.activate(None)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_optimizer_state_is_recorded_at_the_first_step_and_where_watched_parameters_enter_rngs_at_every_step(
    tmp_path,
):
    plain = _captured(tmp_path / "plain")
    assert [("state" in r, "rng" in r) for r in plain[:-1]] == [(True, True)] + [(False, True)] * 3
    watched = _captured(tmp_path / "watched", frozenset({plain[1]["params"]}))  # the parameters entering step 2
    assert [r.get("params") for r in watched] == [r.get("params") for r in plain]  # the same steps, seeded
    assert [("state" in r, "rng" in r) for r in watched[:-1]] == [(True, True), (False, True), (True, True)] + [
        (False, True)
    ]
    assert watched[2]["state"] != watched[0]["state"]  # the momentum entering step 2, not step 0's (none yet)
    assert watched[-1]["final"] is True and watched[-1]["optimizers"] == plain[-1]["optimizers"]


def test_each_global_rng_s_digest_changes_with_a_draw_and_returns_with_its_state():
    states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state())
    try:
        before = rng_digests()
        assert set(before) == {"torch", "random", "numpy"}
        for draw, name in ((lambda: torch.rand(1), "torch"), (random.random, "random"), (numpy.random.rand, "numpy")):
            drawn = (draw(), rng_digests())[1]
            assert [k for k in before if drawn[k] != before[k]] == [name]  # only the generator drawn from moved
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            numpy.random.set_state(states[2])
            assert rng_digests() == before  # its state restored: its digest too
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        numpy.random.set_state(states[2])


def test_numpy_s_digest_sees_its_position_as_well_as_its_words():
    state = numpy.random.get_state()
    try:
        numpy.random.seed(7)
        seeded = rng_digests()["numpy"]
        legacy, key, pos, has_gauss, gauss = numpy.random.get_state()
        numpy.random.set_state((legacy, key, pos - 1, has_gauss, gauss))  # same words, another position
        assert rng_digests()["numpy"] != seeded
    finally:
        numpy.random.set_state(state)


def test_values_estimate_a_difference_s_size_and_keep_other_tensors_exact():
    generator = torch.Generator().manual_seed(0)
    weight, steps = torch.randn(64, 32, generator=generator), torch.tensor(7)
    base = values([weight, steps])
    assert values([weight.clone(), steps.clone()]) == base  # the same values: the same summary, bit for bit
    for size in (1e-7, 1e-5, 1e-2):
        noise = torch.randn(64, 32, generator=generator)
        moved = weight + noise * (size * weight.norm() / noise.norm())
        estimate = relative_difference(values([moved, steps]), base)
        assert size / 3 < estimate < size * 3, (size, estimate)  # 4 projections: the right order of magnitude
    assert relative_difference(values([weight, torch.tensor(8)]), base) == float("inf")  # an integer differs exactly


def test_a_tensor_met_again_is_summarised_once_and_alike():
    """A DDP module's state holds its parameters, which its optimizer holds too: the same memory is summarised once
    per job; a copy elsewhere in memory is summarised on its own, to the same values."""
    weight, seen = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), {}
    first = values([weight], seen)
    assert values([weight.detach()], seen) == first and len(seen) == 1
    assert values([weight.clone()], seen) == first and len(seen) == 2
    assert values([weight.t()], seen) != first  # the same memory read another way is another tensor


def test_a_step_with_every_rate_zero_and_every_gradient_zero_is_no_training_step():
    from ddpfaults.rank.real_steps import initialising

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    assert not initialising(opt)  # no gradient at all: a step at rate 0 (a script's step counter) is a step
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # as DCP's _init_optim_state sets them, then steps at rate 0
    assert initialising(opt)
    model(torch.ones(2, 3)).sum().backward()
    assert not initialising(opt)  # a warmup's first step at rate 0 with real gradients moves Adam's moments
    opt.param_groups[0]["lr"] = torch.tensor(0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    assert not initialising(opt)


def test_dcp_s_optimizer_initialisation_is_not_captured_as_a_step_and_forward_inputs_are_the_batch(tmp_path):
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    from ddpfaults.rank import wrapped

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ctx = SimpleNamespace()
    running.activate(ctx)
    path = tmp_path / "rank0.resume"
    try:
        resume.start(ctx, str(path))
        wrapped.register(model, wrapped.DDP)
        _init_optim_state(opt)  # the zero-gradient, zero-rate step() get_state_dict makes on a fresh optimizer
        loader = iter(torch.utils.data.DataLoader(torch.arange(8.0).reshape(4, 2), batch_size=1))
        next(loader)  # drawn and thrown away (a fast-forward): never reaches the model
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        resume.finish(ctx)
    finally:
        running.activate(None)
    steps = [json.loads(line) for line in path.read_text().splitlines() if '"final"' not in line]
    assert len(steps) == 1 and steps[0]["i"] == 0
    assert steps[0]["batch"] == [resume._digest([(torch.ones(2, 3),), {}])]
    assert len(steps[0]["drawn"]) == 1  # the drawn batch is kept to explain a difference, not compared
