"""Two-party arithmetic on raw CrypTen ring shares (Z_2^64 as torch int64).

Pure functions used by the pairwise share layout (:mod:`.pairwise`), where each
passive party's products are shared between A and that party alone, so CrypTen's
protocols, which always span every MPC party, cannot run them. They are the same
arithmetic as CrypTen's: fixed-point encoding as ``FixedPointEncoder.encode``,
Beaver's product as ``crypten.mpc.primitives.beaver.matmul`` (the first party adds
eps delta).

Truncation is exact, with the dealer's material (:mod:`securevfl.exchange.mpc.truncation`).
SecureML's local truncation (:func:`truncate`: each party divides its own share,
CrypTen's two-party ``div_``) is kept only as the reference the tests compare
against: it fails, adding +-2^(64 - f), with probability about |x| / 2^64 per
element when the shares wrap, which over a run of 10^8 truncations happens
(docs/design.md §13).
"""

from __future__ import annotations

import torch

from securevfl.exchange.mpc.ringmatmul import beaver_terms, ring_matmul_sum


def encode(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A float tensor at ``bits`` fractional bits, truncated toward zero as CrypTen does."""
    return (2**bits * x).long()


def decode(share_sum: torch.Tensor, bits: int) -> torch.Tensor:
    """The float64 value of an opened ring element at ``bits`` fractional bits."""
    return share_sum.double() / 2**bits


def masked(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """This party's share of x - a (x's share minus the triple's mask share)."""
    return x - a


def beaver_share(
    eps: torch.Tensor, delta: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, first: bool
) -> torch.Tensor:
    """This party's share of x @ y from the opened eps = x - a, delta = y - b and its
    shares of the triple (a, b, c = a b): c + eps b + a delta, plus eps delta at the
    first party only (Beaver 1991; CrypTen's ``beaver.matmul``). The result carries
    the operands' precisions added (untruncated)."""
    return c + beaver_terms(eps, delta, a, b, first=first)


def product_share(
    eps: torch.Tensor,
    delta: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    c: torch.Tensor,
    first: bool,
) -> torch.Tensor:
    """:func:`beaver_share` where a mask may be one-sided: ``a`` or ``b`` None is
    this party's share of a mask the other party holds whole (so zero here), and the
    product with it is skipped: c + eps b + a delta (+ eps delta at the first
    party) over the terms that are not zero, as one ring product
    (:func:`securevfl.exchange.mpc.ringmatmul.ring_matmul_sum`)."""
    terms = []
    if first:
        terms.append((eps, delta if b is None else b + delta))
    elif b is not None:
        terms.append((eps, b))
    if a is not None:
        terms.append((a, delta))
    if not terms:
        return c.clone()
    return c + ring_matmul_sum(terms)


def truncate(share: torch.Tensor, bits: int) -> torch.Tensor:
    """SecureML's local truncation, **not exact** (module docstring): this party's
    share of about x / 2^bits with two parties, each dividing its own share
    (CrypTen's two-party ``div_``). securevfl truncates with
    :func:`securevfl.exchange.mpc.truncation.finish`."""
    return share.div(2**bits, rounding_mode="trunc")
