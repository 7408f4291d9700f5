"""Deterministic, named seeds: every rank derives the same seed for the same name.

Nothing here is global state: a seed is a pure function of the protocol seed and a
label, so ranks on different hosts agree without talking.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch


def derive_seed(seed: int, *labels: object) -> int:
    """A 63-bit seed from the protocol seed and any labels (party name, epoch...)."""
    text = "|".join([str(seed), *map(str, labels)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") & ((1 << 63) - 1)


def generator(seed: int, *labels: object) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *labels))
    return g


@contextlib.contextmanager
def seeded(seed: int, *labels: object) -> Iterator[None]:
    """Run a block (e.g. module construction) under a derived seed without
    disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, *labels))
        yield
