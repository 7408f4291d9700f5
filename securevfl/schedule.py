"""The shared batch schedule: which training rows each step uses, grouped into
epochs and communication rounds, and the evaluation batches.

Every rank derives the same schedule from the protocol's training section and the
aligned training-row count, without exchanging anything; the privacy budget counts
releases over the same schedule. Pure functions of their arguments (the batch
order comes from the training seed), so the module sits low in the package and
depends on nothing but the schema and the seeding helpers.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from securevfl.config import TrainingSpec
from securevfl.seeding import generator


def train_batches(n_train: int, batch_size: int, seed: int, epoch: int) -> Iterator[np.ndarray]:
    """The agreed batch order of one epoch (positions into the training rows)."""
    perm = torch.randperm(n_train, generator=generator(seed, "epoch", epoch)).numpy()
    for start in range(0, n_train, batch_size):
        yield perm[start : start + batch_size]


def _epochs(n_train: int, tr: TrainingSpec, steps: int | None) -> Iterator[tuple[int, int, bool]]:
    """(epoch, how many of its batches run, whether it is the last epoch), the run
    truncated at ``steps`` (default ``training.max_steps``)."""
    left = tr.max_steps if steps is None else steps
    per_epoch = steps_per_epoch(n_train, tr.batch_size)
    for epoch in range(tr.epochs):
        n = per_epoch if left is None else min(per_epoch, left)
        if left is not None:
            left -= n
        last = epoch == tr.epochs - 1 or left == 0
        yield epoch, n, last
        if last:
            return


def schedule(
    n_train: int, tr: TrainingSpec, steps: int | None = None
) -> Iterator[tuple[int, list[np.ndarray], bool]]:
    """(epoch, its batches, whether it is the last epoch), truncated at
    ``steps`` (default ``training.max_steps``); every rank derives the same schedule."""
    for epoch, n, last in _epochs(n_train, tr, steps):
        yield epoch, list(train_batches(n_train, tr.batch_size, tr.seed, epoch))[:n], last


def batch_counts(
    n_train: int, tr: TrainingSpec, steps: int | None = None, first_epoch: int = 0
) -> dict[int, int]:
    """How many of :func:`schedule`'s batches from ``first_epoch`` on have each size
    (an epoch's batches are full but its last, which holds the remainder), counted
    from the epoch and step counts alone: no permutation is drawn and nothing is
    listed, so a run of a billion epochs costs a few integers here."""
    full, rest = divmod(n_train, tr.batch_size)
    per = steps_per_epoch(n_train, tr.batch_size)
    if per == 0:
        return {}
    limit = tr.max_steps if steps is None else steps
    total = per * tr.epochs if limit is None else min(limit, per * tr.epochs)
    complete, partial = divmod(total, per)  # whole epochs, then the steps of a cut one (all full)
    whole = max(0, complete - first_epoch)
    counts: dict[int, int] = {}

    def add(size: int, n: int) -> None:
        if n > 0 and size > 0:
            counts[size] = counts.get(size, 0) + n

    add(tr.batch_size, whole * full + (partial if complete >= first_epoch else 0))
    add(rest, whole)
    return counts


def rounds_of(batches: list[np.ndarray], local_steps: int) -> list[list[np.ndarray]]:
    """An epoch's batches grouped into communication rounds of ``local_steps``
    consecutive batches (FedBCD, docs/methods/crdp-fl.md §2.2 Eq. 14); the last round of an epoch
    may be shorter, so a run has ``sum over epochs of ceil(T_e / R)`` rounds."""
    return [batches[i : i + local_steps] for i in range(0, len(batches), local_steps)]


def eval_batches(n: int, batch_size: int) -> Iterator[np.ndarray]:
    """Consecutive evaluation batches over ``n`` rows, in row order."""
    for start in range(0, n, batch_size):
        yield np.arange(start, min(n, start + batch_size))


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """Training steps in one full epoch (the last batch may be short)."""
    return (n_train + batch_size - 1) // batch_size


def planned_steps(n_train: int, tr: TrainingSpec) -> int:
    """The schedule's length: every epoch's steps, capped at ``training.max_steps``."""
    total = steps_per_epoch(n_train, tr.batch_size) * tr.epochs
    return min(total, tr.max_steps) if tr.max_steps else total
