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

Half of each element is enough. MT's recurrence y[k] = y[k-227] ^ A(upper bit of
y[k-624] | lower 31 bits of y[k-623]) links words of both parities (227 and 623
are odd), and the upper bit of any word follows from two words of the other
parity, so the high 32-bit halves of 937 consecutive elements (every other
output) give every output after the first 1248 and with them the state
(:func:`clone_from_high_halves`). That is what an opening x - a exposes when x
is a small fixed-point value: the high half of the mask a, up to a carry.
Elements are made of two outputs in one of the :data:`LAYOUTS` (torch's randint,
or a keystream of little-endian 32-bit outputs read as 64-bit words).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

N, M = 624, 397
ELEMENTS = N // 2  # ring elements that hold one full state
HIGH_ELEMENTS = N + N // 2 + 1  # elements whose high halves alone give the state (937)
_MASK32 = 0xFFFFFFFF
_MATRIX_A = 0x9908B0DF


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


@dataclass(frozen=True)
class Layout:
    """How two consecutive 32-bit outputs make one 64-bit ring element:
    ``high_first``, the first output is the high half (torch's randint) or the low
    half (a little-endian keystream read as 64-bit words); ``offset``, 2^63 is
    subtracted (torch's randint over [-2^63, 2^63)) or not."""

    high_first: bool
    offset: bool

    def to_ring(self, words: np.ndarray) -> torch.Tensor:
        first, second = words[0::2].astype(np.uint64), words[1::2].astype(np.uint64)
        hi, lo = (first, second) if self.high_first else (second, first)
        u = (hi << np.uint64(32)) | lo
        if self.offset:
            u = u - np.uint64(2**63)
        return torch.from_numpy(u.view(np.int64).copy())

    def high_halves(self, x: np.ndarray) -> np.ndarray:
        """The output that is the high half of each element (``x`` as uint64)."""
        u = x.astype(np.uint64) + (np.uint64(2**63) if self.offset else np.uint64(0))
        return (u >> np.uint64(32)).astype(np.uint32)


TORCH = Layout(high_first=True, offset=True)  # CrypTen's generate_random_ring_element
KEYSTREAM = Layout(high_first=False, offset=False)  # 32-bit outputs as little-endian bytes
LAYOUTS = (TORCH, KEYSTREAM, Layout(True, False), Layout(False, True))


class Clone:
    """A generator rebuilt from 624 consecutive outputs; :meth:`ring` continues it."""

    def __init__(self, words: np.ndarray, layout: Layout = TORCH):
        if len(words) < N:
            raise ValueError("624 outputs are needed")
        self.state = [int(v) for v in _untemper(words[:N])]
        self.layout = layout

    @classmethod
    def from_state(cls, raw: np.ndarray, layout: Layout) -> Clone:
        """A generator whose last 624 raw (untempered) words were ``raw``."""
        return cls(_temper(np.asarray(raw, dtype=np.uint64)), layout)

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
        return self.layout.to_ring(self.words(2 * n))


def clone_from_ring(x: torch.Tensor) -> Clone:
    """The generator that drew these 312 (or more) consecutive ring elements, placed
    after the first 312 of them."""
    return Clone(ring_to_words(x[:ELEMENTS]))


def clone_from_high_halves(high: np.ndarray, layout: Layout) -> Clone:
    """The generator that drew :data:`HIGH_ELEMENTS` (or more) consecutive ring
    elements in ``layout``, from their high halves alone (module docstring),
    placed after the first :data:`HIGH_ELEMENTS` of them.

    With the known outputs at the even positions k of the window, every odd k
    from 625 on has its upper bit top(y[k]) = top(y[k-227]) ^ (y[k-623] & 1), and
    every odd k from 1249 on the whole word from y[k-227], y[k-623] and that bit."""
    n = HIGH_ELEMENTS
    if len(high) < n:
        raise ValueError(f"{n} high halves are needed")
    length = 2 * n
    y = np.zeros(length, dtype=np.uint64)
    y[0::2] = _untemper(np.asarray(high[:n], dtype=np.uint32))
    odd = np.arange(1, length, 2)
    top = np.zeros(length, dtype=np.uint64)
    m = odd[odd > N]
    top[m] = ((y[m - (N - M)] >> np.uint64(31)) ^ (y[m - N + 1] & np.uint64(1))) & np.uint64(1)
    k = odd[odd > 2 * N]
    x = (top[k - N] << np.uint64(31)) | (y[k - N + 1] & np.uint64(0x7FFFFFFF))
    twist = np.where((x & np.uint64(1)) == 1, np.uint64(_MATRIX_A), np.uint64(0))
    y[k] = y[k - (N - M)] ^ (x >> np.uint64(1)) ^ twist
    end = length - 1 if layout.high_first else length - 2  # the window's last output
    return Clone.from_state(y[end - N + 1 : end + 1], layout)
