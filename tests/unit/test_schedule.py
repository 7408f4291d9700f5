"""The shared batch schedule's sizes without its permutations."""

from __future__ import annotations

import pytest

from securevfl.config import TrainingSpec
from securevfl.schedule import batch_sizes, schedule


@pytest.mark.parametrize("n_train", [0, 1, 7, 64, 100, 1437])
@pytest.mark.parametrize("batch_size", [1, 16, 64, 256])
@pytest.mark.parametrize("epochs", [1, 3])
@pytest.mark.parametrize("steps", [None, 0, 1, 5, 11])
def test_batch_sizes_are_the_schedules(n_train, batch_size, epochs, steps):
    """batch_sizes (what the exchange is told ahead) equals the lengths of the
    schedule's batches, from every first epoch a resumed run could start at."""
    tr = TrainingSpec(epochs=epochs, batch_size=batch_size)
    run = list(schedule(n_train, tr, steps))
    for first in range(epochs + 1):
        want = tuple(len(b) for epoch, batches, _ in run if epoch >= first for b in batches)
        assert batch_sizes(n_train, tr, steps, first_epoch=first) == want
