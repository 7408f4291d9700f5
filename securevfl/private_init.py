"""A model's private initialisation: its own initialisation code, drawing from
torch's generator in a state that comes whole from a secret stream.

A model factory (:mod:`securevfl.models`) initialises its parameters the way its
author wrote it (``nn.Linear``'s Kaiming-uniform, an orthogonal or a zero
initialisation, anything of its own) by drawing from torch's CPU generator. With
``init: seeded`` that generator is seeded from the protocol's shared seed, so
every party can compute the initial weights (SECURITY.md §7). With ``init:
private`` (the default for bottom models) :func:`private_rng` runs the
construction with the generator in a state drawn whole from the owner's
:class:`~securevfl.csprng.SecretStream`: all 624 32-bit words of its Mersenne
Twister (19,968 bits from AES-256-CTR under a fresh key), not a seed. There is
no seed to search (on the CPU torch keeps only 32 bits of one), and the
generator's outputs, the initial weights themselves, never leave the owner's
rank; recovering the state from its outputs needs 624 of them, that is, weights
its owner keeps. The caller's generator state is restored afterwards
(``torch.random.fork_rng``), so nothing else in the rank draws from it; as for
:func:`securevfl.seeding.seeded`, the generator is the process's, so a rank
builds its models in one thread.

The state layout is checked against a generator seeded with a known value, so a
torch version that changed it fails loudly instead of initialising from a
half-written state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from securevfl.csprng import SecretStream

_MT_WORDS = 624  # the Mersenne Twister's state, 32-bit words
# torch's CPU generator state (CPUGeneratorImplState): a uint64 seed, int32 left
# and seeded, uint64 next, then the 624 state words as uint64, then the cached
# normal samples
_LEFT, _SEEDED, _NEXT, _WORDS = 8, 12, 16, 24
_PROBE_SEED = 0x5EC0_2E11


def _template() -> np.ndarray:
    """A valid state to fill in, from a generator seeded with a known value,
    after checking the fields :func:`secret_state` relies on are where it writes."""
    g = torch.Generator()
    g.manual_seed(_PROBE_SEED)
    raw = g.get_state().numpy().copy()
    words = raw[_WORDS : _WORDS + 8 * _MT_WORDS].view("<u8")
    ok = (
        raw.size >= _WORDS + 8 * _MT_WORDS
        and int(raw[:8].view("<u8")[0]) == _PROBE_SEED
        and int(raw[_LEFT : _LEFT + 4].view("<i4")[0]) == 1
        and int(raw[_SEEDED : _SEEDED + 4].view("<i4")[0]) == 1
        and int(words[0]) == _PROBE_SEED  # MT19937's first state word is the seed itself
        and int(words.max()) < 2**32
    )
    if not ok:
        raise RuntimeError(
            f"torch {torch.__version__} lays out its CPU generator state differently from what "
            "securevfl.private_init expects; private model initialisation cannot run on it"
        )
    return raw


def secret_state(stream: SecretStream) -> torch.Tensor:
    """A CPU generator state whose 624 Mersenne Twister words come from
    ``stream``; the next draw re-mixes all of them (``left`` = 1)."""
    raw = _template()
    words = stream.kbits((_MT_WORDS,), 32).numpy().astype("<u8")
    raw[_WORDS : _WORDS + 8 * _MT_WORDS] = words.view(np.uint8)
    raw[_LEFT : _LEFT + 4] = np.array([1], dtype="<i4").view(np.uint8)
    raw[_NEXT : _NEXT + 8] = 0
    raw[:8] = 0  # the recorded seed: none (it is not the state's source)
    return torch.from_numpy(raw)


@contextlib.contextmanager
def private_rng(stream: SecretStream) -> Iterator[None]:
    """Run a block (a model's construction) with torch's CPU generator in a
    secret state drawn from ``stream``, then restore the caller's state."""
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(secret_state(stream))
        yield
