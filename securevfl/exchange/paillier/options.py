"""The ``paillier`` backend's options and the parameters derived from them.

Two fixed-point scales (DESIGN §4, SECURITY.md ``paillier``): every encrypted
value x is round(x 2^precision_bits) with |x| < 2^value_bits, every plaintext
operand w is round(w 2^scalar_precision_bits) with |w| < 2^scalar_bits, and a
result carries the sum of the two scales. Why two, and why 48 fractional bits
for encrypted values: see :mod:`securevfl.exchange.paillier` (package docstring).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from securevfl.errors import ConfigError

MIN_KEY_BITS = 2048
MAX_KEY_BITS = 16384
MASK_FLOOR_BITS = 20
#: statistical distance of one obfuscator from a uniform n-th residue is at most 2^-(this + 1)
OBFUSCATION_SIGMA = 64


class PaillierOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    key_bits: int = Field(default=2048, gt=0, le=MAX_KEY_BITS, description="bits of the modulus n")
    precision_bits: int = Field(
        default=48, ge=8, le=60, description="fractional bits of every encrypted value (one scale)"
    )
    scalar_precision_bits: int = Field(
        default=20, ge=4, le=60, description="fractional bits of the plaintext operands"
    )
    value_bits: int = Field(default=8, ge=1, le=56, description="|encrypted value| < 2^value_bits")
    scalar_bits: int = Field(default=40, ge=1, le=58, description="|plaintext operand| < 2^scalar_bits")
    mask_bits: int = Field(default=24, ge=1, le=52, description="masks uniform in [-2^m, 2^m)")
    share_bits: int = Field(
        default=20,
        ge=1,
        le=52,
        description="P_i's weight share is re-drawn uniform in [-2^s, 2^s) every step",
    )
    shared_precision_bits: int = Field(
        default=24,
        ge=8,
        le=60,
        description="fractional bits of encrypted values in the protocol (the owner's copy is rounded alike)",
    )
    slot_bits: int | None = Field(
        default=None, ge=16, description="packing slot width; none: the smallest safe one per blob"
    )
    threads: int = Field(default=0, ge=0, le=256, description="workers for batched modexps; 0: all CPUs")
    precompute: bool = Field(
        default=False, description="make obfuscators while waiting on the network (parties on own hosts)"
    )
    weight_init: Literal["private", "seeded"] = "private"


def ceil_log2(k: int) -> int:
    """Smallest e >= 0 with 2^e >= k."""
    return max(0, (int(k) - 1).bit_length())


@dataclass(frozen=True)
class Params:
    """The options as the scheme uses them (bit counts, thread count)."""

    fx: int  # scale of encrypted values
    fw: int  # scale of plaintext operands
    v: int
    sb: int
    m: int
    share: int  # P_i's re-drawn weight share is below 2^share
    fxs: int  # scale of encrypted values in he.py's protocol
    slot_bits: int | None
    threads: int
    precompute: bool

    @classmethod
    def of(cls, o: PaillierOptions) -> Params:
        threads = o.threads or min(os.cpu_count() or 1, 32)
        return cls(
            o.precision_bits,
            o.scalar_precision_bits,
            o.value_bits,
            o.scalar_bits,
            o.mask_bits,
            o.share_bits,
            o.shared_precision_bits,
            o.slot_bits,
            threads,
            o.precompute,
        )

    @property
    def F(self) -> int:
        return self.fx + self.fw

    @property
    def grid(self) -> int:
        """Masks are k 2^-grid with |k| <= 2^52: exact in float64."""
        return 52 - self.m

    def slot_need(self, terms: int, scalar_bits: int | None = None, scale: int | None = None) -> int:
        """Smallest slot width that holds a sum of ``terms`` products plus a mask:
        values below 2^value_bits at 2^-scale (default precision_bits) times plaintext
        operands below 2^scalar_bits (default the option) at 2^-scalar_precision_bits.
        The sum is below 2^(F + v + s + ceil log2 terms), the mask below 2^(F + m), with
        F = scale + scalar_precision_bits: their sum needs one bit more, a sign one more,
        and one bit is kept spare."""
        sb = self.sb if scalar_bits is None else scalar_bits
        f = (self.fx if scale is None else scale) + self.fw
        return f + max(self.v + sb + ceil_log2(terms), self.m) + 3

    def slot_for(
        self, terms: int, n_bits: int, scalar_bits: int | None = None, scale: int | None = None
    ) -> int:
        need = self.slot_need(terms, scalar_bits, scale)
        s = self.slot_bits if self.slot_bits is not None else need
        if s < need or s > n_bits - 1:
            raise ConfigError(
                f"a slot of {s} bits cannot hold sums of {terms} products (needs "
                f"{need} bits) within a {n_bits}-bit modulus",
                path="exchange.params.slot_bits",
            )
        return s
