"""The trusted dealer's side of :class:`securevfl.exchange.mpc.crypten.provider.SecretTTP`.

:class:`SecretDealer` replaces CrypTen's ``TTPServer``: it holds one
:class:`~securevfl.csprng.SecretStream` per MPC party, under the 256-bit key it
sent that party alone (:func:`securevfl.exchange.mpc.crypten.rng.dealer_keys`), and
draws from it exactly what the party draws, in the party's order: for each tuple,
the party's random shares first (a and b of a triple, r of a wraps pair, a
truncation mask, a random bit), then, for every holder but rank 0, its shares of
the tuple's correlated values. From the random shares it computes the correlated
values in the clear (c = a op b, r^2, a & b, the wraps count of r, the bit as a
ring element, the truncation material of :func:`securevfl.exchange.mpc.truncation.material`)
and returns rank 0's shares: each value minus the other holders' uniform shares
(XOR for binary sharing). A weight initialisation (:class:`~securevfl.exchange.mpc.crypten.items.Init`)
is drawn from the dealer's own fresh stream, which never leaves it.

The dealer is trusted not to collude with any party (semi-honest): it knows the
masks of every tuple, so with a party's openings it could unmask that party's
peers; it sees no value of the computation, and W^0 is independent of the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import torch

import securevfl.exchange.mpc.truncation as truncation
from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.mpc.crypten.api import count_wraps
from securevfl.exchange.mpc.crypten.items import Init, Item, PairStep, Triple, Trunc, Wraps

__all__ = ["SecretDealer", "dealer_bundle", "pair_c0", "pair_step_c0"]

RingProduct = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # an exact product in Z_2^64


class SecretDealer:
    """Every MPC party's tuple shares from the streams it shares with them; rank 0's
    shares of the correlated values as the answer (module docstring). The methods
    ``additive``, ``square``, ``binary``, ``wraps`` and ``B2A`` answer CrypTen's
    on-demand requests (as ``TTPServer``'s do); an offline plan is answered by
    :func:`securevfl.exchange.mpc.crypten.dealer.dealer_bundle` with them, :meth:`trunc`,
    :meth:`init` and the pair triples of :func:`~securevfl.exchange.mpc.crypten.dealer.pair_c0`."""

    def __init__(
        self,
        streams: Sequence[SecretStream],
        own: SecretStream | None = None,
        matmul: RingProduct = torch.matmul,
    ):
        """``matmul``: the ring product every triple's c = a b is computed with (the
        ``mpc`` backend passes its exact CPU kernel,
        :func:`securevfl.exchange.mpc.ringmatmul.ring_matmul`; torch's int64 product
        gives the same bits, slower on most CPUs)."""
        self.streams = list(streams)
        self.own = own if own is not None else SecretStream.fresh()
        self.matmul = matmul

    @property
    def n_mpc(self) -> int:
        return len(self.streams)

    def _holders(self, it: Item) -> list[int]:
        holders = list(it.holders(self.n_mpc))
        for h in holders:
            if not 0 <= h < self.n_mpc:
                raise ProtocolError(f"rank 0 asked the dealer for a tuple with rank {h}, not an MPC party")
        return holders

    def _randoms(self, holders: Sequence[int], size: Sequence[int], bits: int = 64) -> list[torch.Tensor]:
        return [self.streams[j].kbits(tuple(size), bits) for j in holders]

    def _share0(self, value: torch.Tensor, holders: Sequence[int], xor: bool = False) -> torch.Tensor:
        """Rank 0's share of ``value``: the other holders draw theirs (uniform)."""
        others = [self.streams[j].ring(tuple(value.shape)) for j in holders if j != 0]
        if xor:
            return reduce(torch.bitwise_xor, others, value)
        return value - sum(others) if others else value

    # -- CrypTen's tuples ------------------------------------------------------------------
    def additive(self, size0: torch.Size, size1: torch.Size, op: str) -> torch.Tensor:
        """c_0 of a Beaver triple shared by all MPC parties (``op``: mul or matmul)."""
        everyone = range(self.n_mpc)
        a = sum(self._randoms(everyone, size0))
        b = sum(self._randoms(everyone, size1))
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        c = self.matmul(a, b) if op == "matmul" else a * b
        return self._share0(c, everyone)

    def square(self, size: torch.Size) -> torch.Tensor:
        everyone = range(self.n_mpc)
        r = sum(self._randoms(everyone, size))
        assert isinstance(r, torch.Tensor)
        return self._share0(r * r, everyone)

    def binary(self, size0: torch.Size, size1: torch.Size) -> torch.Tensor:
        everyone = range(self.n_mpc)
        a = reduce(torch.bitwise_xor, self._randoms(everyone, size0))
        b = reduce(torch.bitwise_xor, self._randoms(everyone, size1))
        return self._share0(a & b, everyone, xor=True)

    def wraps(self, size: torch.Size) -> torch.Tensor:
        everyone = range(self.n_mpc)
        return self._share0(count_wraps(self._randoms(everyone, size)), everyone)

    def B2A(self, size: torch.Size) -> torch.Tensor:
        everyone = range(self.n_mpc)
        bit = reduce(torch.bitwise_xor, self._randoms(everyone, size, bits=1))
        return self._share0(bit, everyone)

    # -- securevfl's items -------------------------------------------------------------------
    def trunc(self, it: Trunc) -> torch.Tensor:
        """Rank 0's shares of Q_0, Q_1, S_0, S_1 (stacked) for one exact truncation."""
        holders = self._holders(it)
        r = sum(self._randoms(holders, it.size))
        assert isinstance(r, torch.Tensor)
        values = torch.stack(truncation.material(r, it.frac, it.scale, it.shift))
        return self._share0(values, holders)

    def init(self, it: Init) -> torch.Tensor:
        """Rank 0's share of W^0 ~ N(0, 1/(3 d)) at ``it.frac`` bits, drawn here."""
        holders = self._holders(it)
        w0 = (self.own.normal(it.size) * (it.std * 2**it.frac)).long()  # fixed point, as CrypTen encodes
        return self._share0(w0, holders)


# -- an offline plan's bundle ------------------------------------------------------------


def dealer_bundle(server: Any, plan: Sequence[Item]) -> torch.Tensor:
    """Rank 0's shares for ``plan`` (c_0 of each triple, theta_0 of each wraps pair,
    its truncation material and weight shares), flattened into one ring tensor.
    ``server`` is a :class:`securevfl.exchange.mpc.crypten.dealer.SecretDealer` whose
    per-party streams are aligned with the parties': it draws, per party, exactly
    what the party draws (see module doc)."""
    out = []
    for it in plan:
        if isinstance(it, Triple) and it.pair:
            out.append(pair_c0(server.streams, it, server.matmul).reshape(-1))
        elif isinstance(it, PairStep):
            out.append(pair_step_c0(server.streams, it, server.matmul))
        elif isinstance(it, Triple):
            out.append(server.additive(torch.Size(it.size0), torch.Size(it.size1), it.op).reshape(-1))
        elif isinstance(it, Wraps):
            out.append(server.wraps(torch.Size(it.size)).reshape(-1))
        elif isinstance(it, Trunc):
            out.append(server.trunc(it).reshape(-1))
        else:
            out.append(server.init(it).reshape(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def pair_c0(streams: Sequence[SecretStream], it: Triple, matmul: RingProduct = torch.matmul) -> torch.Tensor:
    """Rank 0's share c_0 = a b - c_i of a pair triple between ranks 0 and i = it.pair:
    a = a_0 + a_i and b = b_0 + b_i drawn from those two parties' streams in the
    order they draw them (a, b; then c_i at rank i), as CrypTen's ``TTPServer.additive``
    does for all parties. A pair naming a rank the dealer has no stream for is a
    protocol violation by rank 0."""
    if not 0 < it.pair < len(streams):
        raise ProtocolError(f"rank 0 asked the dealer for a triple with rank {it.pair}, not an MPC party")
    g0, gi = streams[0], streams[it.pair]
    s0, s1 = torch.Size(it.size0), torch.Size(it.size1)
    a = g0.ring(s0) + gi.ring(s0)
    b = g0.ring(s1) + gi.ring(s1)
    c = matmul(a, b)
    return c - gi.ring(c.size())


def pair_step_c0(
    streams: Sequence[SecretStream], it: PairStep, matmul: RingProduct = torch.matmul
) -> torch.Tensor:
    """Rank 0's shares of c, e and f of a :class:`PairStep` (flattened, in that
    order), from the two holders' draws in their order (:meth:`PairStep.draws`):
    u is rank i's alone, g rank 0's alone, v the sum of both; rank i then draws
    its shares of c, e, f."""
    if not 0 < it.pair < len(streams):
        raise ProtocolError(
            f"rank 0 asked the dealer for a step's tuples with rank {it.pair}, not an MPC party"
        )
    g0, gi = streams[0], streams[it.pair]
    (v0, g), (u, vi) = (g0.ring(s) for s in it.draws(True)), (gi.ring(s) for s in it.draws(False))
    v = v0 + vi
    values = (matmul(u, v), matmul(g, v.t()), matmul(u.t(), g))
    return torch.cat([(x - gi.ring(x.shape)).reshape(-1) for x in values])
