"""Exact integer arithmetic of ``paillier``'s share protocol (pure functions).

The weight shares, their momentum, the masks and every masked plaintext of the
two-party protocol (:mod:`securevfl.exchange.he.protocol`) are integers at one fixed-point
scale, held as numpy ``object`` arrays of Python ints: a mask that statistically
hides a value needs the value's bits plus about 75 more (package docstring,
"Masks"), which neither float64 (53 bits) nor int64 can hold. What is here:

- :func:`from_float` / :func:`to_float`: float64 <-> integers at 2^-frac (exact
  one way, correctly rounded the other);
- :func:`uniform`: uniform integers in [-2^(bits-1), 2^(bits-1)) from a
  :class:`~securevfl.csprng.SecretStream` (raw keystream bits, no rejection);
- :func:`scaled`: c x v rounded to the nearest integer for a float64 c (exact:
  c is a dyadic rational), the learning-rate and momentum products of SGD;
- :func:`shift_round`: v / 2^k rounded to the nearest integer (rescaling);
- :func:`matmul`: exact a @ b for int64 a and big-integer b, by 24-bit limbs of
  b through int64 products;
- :func:`to_limbs` / :func:`from_limbs`: the wire form, little-endian int64
  limbs (two's complement over 64 x limbs bits), refusing a value that does not
  fit (:func:`limbs_for` gives the fewest that hold a matrix).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from securevfl.csprng import SecretStream

LIMB = 64
_MASK64 = (1 << 64) - 1


def ints(values: Any) -> np.ndarray:
    """An object array of Python ints (from an int array, a list or an object array)."""
    a = np.asarray(values)
    out = np.empty(a.shape, dtype=object)
    out.ravel()[:] = [int(v) for v in a.ravel().tolist()]
    return out


def from_float(x: np.ndarray, frac: int) -> np.ndarray:
    """round(x 2^frac) as Python ints; x must be finite (ldexp is exact, so the only
    rounding is the final one to an integer)."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("exact: a value to encode is not finite")
    return ints(np.rint(np.ldexp(x, frac)).tolist())


def to_float(v: np.ndarray, frac: int) -> np.ndarray:
    """v 2^-frac as float64 (each int correctly rounded to 53 bits, then scaled)."""
    v = np.asarray(v)
    if v.dtype != object:
        return np.ldexp(v.astype(np.float64), -frac)
    out = np.fromiter((math.ldexp(float(t), -frac) for t in v.ravel().tolist()), np.float64, v.size)
    return out.reshape(v.shape)


def uniform(stream: SecretStream, shape: tuple[int, ...], bits: int) -> np.ndarray:
    """Uniform integers in [-2^(bits-1), 2^(bits-1)), exactly: ``bits`` raw keystream
    bits per value (every value of the range equally likely)."""
    if bits < 1:
        raise ValueError("exact: a uniform draw needs at least one bit")
    n = math.prod(shape)
    words = -(-bits // LIMB)
    raw = np.frombuffer(stream.bytes(8 * words * n), dtype="<u8").reshape(n, words)
    acc = ints(raw[:, 0])
    for k in range(1, words):
        acc = acc + (ints(raw[:, k]) << (LIMB * k))
    out = (acc >> (LIMB * words - bits)) - (1 << (bits - 1))
    return out.reshape(shape)


def scaled(c: float, v: np.ndarray) -> np.ndarray:
    """round(c v) for a finite float64 c, exactly (c = p / 2^k as a fraction; ties up)."""
    p, q = float(c).as_integer_ratio()
    if q == 1:
        return v * p
    return (v * p + (q >> 1)) // q


def shift_round(v: np.ndarray, k: int) -> np.ndarray:
    """round(v / 2^k) (ties up); k >= 0."""
    if k == 0:
        return v
    return (v + (1 << (k - 1))) >> k


def bit_length(v: np.ndarray) -> int:
    """Bits of the largest |value| (0 for an empty or all-zero array)."""
    v = np.asarray(v)
    if v.size == 0:
        return 0
    return max(abs(int(t)).bit_length() for t in v.ravel().tolist())


def signed_bits(v: np.ndarray) -> int:
    """The smallest m with every value in [-2^(m-1), 2^(m-1)) (two's complement width)."""
    v = np.asarray(v)
    if v.size == 0:
        return 1
    return 1 + max((t if t >= 0 else ~t).bit_length() for t in map(int, v.ravel().tolist()))


def matmul(a: np.ndarray, b: np.ndarray, a_bits: int) -> np.ndarray:
    """Exact a @ b (Python ints) for int64 a with |a| <= 2^a_bits and integer b of
    any size: b is cut into t-bit limbs with t chosen so that every partial product
    sum stays within int64, and the limb products are recombined as Python ints."""
    a = np.asarray(a, dtype=np.int64)
    k = a.shape[1]
    t = 62 - a_bits - max(0, (k - 1).bit_length())
    if t < 8:  # too wide for int64 partial sums: plain big-integer products
        return ints(a) @ np.asarray(b, dtype=object)
    bb = np.asarray(b, dtype=object)
    nbits = bit_length(bb)
    nlimbs = max(1, -(-(nbits + 1) // t))
    low = (1 << t) - 1
    out: np.ndarray | None = None
    rest = bb
    for i in range(nlimbs):
        last = i == nlimbs - 1
        limb = rest if last else rest & low  # the top limb keeps the sign
        part = ints(a @ limb.astype(np.int64)) << (t * i) if i else ints(a @ limb.astype(np.int64))
        out = part if out is None else out + part
        rest = rest >> t
    assert out is not None
    return out


def to_limbs(v: np.ndarray, limbs: int) -> np.ndarray:
    """v as int64 limbs, little-endian, shape v.shape + (limbs,): two's complement over
    64 x limbs bits. A value outside [-2^(64 limbs - 1), 2^(64 limbs - 1)) raises
    OverflowError (a wire form never wraps)."""
    flat = np.asarray(v, dtype=object).ravel()
    width = signed_bits(flat)
    if width > LIMB * limbs:
        raise OverflowError(f"exact: a value of {width} bits does not fit {limbs} limbs of 64 bits")
    out = np.empty((flat.size, limbs), dtype=np.uint64)
    rest = flat
    for k in range(limbs):
        out[:, k] = (rest & _MASK64).astype(np.uint64)
        rest = rest >> LIMB
    return out.view(np.int64).reshape(*np.shape(v), limbs)


def from_limbs(t: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_limbs`: int64 limbs (last axis) -> Python ints."""
    t = np.asarray(t, dtype=np.int64)
    limbs = t.shape[-1]
    flat = t.reshape(-1, limbs)
    acc = ints(flat[:, limbs - 1])  # signed top limb
    for k in range(limbs - 2, -1, -1):
        acc = (acc << LIMB) + ints(flat[:, k].view(np.uint64))
    return acc.reshape(t.shape[:-1])


def limbs_for(v: np.ndarray) -> int:
    """The fewest 64-bit limbs that hold every value of v."""
    return max(1, -(-signed_bits(v) // LIMB))
