"""The resume check's RNG digests, read in this process: each global generator's digest follows its state."""

import random

import numpy
import torch

from ddpfaults.rank.resume import rng_digests


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
