"""The ``paillier`` HE scheme for :mod:`securevfl.exchange.he.protocol`: key and peer
factories and the exact share arithmetic, sized for the run (its load-time checks:
:mod:`.checks`)."""

from __future__ import annotations

from pydantic import BaseModel

from securevfl.exchange.base import ExchangeContext
from securevfl.exchange.he.scheme import HEScheme, ShareArith
from securevfl.exchange.paillier.arith import PaillierArith
from securevfl.exchange.paillier.checks import params_for
from securevfl.exchange.paillier.options import PaillierOptions, Params
from securevfl.exchange.paillier.peer import PaillierPeer
from securevfl.exchange.paillier.scheme import PaillierKey
from securevfl.exchange.paillier.wire import load_public


class PaillierScheme(HEScheme):
    options = PaillierOptions

    def __init__(self, options: BaseModel, params: Params | None = None):
        super().__init__(options)
        assert isinstance(options, PaillierOptions)
        self.prm = params or Params.of(options)

    @classmethod
    def for_run(cls, ctx: ExchangeContext) -> PaillierScheme:
        """Sized for the run's shape: the per-value widths follow from the values and
        ciphertexts a run of ``run_steps`` passes makes (:class:`Params`)."""
        assert isinstance(ctx.options, PaillierOptions)
        return cls(ctx.options, params_for(ctx.proto, ctx.options, list(ctx.embed_dims)))

    def arith(self) -> ShareArith:
        return PaillierArith(self, self.prm)

    def new_key(self) -> PaillierKey:
        return PaillierKey(self.prm, self.opts.key_bits)  # type: ignore[attr-defined]

    def peer(self, public: bytes, *, sender: str) -> PaillierPeer:
        n = load_public(public, sender, self.opts.key_bits)  # type: ignore[attr-defined]
        return PaillierPeer(self.prm, n, sender)

    def value_bound(self) -> float:
        """2^value_bits: every encrypted value must lie below it (the fixed-point slots
        are sized for that); P_i clips h'_i's rows and A scales dL/dz to l2 norm just
        under it before encrypting (:mod:`securevfl.exchange.he.bounds`), which bounds
        every entry too."""
        return 2.0**self.prm.v

    def share_bits(self) -> int:
        """P_i's weight share is re-drawn uniform in [-2^k, 2^k) every step, k =
        weight_bits + sigma - 1 (:attr:`Params.share`), so that A's share hides W_i
        within the run's bound and the plaintext operands stay bounded (he/protocol.py)."""
        return self.prm.share
