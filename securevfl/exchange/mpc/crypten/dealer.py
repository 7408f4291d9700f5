"""The trusted dealer's side of :class:`securevfl.exchange.mpc.crypten.pool.SecretTTP`.

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
(XOR for binary sharing). A weight initialisation (:class:`~securevfl.exchange.mpc.crypten.pool.Init`)
is drawn from the dealer's own fresh stream, which never leaves it.

The dealer is trusted not to collude with any party (semi-honest): it knows the
masks of every tuple, so with a party's openings it could unmask that party's
peers; it sees no value of the computation, and W^0 is independent of the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce

import torch

import securevfl.exchange.mpc.truncation as truncation
from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.mpc.crypten.api import count_wraps
from securevfl.exchange.mpc.crypten.pool import Init, Item, Trunc

__all__ = ["SecretDealer"]


class SecretDealer:
    """Every MPC party's tuple shares from the streams it shares with them; rank 0's
    shares of the correlated values as the answer (module docstring). The methods
    ``additive``, ``square``, ``binary``, ``wraps`` and ``B2A`` answer CrypTen's
    on-demand requests (as ``TTPServer``'s do); an offline plan is answered by
    :func:`securevfl.exchange.mpc.crypten.pool.dealer_bundle` with them, :meth:`trunc`,
    :meth:`init` and the pair triples of :func:`~securevfl.exchange.mpc.crypten.pool.pair_c0`."""

    def __init__(
        self,
        streams: Sequence[SecretStream],
        own: SecretStream | None = None,
        matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul,
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
