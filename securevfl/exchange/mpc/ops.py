"""Batched secret-sharing operations on CrypTen's arithmetic shares.

CrypTen runs one protocol per tensor operation: every Beaver product opens its
own (x - a, y - b), every product is truncated on its own (with more than two
parties, a dealer request plus a gather to rank 0), every reveal is one
collective. The interactive layer's step has independent products (the k
forward products; the 2k backward ones), so these functions run each group in
the rounds one product needs:

* :func:`beaver_matmuls`: any number of independent products, their masked
  operands opened in **one** all-reduce (Beaver's protocol as in CrypTen's
  ``beaver.matmul``, triples from CrypTen's default provider); the products are
  returned *untruncated* (precision = sum of the operands'), so a sum of products
  or a value that is about to be revealed needs no truncation in shares;
* :func:`reveal_to`: each tensor opened to its own destination party, all in one
  round of concurrent point-to-point messages (CrypTen would run one reduce per
  destination, one after the other);
* :func:`reveal_and_truncate`: that reveal and, in the same round, the opening of
  an exact truncation of a list of tensors (:mod:`securevfl.exchange.mpc.truncation`,
  the dealer's material): each value divided by 2^f, and that result times a public
  scale divided by 2^s, both from one opening. CrypTen's own ``div_`` is never used:
  with two parties it divides each share locally and with more it runs the wraps
  protocol, both of which wrap silently with probability about |x| / 2^64.

Who learns what is CrypTen's: the openings are x - a and y - b for fresh
uniformly random a, b, and x + 2^62 + r for a fresh uniformly random r; a reveal
goes to its destination only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

import securevfl.exchange.mpc.truncation as truncation
from securevfl.exchange.mpc.crypten.api import ArithmeticSharedTensor, comm, crypten, torch_cat
from securevfl.exchange.mpc.crypten.items import Trunc, TruncShares
from securevfl.exchange.mpc.ringmatmul import RingProducts, beaver_terms

# CrypTen's ArithmeticSharedTensor; typed loosely (CrypTen ships no type information)
Shared = Any


def fixed_scalar(x: float, bits: int = 16) -> tuple[int, int]:
    """An integer L and shift s with L / 2^s = x to ``bits`` significant bits:
    s = bits when |x| >= 1, otherwise large enough that |L| >= 2^bits. CrypTen
    encodes a public factor at a fixed 2^-16 resolution, so a learning rate
    divided by the batch size (0.05 / 256 = 1.95e-4) becomes 12 / 2^16, 6% low."""
    if x == 0:
        return 0, bits
    s = bits + max(0, -math.floor(math.log2(abs(x))))
    return round(x * 2**s), s


def shares(x: Shared) -> torch.Tensor:
    return x.share


def from_shares(t: torch.Tensor, precision: int) -> Shared:
    return ArithmeticSharedTensor.from_shares(t, precision=precision)


def precision(x: Shared) -> int:
    return int(x.encoder._precision_bits)


def scaled(x: Shared, k: int, extra_bits: int) -> Shared:
    """k * x as shares (local), its precision raised by ``extra_bits`` (k encodes a
    public factor at 2^extra_bits)."""
    return from_shares(x.share * k, precision(x) + extra_bits)


def transpose(x: Shared) -> Shared:
    return from_shares(x.share.t(), precision(x))


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, at = [], 0
    for t in like:
        n = t.numel()
        out.append(flat[at : at + n].reshape(t.shape))
        at += n
    return out


def _cat(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Flat concatenation (CrypTen's torch_cat: also for its CUDALongTensor shares)."""
    return torch_cat([v.reshape(-1) for v in values])


def open_all(values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Sum every party's share of each value: one all-reduce of their concatenation."""
    flat = _cat(values)
    return _split(comm.get().all_reduce(flat), values)


def beaver_matmuls(pairs: Sequence[tuple[Shared, Shared]]) -> list[Shared]:
    """[x_j @ y_j] for every pair, with one opening round for all of them.

    z = c + eps @ b + a @ delta + eps @ delta (the last term added by rank 0
    only), eps = x - a and delta = y - b opened together. The result is not
    truncated: its precision is the sum of the operands'."""
    provider = crypten.mpc.get_default_provider()
    with RingProducts():  # a provider that computes c = a b here (CrypTen's TFP) gets the ring kernel
        triples = [
            provider.generate_additive_triple(x.size(), y.size(), "matmul", device=x.device) for x, y in pairs
        ]
    masked = []
    for (x, y), (a, b, _) in zip(pairs, triples, strict=True):
        masked += [x.share - a.share, y.share - b.share]
    opened = open_all(masked)
    rank = comm.get().get_rank()
    out = []
    for j, ((x, y), (a, b, c)) in enumerate(zip(pairs, triples, strict=True)):
        eps, delta = opened[2 * j], opened[2 * j + 1]
        z = c.share + beaver_terms(eps, delta, a.share, b.share, first=rank == 0)
        out.append(from_shares(z, precision(x) + precision(y)))
    return out


def reveal_to(values: Sequence[Shared], dsts: Sequence[int]) -> torch.Tensor | None:
    """Open values[j] to rank dsts[j] alone, all in one round; returns the decoded
    (float64) value this rank is the destination of, or None."""
    got = comm.get().reveal_many([v.share for v in values], list(dsts))
    me = comm.get().get_rank()
    for v, dst, t in zip(values, dsts, got, strict=True):
        if dst == me:
            assert t is not None
            return t.double() / 2 ** precision(v)
    return None


def trusted_first_party_material(item: Trunc) -> TruncShares:
    """Truncation material under CrypTen's insecure TFP provider (no dealer): rank 0
    draws the mask and computes the material in the clear, as TFP does for every
    tuple, and shares each value from its own rank."""
    rank = comm.get().get_rank()
    values: list[Any] = [None] * 5
    if rank == 0:
        r = crypten.generators["local"][torch.device("cpu")].ring(item.size)
        values = [r, *truncation.material(r, item.frac, item.scale, item.shift)]
    shares = [ArithmeticSharedTensor(v, size=item.size, precision=0, src=0).share for v in values]
    return TruncShares(*shares)


def reveal_and_truncate(
    values: Sequence[Shared],
    dsts: Sequence[int],
    raws: Sequence[Shared],
    material: TruncShares,
    frac: int,
    scale: tuple[int, int],
) -> tuple[torch.Tensor | None, list[Shared], list[Shared]]:
    """:func:`reveal_to` of ``values`` and, in the same round, one exact truncation
    of ``raws`` (their concatenation, |x| < 2^62 each): returns the decoded value
    this rank is the destination of (or None), each raw / 2^frac (precision lowered
    by ``frac``) and each of those times L / 2^s for ``scale`` = (L, s) (the same
    precision). ``material`` is this party's :class:`Trunc` shares for the
    concatenation (CPU tensors: the truncation's arithmetic runs on the CPU)."""
    c = comm.get()
    first = c.get_rank() == 0
    device = raws[0].share.device
    flat = torch.cat([v.share.cpu().reshape(-1) for v in raws])  # the truncation's arithmetic on the CPU
    mask = truncation.masked(flat, material.r, first)
    got, opened = c.reveal_open([v.share for v in values], list(dsts), mask)
    me = c.get_rank()
    mine = None
    for v, dst, t in zip(values, dsts, got, strict=True):
        if dst == me:
            assert t is not None
            mine = truncation.plain(t).double() / 2 ** precision(v)
    lr, shift = scale
    # the opening comes back where the shares live (CUDA under the joint layout on a GPU)
    opened = truncation.plain(opened).cpu()
    low, step = truncation.finish(opened, material.material, frac, lr, shift, first)
    like = [v.share for v in raws]
    lows = [
        from_shares(p.to(device), precision(v) - frac) for p, v in zip(_split(low, like), raws, strict=True)
    ]
    steps = [
        from_shares(p.to(device), precision(v) - frac) for p, v in zip(_split(step, like), raws, strict=True)
    ]
    return mine, lows, steps
