"""The items of an offline plan: what the trusted dealer deals, as values.

Besides CrypTen's Beaver triples and wraps pairs (:class:`Triple`, :class:`Wraps`), a
plan of the ``mpc`` backend (:mod:`securevfl.exchange.mpc.plan`) holds its own items:
*pair* triples shared by rank 0 and one other rank alone (the pairwise layout's
evaluation products), :class:`PairStep`, the correlated tuples of one training step of
such a pair (three products from three masks, each opening reused), :class:`Trunc`
material for an exact truncation (:mod:`securevfl.exchange.mpc.truncation`) and
:class:`Init`, a weight's initial value W^0 ~ N(0, 1/(3 d)) drawn by the dealer and
given to its holders as uniformly random shares. Each item knows its shapes, its
holders, what rank 0 receives for it and its wire form (:mod:`.bundle` reads it
back); the parties draw for it in :mod:`.provider`, the dealer in :mod:`.dealer`.
Shape arithmetic only: nothing here imports CrypTen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


def _broadcast(s0: tuple[int, ...], s1: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s0), len(s1))
    a, b = (1,) * (n - len(s0)) + s0, (1,) * (n - len(s1)) + s1
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        raise ValueError(f"shapes {s0} and {s1} do not broadcast")
    return tuple(y if x == 1 else x for x, y in zip(a, b, strict=True))


@functools.lru_cache(maxsize=1024)
def product_shape(size0: tuple[int, ...], size1: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The shape of ``op(a, b)`` for a of ``size0`` and b of ``size1`` with torch's
    rules (``mul``: broadcasting; ``matmul``: torch.matmul's, 1-d operands and
    batch broadcasting included), ValueError where torch would refuse. Shape
    arithmetic only: every party and the dealer ask it for every item of every
    plan, and a product of meta tensors costs 50 us of Python each time."""
    if op != "matmul":
        return _broadcast(size0, size1)
    if not size0 or not size1:
        raise ValueError("matmul of a 0-d operand")
    x = (1, *size0) if len(size0) == 1 else size0
    y = (*size1, 1) if len(size1) == 1 else size1
    if x[-1] != y[-2]:
        raise ValueError(f"matmul of {size0} and {size1}: inner dimensions differ")
    out = (*_broadcast(x[:-2], y[:-2]), x[-2], y[-1])
    if len(size1) == 1:
        out = out[:-1]
    if len(size0) == 1:
        out = out[:-2] + out[-1:] if len(size1) > 1 else out[:-1]
    return out


@dataclass(frozen=True)
class Triple:
    """A Beaver triple for ``op`` (``mul`` or ``matmul``) of shapes a: size0, b: size1.

    ``pair`` 0 (CrypTen's triples): shared among all MPC parties. ``pair`` i > 0: a
    ``matmul`` triple shared between rank 0 and rank i alone (the ``mpc`` backend's
    pairwise layout, :mod:`securevfl.exchange.mpc.pairwise`): only those two draw
    their shares, and the dealer computes c from their two streams."""

    size0: tuple[int, ...]
    size1: tuple[int, ...]
    op: str = "matmul"
    pair: int = 0

    @property
    def out(self) -> tuple[int, ...]:
        """The shape of c (ValueError if a and b do not multiply)."""
        return product_shape(self.size0, self.size1, self.op)

    @property
    def received(self) -> int:
        """Ring elements rank 0 receives for this item (c_0)."""
        return math.prod(self.out)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        """The MPC ranks that hold a share of this triple."""
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        if self.pair:
            return ["pair", self.pair, torch.Size(self.size0), torch.Size(self.size1)]
        return ["additive", torch.Size(self.size0), torch.Size(self.size1), self.op]


@dataclass(frozen=True)
class Wraps:
    """A truncation pair of CrypTen's wraps protocol: [r] and [theta_r] of one shape."""

    size: tuple[int, ...]

    @property
    def out(self) -> tuple[int, ...]:
        return self.size

    @property
    def received(self) -> int:
        return math.prod(self.size)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["wraps", torch.Size(self.size)]


class TruncShares(NamedTuple):
    """One party's material for an exact truncation: its share of the mask r and of
    Q_0, Q_1, S_0, S_1 (:func:`securevfl.exchange.mpc.truncation.material`)."""

    r: torch.Tensor
    q0: torch.Tensor
    q1: torch.Tensor
    s0: torch.Tensor
    s1: torch.Tensor

    @property
    def material(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q0, self.q1, self.s0, self.s1


@dataclass(frozen=True)
class Trunc:
    """Material for one exact truncation of ``size`` elements by 2^frac, and of the
    result times ``scale`` by 2^shift (:mod:`securevfl.exchange.mpc.truncation`): a mask
    r every holder draws, and four correlated values per element. ``pair`` as
    :class:`Triple`'s."""

    size: tuple[int, ...]
    frac: int
    scale: int
    shift: int
    pair: int = 0

    @property
    def received(self) -> int:
        return 4 * math.prod(self.size)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["trunc", self.pair, torch.Size(self.size), self.frac, self.scale, self.shift]


@dataclass(frozen=True)
class Init:
    """A weight block's initial value, W^0 ~ N(0, 1/(3 d)) for ``size`` = (d, out)
    (the variance of torch's default Linear initialisation), encoded at ``frac``
    fractional bits: drawn by the dealer and shared among the holders (``pair`` as
    :class:`Triple`'s) as uniformly random ring shares."""

    size: tuple[int, ...]
    frac: int
    pair: int = 0

    @property
    def received(self) -> int:
        return math.prod(self.size)

    @property
    def std(self) -> float:
        return (1.0 / (3.0 * self.size[0])) ** 0.5

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair) if self.pair else tuple(range(n_mpc))

    def to_wire(self) -> list[Any]:
        return ["init", self.pair, torch.Size(self.size), self.frac]


class StepShares(NamedTuple):
    """One holder's part of a :class:`PairStep`: its share of v and of the products
    c = u v, e = g v^T, f = u^T g, and the one-sided masks it holds whole: u at
    rank i (None at rank 0), g at rank 0 (None at rank i)."""

    u: torch.Tensor | None
    v: torch.Tensor
    g: torch.Tensor | None
    c: torch.Tensor
    e: torch.Tensor
    f: torch.Tensor


@dataclass(frozen=True)
class PairStep:
    """The correlated tuples of one training step of a pair's product h' W
    (h' of ``batch`` x ``dim``, W of ``dim`` x ``width``) between rank 0 (A) and rank
    ``pair`` (P_i) alone: masks u for h', v for W and g for dL/dz, and the three
    products the step needs, c = u v (forward, h' W), e = g v^T (dL/dz W^T) and
    f = u^T g (h'^T dL/dz), additively shared between the two.

    Each value the step multiplies is masked once and its opening serves every
    product it enters (SecureML's matrix triples reused across forward and
    backward: Mohassel and Zhang 2017, section 4.2): h' - u and W - v are opened
    in the forward pass and reused in the backward one, and dL/dz - g is the
    backward pass's only opening.

    Masks are one-sided where the value is: h' is P_i's own, so P_i holds u whole
    (drawn from its stream) and sends h' - u to A alone; dL/dz is A's, so A holds
    g whole and sends dL/dz - g to P_i alone. The receiver of each such opening
    knows nothing of its mask, and the sender learns nothing from it (its own
    value); W is nobody's, so v is shared and W - v opened both ways. A party's
    share of a one-sided mask is then zero, which drops a third of the parties'
    Beaver products and halves those openings' bytes."""

    batch: int
    dim: int
    width: int
    pair: int

    @property
    def masks(self) -> tuple[tuple[int, int], ...]:
        """Shapes of u, v, g."""
        return (self.batch, self.dim), (self.dim, self.width), (self.batch, self.width)

    def draws(self, rank0: bool) -> tuple[tuple[int, int], ...]:
        """The masks a holder draws from its dealer stream, in order: rank 0 its share
        of v, then g whole; rank i u whole, then its share of v."""
        u, v, g = self.masks
        return (v, g) if rank0 else (u, v)

    @property
    def products(self) -> tuple[tuple[int, int], ...]:
        """Shapes of c, e, f."""
        return (self.batch, self.width), (self.batch, self.dim), (self.dim, self.width)

    @property
    def received(self) -> int:
        return sum(math.prod(s) for s in self.products)

    def holders(self, n_mpc: int) -> tuple[int, ...]:
        return (0, self.pair)

    def to_wire(self) -> list[Any]:
        return ["step", self.pair, self.batch, self.dim, self.width]


Item = Triple | Wraps | Trunc | Init | PairStep


def plan_elements(plan: Sequence[Item]) -> int:
    """Ring elements rank 0 receives for ``plan`` (its shares of every correlated value)."""
    return sum(it.received for it in plan)


def pooled_bytes(plan: Sequence[Item]) -> int:
    """Bytes one party holds for ``plan`` once pooled (a, b, c; r, theta; r and the
    four truncation values; a weight share)."""
    n = 0
    for it in plan:
        if isinstance(it, Triple):
            n += math.prod(it.size0) + math.prod(it.size1) + math.prod(it.out)
        elif isinstance(it, Wraps):
            n += 2 * math.prod(it.size)
        elif isinstance(it, Trunc):
            n += 5 * math.prod(it.size)
        elif isinstance(it, PairStep):
            n += sum(math.prod(s) for s in (*it.draws(False), *it.products))
        else:
            n += math.prod(it.size)
    return 8 * n
