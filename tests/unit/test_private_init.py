"""Private model initialisation (securevfl.private_init): a model's own
initialisation code draws from torch's generator in a state that comes whole from
a secret stream, and the caller's generator is left as it was."""

from __future__ import annotations

import numpy as np
import torch

from securevfl.csprng import SecretStream
from securevfl.private_init import private_rng, secret_state
from securevfl.seeding import seeded


def _linear() -> torch.Tensor:
    return torch.nn.Linear(16, 8).weight.detach().clone()


def test_the_state_holds_the_streams_words_and_nothing_of_a_seed():
    raw = secret_state(SecretStream.from_seed(3)).numpy()
    words = raw[24 : 24 + 8 * 624].view("<u8")
    expected = SecretStream.from_seed(3).kbits((624,), 32).numpy()
    assert np.array_equal(words, expected.astype(np.uint64))
    assert int(raw[:8].view("<u8")[0]) == 0  # no seed recorded
    g = torch.Generator()
    g.set_state(secret_state(SecretStream.from_seed(3)))  # a state torch accepts


def test_fresh_streams_give_different_weights_the_same_stream_the_same():
    with private_rng(SecretStream.fresh()):
        a = _linear()
    with private_rng(SecretStream.fresh()):
        b = _linear()
    with private_rng(SecretStream.from_seed(5, "init")):
        c = _linear()
    with private_rng(SecretStream.from_seed(5, "init")):
        d = _linear()
    assert not torch.equal(a, b)
    assert torch.equal(c, d)
    # the module's own initialisation, unchanged: Kaiming-uniform within 1/sqrt(fan_in)
    bound = 1 / 16**0.5
    for w in (a, b, c):
        assert float(w.abs().max()) <= bound and float(w.std()) > 0.5 * bound / 3**0.5


def test_private_weights_are_not_the_seeded_ones():
    with seeded(0, "bottom", "p1"):
        public = _linear()
    with private_rng(SecretStream.fresh()):
        private = _linear()
    assert not torch.equal(public, private)


def test_the_callers_generator_is_left_as_it_was():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    with private_rng(SecretStream.fresh()):
        _linear()
        torch.rand(1000)
    assert torch.equal(torch.get_rng_state(), before)
