"""The ``paillier`` HE scheme for :mod:`securevfl.exchange.he`: key and peer
factories, masks, and the load-time refusal of insecure parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel

from securevfl.config import ModelSpec, Protocol
from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.he import HEScheme, he_backend
from securevfl.exchange.paillier.options import MASK_FLOOR_BITS, MIN_KEY_BITS, PaillierOptions, Params
from securevfl.exchange.paillier.peer import PaillierPeer
from securevfl.exchange.paillier.scheme import PaillierKey
from securevfl.exchange.paillier.wire import load_public


def _embed_dims(proto: Protocol) -> list[int]:
    return [(p.model or ModelSpec()).out for p in proto.parties.passive]


class PaillierScheme(HEScheme):
    options = PaillierOptions

    def __init__(self, options: BaseModel):
        super().__init__(options)
        assert isinstance(options, PaillierOptions)
        self.prm = Params.of(options)

    def new_key(self) -> PaillierKey:
        return PaillierKey(self.prm, self.opts.key_bits)  # type: ignore[attr-defined]

    def peer(self, public: bytes, *, sender: str) -> PaillierPeer:
        n = load_public(public, sender, self.opts.key_bits)  # type: ignore[attr-defined]
        return PaillierPeer(self.prm, n, sender)

    def share_bits(self) -> int:
        """P_i's weight share is re-drawn uniform in [-2^share_bits, 2^share_bits) every
        step, so the plaintext operands stay short and the slots narrow (he.py)."""
        return int(self.opts.share_bits)  # type: ignore[attr-defined]

    def mask(self, stream: SecretStream, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform on the grid 2^(mask_bits-52) in [-2^mask_bits, 2^mask_bits) (exact in float64)."""
        lim = 1 << 52
        k = stream.integers_np(shape, -lim, lim)
        return np.ldexp(k.astype(np.float64), -self.prm.grid)

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, PaillierOptions)
        o = options
        prm = Params.of(o)

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
        if o.mask_bits < MASK_FLOOR_BITS:
            raise bad(
                "mask_bits",
                f"mask_bits={o.mask_bits} is below {MASK_FLOOR_BITS}: masks hide a value y only up to "
                f"a statistical distance of |y| 2^-mask_bits per value",
                crypto=True,
            )
        if o.share_bits < MASK_FLOOR_BITS:
            raise bad(
                "share_bits",
                f"share_bits={o.share_bits} is below {MASK_FLOOR_BITS}: the re-drawn share hides W_i from "
                f"A only up to a statistical distance of |W_i - W'_i| 2^-(share_bits+1) per weight",
                crypto=True,
            )
        if o.scalar_bits < o.share_bits + 1:
            raise bad(
                "scalar_bits",
                f"scalar_bits={o.scalar_bits} must be at least share_bits + 1 = {o.share_bits + 1}: A's "
                "weight share is W_i minus P_i's, which is below 2^share_bits",
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
        if prm.grid > prm.fw + min(prm.fx, prm.fxs):
            field = "precision_bits" if prm.fx <= prm.fxs else "shared_precision_bits"
            raise bad(field, f"{field} + scalar_precision_bits must be >= {prm.grid} (52 - mask_bits)")
        terms = max(proto.training.batch_size, proto.interactive.out, *_embed_dims(proto))
        need = prm.slot_need(terms)
        if o.slot_bits is not None and o.slot_bits < need:
            raise bad(
                "slot_bits",
                f"slot_bits={o.slot_bits} could overflow: a slot must hold a sum of up to {terms} "
                f"products (batch_size {proto.training.batch_size}, embedding and interactive sizes) "
                f"of values below 2^{o.value_bits} and 2^{o.scalar_bits} at 2^-{prm.F}, plus a mask "
                f"below 2^{o.mask_bits}: at least {need} bits",
            )
        slot = o.slot_bits or need
        if slot > o.key_bits - 1:
            raise bad(
                "slot_bits" if o.slot_bits else "key_bits",
                f"a {slot}-bit slot does not fit a {o.key_bits}-bit plaintext",
            )

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, PaillierOptions)
        return {
            "security_bits": 128 if options.key_bits >= 3072 else 112,
            "statistical_mask_bits": options.mask_bits,
        }


PaillierBackend = he_backend(
    "paillier",
    PaillierScheme,
    "packed Paillier (phe keys, gmpy2); W_i shared between A and P_i; z_i revealed to A only",
)
