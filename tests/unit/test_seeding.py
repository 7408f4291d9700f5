"""Named seeds: the same name gives the same seed on every rank, others differ."""

from __future__ import annotations

import torch

from securevfl.seeding import derive_seed, generator, seeded


def test_derive_seed_is_a_pure_function_of_its_labels():
    assert derive_seed(0, "a") == derive_seed(0, "a")
    assert derive_seed(0, "a") != derive_seed(0, "b")
    assert derive_seed(0, "a") != derive_seed(1, "a")
    assert 0 <= derive_seed(7, "epoch", 3) < 2**63


def test_seeded_block_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with seeded(0, "x"):
        inner = torch.rand(3)
    assert torch.equal(torch.rand(3), expected)
    with seeded(0, "x"):
        assert torch.equal(torch.rand(3), inner)
    assert torch.equal(
        torch.randperm(5, generator=generator(0, "s")), torch.randperm(5, generator=generator(0, "s"))
    )
