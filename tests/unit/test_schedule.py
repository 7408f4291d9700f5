"""The shared batch schedule's sizes without its permutations."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from securevfl.config import TrainingSpec
from securevfl.schedule import batch_counts, schedule


@pytest.mark.parametrize("n_train", [0, 1, 7, 64, 100, 1437])
@pytest.mark.parametrize("batch_size", [1, 16, 64, 256])
@pytest.mark.parametrize("epochs", [1, 3])
@pytest.mark.parametrize("steps", [None, 0, 1, 5, 11, 1000])
def test_batch_counts_are_the_schedules(n_train, batch_size, epochs, steps):
    """batch_counts (what the exchange is told ahead) counts the sizes of the
    schedule's batches, from every first epoch a resumed run could start at."""
    tr = TrainingSpec(epochs=epochs, batch_size=batch_size)
    run = list(schedule(n_train, tr, steps))
    for first in range(epochs + 1):
        want = Counter(len(b) for epoch, batches, _ in run if epoch >= first for b in batches)
        assert batch_counts(n_train, tr, steps, first_epoch=first) == dict(want)


def test_max_steps_of_the_protocol_cut_the_counts():
    tr = TrainingSpec(epochs=3, batch_size=64, max_steps=30)
    assert batch_counts(1437, tr) == {64: 29, 29: 1}  # 23 steps an epoch: one whole epoch and 7


def test_a_billion_epochs_cost_a_few_integers():
    """What grew without end before: the plan given to the exchange listed every
    step of the run (a billion epochs of 23 steps)."""
    tr = TrainingSpec(epochs=10**9, batch_size=64)
    t0 = time.perf_counter()
    counts = batch_counts(1437, tr)
    assert time.perf_counter() - t0 < 0.01
    assert counts == {64: 22 * 10**9, 29: 10**9}
    assert batch_counts(1437, tr, 50) == {64: 48, 29: 2}
