"""Mersenne Twister state recovery from ring elements (an attacker's tool, never
imported by securevfl).

MT19937 outputs its 624-word state, tempered, one word at a time; tempering is a
bijection, so 624 consecutive outputs give the state and every later output
follows (Matsumoto and Nishimura 1998). torch's CPU generator is MT19937, and
``torch.randint(-2**63, 2**63 - 1, ..., dtype=torch.long)`` (CrypTen's
``generate_random_ring_element``) draws each element from two consecutive 32-bit
outputs, the first as the high word: x = ((hi << 32) | lo) - 2^63 mod 2^64 (the
range is 2^64 - 1 wide, so one value in 2^64 would differ). 312 consecutive ring
elements therefore give the generator away.
"""

from __future__ import annotations

import numpy as np
import torch

N, M = 624, 397
ELEMENTS = N // 2  # ring elements that hold one full state
_MASK32 = 0xFFFFFFFF


def _temper(y: np.ndarray) -> np.ndarray:
    y = y.astype(np.uint64)
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    return (y & np.uint64(_MASK32)).astype(np.uint32)


def _untemper(y: np.ndarray) -> np.ndarray:
    y = y.astype(np.uint64) & np.uint64(_MASK32)
    y ^= y >> np.uint64(18)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    t = y.copy()
    for _ in range(5):  # y ^= (y << 7) & B, undone 7 bits at a time
        t = y ^ ((t << np.uint64(7)) & np.uint64(0x9D2C5680))
    y = t & np.uint64(_MASK32)
    t = y.copy()
    for _ in range(3):  # y ^= y >> 11, undone 11 bits at a time
        t = y ^ (t >> np.uint64(11))
    return (t & np.uint64(_MASK32)).astype(np.uint32)


def ring_to_words(x: torch.Tensor) -> np.ndarray:
    """The 32-bit outputs torch's randint consumed for these full-ring int64 elements."""
    u = x.contiguous().numpy().view(np.uint64) + np.uint64(2**63)
    words = np.empty(2 * len(u), dtype=np.uint32)
    words[0::2] = (u >> np.uint64(32)).astype(np.uint32)
    words[1::2] = (u & np.uint64(_MASK32)).astype(np.uint32)
    return words


def words_to_ring(words: np.ndarray) -> torch.Tensor:
    u = (words[0::2].astype(np.uint64) << np.uint64(32)) | words[1::2].astype(np.uint64)
    return torch.from_numpy((u - np.uint64(2**63)).view(np.int64).copy())


class Clone:
    """A generator rebuilt from 624 consecutive outputs; :meth:`ring` continues it."""

    def __init__(self, words: np.ndarray):
        if len(words) < N:
            raise ValueError("624 outputs are needed")
        self.state = [int(v) for v in _untemper(words[:N])]

    def words(self, n: int) -> np.ndarray:
        mt = self.state
        for _ in range(n):
            k = len(mt) - N
            y = (mt[k] & 0x80000000) | (mt[k + 1] & 0x7FFFFFFF)
            mt.append(mt[k + M] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0))
        out = np.array(mt[-n:], dtype=np.uint64) if n else np.zeros(0, dtype=np.uint64)
        del mt[: len(mt) - N]
        return _temper(out)

    def ring(self, n: int) -> torch.Tensor:
        """The next ``n`` ring elements the generator would draw."""
        return words_to_ring(self.words(2 * n))


def clone_from_ring(x: torch.Tensor) -> Clone:
    """The generator that drew these 312 (or more) consecutive ring elements, placed
    after the first 312 of them."""
    return Clone(ring_to_words(x[:ELEMENTS]))
