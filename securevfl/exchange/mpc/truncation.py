"""Exact truncation of additively shared ring elements with a dealer's material (pure).

Fixed-point multiplication doubles the fractional bits, so shared values are
divided by 2^f ("truncated") in shares. SecureML's local truncation (each party
divides its own share; CrypTen's two-party ``div_``) and CrypTen's wraps protocol
(which assumes x + r does not wrap) both fail with probability about |x| / 2^64
per element, adding +-2^(64 - f) to the result; over a run's 10^8 and more
truncations that happens (docs/design.md §13, "ring arithmetic never wraps silently").

Here the truncation is exact for every |x| < 2^62 (values within half the ring's
range at their precision), for any number of parties, in one opening:

1. the dealer shares a uniform mask r (every holder draws its share from the
   stream it shares with the dealer) and, per element, Q_0, Q_1, S_0, S_1
   (:func:`material`);
2. the parties open c = X + r mod 2^64 with X = x + 2^62 in [0, 2^63)
   (:func:`masked`; the first party adds the offset): c is uniform whatever x is;
3. X + r wrapped past 2^64 exactly when msb(r) = 1 and msb(c) = 0, so
   floor(X / 2^f) = floor(c / 2^f) - Q_{msb(c)} - [c mod 2^f < r mod 2^f] with
   Q_beta = floor(r / 2^f) - 2^(64 - f) msb(r) (1 - beta); each party takes its
   share of the Q that the public msb(c) selects (:func:`finish`).

The result V is floor(x / 2^f) or one more, the latter exactly when the low bits
of X + r carried, i.e. with probability (x mod 2^f) / 2^f over the mask: unbiased
stochastic rounding, the only randomness of the result. A second, scaled
truncation comes from the same opening: V = floor(c / 2^f) - off - Q as integers,
so floor(L V / 2^s) = floor(L (floor(c / 2^f) - off) / 2^s) - S_{msb(c)} (again
plus 0 or 1) with S_beta = floor(L Q_beta / 2^s), which the dealer computes; the
``mpc`` backend gets the momentum (V) and the weight step (L V / 2^s, L the
learning rate as a public integer) of SGD in one round this way.

Cost per element: the dealer sends rank 0 four ring elements; every other holder
draws five (r and its four shares), rank 0 one (r); each party sends its masked
share once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: inputs satisfy |x| < 2^OFFSET_BITS, so that x + 2^62 lies in [0, 2^63)
OFFSET_BITS = 62
_LOW32 = (1 << 32) - 1

__all__ = ["OFFSET_BITS", "finish", "masked", "material", "mul_shift"]


def _high(c: torch.Tensor, frac: int) -> torch.Tensor:
    """floor(c / 2^frac) of ring elements read as unsigned 64-bit integers."""
    return (c >> frac) & ((1 << (64 - frac)) - 1)


def mul_shift(scale: int, q: torch.Tensor, shift: int) -> torch.Tensor:
    """floor(scale * q / 2^shift) modulo 2^64, exactly, for int64 ``q`` and
    |scale| < 2^31 (the product can exceed 64 bits: q is split into 32-bit halves)."""
    if not -(1 << 31) < scale < (1 << 31) or not 0 <= shift <= 63:
        raise ValueError(f"scale {scale} or shift {shift} outside the exact range")
    hi, lo = q >> 32, q & _LOW32  # q = hi 2^32 + lo, lo in [0, 2^32)
    lo_prod = scale * lo  # |.| < 2^63
    carry, rest = lo_prod >> 32, lo_prod & _LOW32  # scale q = (scale hi + carry) 2^32 + rest
    top = scale * hi + carry  # |.| < 2^63
    if shift >= 32:
        return top >> (shift - 32)  # rest / 2^32 < 1 cannot change the floor
    return top * (1 << (32 - shift)) + (rest >> shift)  # wraps modulo 2^64, which is exact here


def material(
    r: torch.Tensor, frac: int, scale: int, shift: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dealer's plaintexts for masks ``r`` (the sum of every holder's share):
    Q_0, Q_1 and S_0 = floor(scale Q_0 / 2^shift), S_1 (module docstring)."""
    if not 1 <= frac <= OFFSET_BITS:
        raise ValueError(f"cannot truncate {frac} bits")
    q1 = _high(r, frac)
    wrap = (r < 0).long() << (64 - frac)  # 2^(64 - frac) msb(r), modulo 2^64 when frac = 1
    q0 = q1 - wrap
    return q0, q1, mul_shift(scale, q0, shift), mul_shift(scale, q1, shift)


def plain(t: Any) -> torch.Tensor:
    """The int64 tensor of a share: itself, or the ``data`` of CrypTen's CUDA share
    wrapper (this arithmetic runs on plain tensors wherever the shares live)."""
    return t if isinstance(t, torch.Tensor) else t.data


def masked(x: torch.Tensor, r: torch.Tensor, first: bool) -> torch.Tensor:
    """This party's share of c = x + 2^62 + r (the first party adds the offset)."""
    y = x + r
    return y + (1 << OFFSET_BITS) if first else y


def finish(
    c: torch.Tensor,
    shares: Sequence[torch.Tensor],
    frac: int,
    scale: int,
    shift: int,
    first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's shares of V = floor(x / 2^frac) (+ 0 or 1) and of
    floor(scale V / 2^shift) (+ 0 or 1), from the opened c and its shares of
    (Q_0, Q_1, S_0, S_1). Exact for |x| < 2^62."""
    c = plain(c)
    q0, q1, s0, s1 = (plain(t) for t in shares)
    beta = c < 0  # msb(c), public
    q = torch.where(beta, q1, q0)
    s = torch.where(beta, s1, s0)
    if not first:
        return -q, -s
    pub = _high(c, frac) - (1 << (OFFSET_BITS - frac))
    return pub - q, mul_shift(scale, pub, shift) - s
