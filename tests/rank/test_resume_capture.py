"""The resume check's capture, in this process: each global generator's digest follows its state; the final state's
values tell a difference's size."""

import random

import numpy
import torch

from ddpfaults.judge.resume import relative_difference
from ddpfaults.rank.resume import rng_digests, values


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
