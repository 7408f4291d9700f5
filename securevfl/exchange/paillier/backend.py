"""The ``paillier`` HE scheme for :mod:`securevfl.exchange.he`: key and peer
factories, the exact share arithmetic, and the load-time refusal of insecure
parameters."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.base import ExchangeContext
from securevfl.exchange.he import HEScheme, ShareArith, he_backend
from securevfl.exchange.paillier.arith import PaillierArith
from securevfl.exchange.paillier.options import (
    MIN_DISTANCE_BITS,
    MIN_KEY_BITS,
    PaillierOptions,
    Params,
)
from securevfl.exchange.paillier.peer import PaillierPeer
from securevfl.exchange.paillier.scheme import PaillierKey
from securevfl.exchange.paillier.wire import load_public


def _embed_dims(proto: Protocol) -> list[int]:
    return [(p.model or ModelSpec()).out for p in proto.parties.passive]


def params_for(proto: Protocol, options: PaillierOptions, dims: list[int] | None = None) -> Params:
    """The parameters of a run of this protocol (its batch, embedding and output sizes)."""
    return Params.of(options, proto.training.batch_size, dims or _embed_dims(proto), proto.interactive.out)


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
        under it before encrypting (:mod:`securevfl.exchange.bounds`), which bounds
        every entry too."""
        return 2.0**self.prm.v

    def share_bits(self) -> int:
        """P_i's weight share is re-drawn uniform in [-2^k, 2^k) every step, k =
        weight_bits + sigma - 1 (:attr:`Params.share`), so that A's share hides W_i
        within the run's bound and the plaintext operands stay bounded (he.py)."""
        return self.prm.share

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, PaillierOptions)
        o = options
        prm = params_for(proto, o)

        def bad(field: str, why: str, crypto: bool = False) -> ConfigError:
            kind = CryptoParameterError if crypto else ConfigError
            return kind(why, path=f"exchange.params.{field}")

        if o.key_bits < MIN_KEY_BITS:
            raise bad(
                "key_bits",
                f"key_bits={o.key_bits} is below the {MIN_KEY_BITS}-bit floor: a Paillier modulus "
                "is broken by factoring it, and moduli under 2048 bits give less than 112-bit "
                "security (NIST SP 800-57; 3072 bits for 128-bit)",
                crypto=True,
            )
        if o.distance_bits < MIN_DISTANCE_BITS:
            raise bad(
                "distance_bits",
                f"distance_bits={o.distance_bits} is below {MIN_DISTANCE_BITS}: the masks and "
                f"obfuscators of a whole run must stay within statistical distance 2^-{MIN_DISTANCE_BITS} "
                "of ideal ones",
                crypto=True,
            )
        steps = proto.training.max_steps
        if steps is not None and steps > o.run_steps:
            raise bad(
                "run_steps",
                f"training.max_steps={steps} exceeds run_steps={o.run_steps}: the statistical bound "
                f"of the masks covers {o.run_steps} passes through the interactive layer (training "
                "steps, evaluation and prediction batches); raise run_steps",
                crypto=True,
            )
        if o.value_bits + max(o.precision_bits, o.shared_precision_bits) > 62:
            raise bad(
                "precision_bits",
                "value_bits + precision_bits and + shared_precision_bits must be at most 62 (int64)",
            )
        if o.scalar_bits + o.scalar_precision_bits > 62:
            raise bad(
                "scalar_precision_bits", "scalar_bits + scalar_precision_bits must be at most 62 (int64)"
            )
        b, dims, out = proto.training.batch_size, _embed_dims(proto), proto.interactive.out
        nbits = o.key_bits
        for terms, share, op, what in (
            (max(dims), True, prm.share + 1, "Enc(h'_i) times A's weight share"),
            (out, True, prm.share, "Enc(dL/dz) times P_i's weight share"),
            (b, False, prm.v, "Enc(dL/dz) times h'_i (the weight gradient)"),
        ):
            m = prm.mask_bits(terms, prm.hidden_bits(share), prm.fxs)
            need = prm.slot_need(terms, op, prm.fxs, m)
            if o.slot_bits is not None and o.slot_bits < need:
                raise bad(
                    "slot_bits",
                    f"slot_bits={o.slot_bits} could overflow: {what} sums {terms} products (batch_size "
                    f"{b}, embedding and interactive sizes) of values below 2^{o.value_bits} and "
                    f"operands below 2^{op} at 2^-{prm.Fs}, plus a {m}-bit mask: at least {need} bits",
                )
            slot = o.slot_bits or need
            if slot > nbits - 1:
                raise bad(
                    "slot_bits" if o.slot_bits else "key_bits",
                    f"a {slot}-bit slot ({what}) does not fit a {nbits}-bit plaintext",
                )

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, PaillierOptions)
        return {
            "security_bits": 128 if options.key_bits >= 3072 else 112,
            "statistical_distance_bits": options.distance_bits,
            "statistical_run_steps": options.run_steps,
            # P_i clips every row of h'_i, and A scales dL/dz, to this l2 norm before encrypting
            "encrypted_row_norm_bound": 2.0**options.value_bits,
        }


PaillierBackend = he_backend(
    "paillier",
    PaillierScheme,
    "packed Paillier (phe keys, gmpy2); W_i shared between A and P_i; z_i revealed to A only",
)
