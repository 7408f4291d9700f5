"""The ``paillier`` backend's options and the parameters derived from them.

Two fixed-point scales (docs/design.md §4, SECURITY.md ``paillier``): every encrypted
value x is round(x 2^precision_bits) with |x| < 2^value_bits, every plaintext
operand w is round(w 2^scalar_precision_bits), and a result carries the sum of
the two. Why two, and why 48 fractional bits for the generic API's encrypted
values: see :mod:`securevfl.exchange.paillier` (package docstring).

The statistical parameters are stated for a whole run (docs/design.md §13): the run's
masked values and obfuscators together are within statistical distance
2^-distance_bits of ideal ones for up to ``run_steps`` passes through the
interactive layer, half of the budget each (:class:`Params`: ``sigma`` and
``obf_sigma``; the package docstring, "Masks", has the argument).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from securevfl.errors import ConfigError
from securevfl.exchange.he.declaration import HEWeightInit

MIN_KEY_BITS = 2048
MAX_KEY_BITS = 16384
#: the smallest whole-run statistical distance budget accepted: 2^-40 (docs/design.md §13)
MIN_DISTANCE_BITS = 40
#: the fewest bits per obfuscator whatever the run: 2^-64 from uniform
MIN_OBFUSCATION_SIGMA = 64
#: the workload the parameters are sized for when no protocol is given (docs/design.md §10)
REFERENCE_SHAPE = (256, (64, 64), 64)


class PaillierOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    key_bits: int = Field(default=2048, gt=0, le=MAX_KEY_BITS, description="bits of the modulus n")
    precision_bits: int = Field(
        default=48, ge=8, le=60, description="fractional bits of every encrypted value (generic API)"
    )
    scalar_precision_bits: int = Field(
        default=20, ge=4, le=60, description="fractional bits of the plaintext operands"
    )
    value_bits: int = Field(default=8, ge=1, le=56, description="|encrypted value| < 2^value_bits")
    scalar_bits: int = Field(
        default=40, ge=1, le=58, description="|plaintext operand| < 2^scalar_bits (generic API)"
    )
    shared_precision_bits: int = Field(
        default=24,
        ge=8,
        le=60,
        description="fractional bits of encrypted values in the protocol (the owner's copy is rounded alike)",
    )
    distance_bits: int = Field(
        default=40,
        ge=1,
        le=256,
        description="the whole run's masked values and obfuscators are within statistical distance "
        "2^-distance_bits of ideal ones (at least 40)",
    )
    run_steps: int = Field(
        default=1 << 17,
        ge=1,
        le=1 << 40,
        description="passes through the interactive layer (training steps, evaluation and prediction "
        "batches) the statistical bound covers (default 131,072: 100,000 training steps and 31,072 "
        "other batches); a run that goes beyond stops with an error",
    )
    weight_bits: int = Field(
        default=4,
        ge=0,
        le=32,
        description="the bound holds for weights |W_i| < 2^weight_bits; the re-drawn share U is "
        "uniform over 2^(weight_bits + sigma) times that range",
    )
    slot_bits: int | None = Field(
        default=None, ge=16, description="packing slot width; none: the smallest safe one per blob"
    )
    threads: int = Field(default=0, ge=0, le=256, description="workers for batched modexps; 0: all CPUs")
    precompute: bool = Field(
        default=False, description="make obfuscators while waiting on the network (parties on own hosts)"
    )
    weight_init: HEWeightInit = Field(
        default="private",
        description="the start of the weight shares (he/protocol.py): private (a random W_i^0 known to "
        "nobody), or seeded (insecure)",
    )
    insecure: bool = Field(
        default=False, description="allows weight_init: seeded (A then knows W_i^0; comparisons only)"
    )


def ceil_log2(k: int) -> int:
    """Smallest e >= 0 with 2^e >= k."""
    return max(0, (int(k) - 1).bit_length())


def masked_per_pass(batch: int, dims: list[int] | tuple[int, ...], out: int) -> int:
    """Values masked in one training step, all passive parties together: per party
    eps (B x o), mu (B x d), R (d x o) and the re-drawn share U (d x o). An
    evaluation or prediction pass masks fewer (eps only)."""
    return sum(batch * out + batch * d + 2 * d * out for d in dims)


def at_start(dims: list[int] | tuple[int, ...], out: int) -> int:
    """Values the joint start of W_i masks (he/protocol.py, "Start"), all passive parties
    together: per party the d x o mask of the product and P_i's first re-drawn share;
    also a bound on its obfuscators (the d x o factor encrypted, the d x o result)."""
    return sum(2 * d * out for d in dims)


def ciphertexts_per_pass(batch: int, dims: list[int] | tuple[int, ...], out: int) -> int:
    """An upper bound on the obfuscators one training step draws: one per value of
    every encrypted or output matrix (h'_i, h'_i W^A + eps, g W^P^T + mu and h'^T g - R
    per party; dL/dz in two packings, once). The packing puts at least two values
    (10 to 16 at 2048 bits) in a ciphertext, so this also counts the key owner's
    obfuscators twice, as their two CRT halves are each within 2^-obf_sigma."""
    return sum(2 * batch * d + batch * out + d * out for d in dims) + 2 * batch * out


@dataclass(frozen=True)
class Params:
    """The options as the scheme uses them (bit counts, thread count), with the
    per-value statistical parameters of a run of ``run_steps`` passes at the
    protocol's shape (batch, embedding sizes, output size)."""

    fx: int  # scale of encrypted values (generic API)
    fw: int  # scale of plaintext operands
    v: int
    sb: int
    fxs: int  # scale of encrypted values in the HE protocol (he/protocol.py)
    slot_bits: int | None
    threads: int
    precompute: bool
    sigma: int  # every mask hides its value within 2^-sigma
    obf_sigma: int  # every obfuscator is within 2^-obf_sigma of uniform
    wb: int  # the bound is stated for |W_i| < 2^wb
    run_steps: int
    masked_per_pass: int
    ciphertexts_per_pass: int

    @classmethod
    def of(
        cls,
        o: PaillierOptions,
        batch: int | None = None,
        dims: list[int] | tuple[int, ...] | None = None,
        out: int | None = None,
    ) -> Params:
        """The parameters for a protocol of this shape (default: the reference
        workload, docs/design.md §10: batch 256, two passive parties with 64-d embeddings, o = 64)."""
        rb, rd, ro = REFERENCE_SHAPE
        b, ds, oo = batch or rb, tuple(dims or rd), out or ro
        masked = masked_per_pass(b, ds, oo)
        cts = ciphertexts_per_pass(b, ds, oo)
        threads = o.threads or min(os.cpu_count() or 1, 32)
        half = o.distance_bits + 1  # masks and obfuscators get 2^-(distance_bits + 1) each
        return cls(
            fx=o.precision_bits,
            fw=o.scalar_precision_bits,
            v=o.value_bits,
            sb=o.scalar_bits,
            fxs=o.shared_precision_bits,
            slot_bits=o.slot_bits,
            threads=threads,
            precompute=o.precompute,
            sigma=half + ceil_log2(o.run_steps * masked + at_start(ds, oo)),
            obf_sigma=max(MIN_OBFUSCATION_SIGMA, half + ceil_log2(o.run_steps * cts + at_start(ds, oo))),
            wb=o.weight_bits,
            run_steps=o.run_steps,
            masked_per_pass=masked,
            ciphertexts_per_pass=cts,
        )

    @property
    def F(self) -> int:
        return self.fx + self.fw

    @property
    def Fs(self) -> int:
        """The protocol's result scale: every share, mask and masked result is an integer at 2^-Fs."""
        return self.fxs + self.fw

    @property
    def share(self) -> int:
        """k: P_i's re-drawn share U is uniform on [-2^k, 2^k) (at 2^-Fs resolution),
        k = weight_bits + sigma - 1, so that W_i - U and 0 - U are within
        |W_i| / 2^(k+1) < 2^-sigma of each other per weight."""
        return self.wb + self.sigma - 1

    def mask_bits(self, terms: int, hidden_bits: int, scale: int) -> int:
        """Width m of the mask of a sum of ``terms`` products of encrypted values below
        2^v at 2^-scale with plaintext operands whose part unknown to the key owner is
        below 2^hidden_bits at 2^-fw: the mask is uniform on 2^m integers, m the bits of
        that part's bound plus sigma, so a masked sum is within 2^-sigma of the mask alone."""
        return self.v + scale + hidden_bits + self.fw + ceil_log2(terms) + self.sigma

    def hidden_bits(self, operand_is_share: bool) -> int:
        """Bits of the part of a plaintext operand unknown to the key owner: of a weight
        share, W_i (below 2^wb; one more bit for the rounding of the share to 2^-fw);
        of an embedding (``tmatmul``), all of it (below 2^v)."""
        return self.wb + 1 if operand_is_share else self.v

    def slot_need(self, terms: int, op_bits: int, scale: int, mask_bits: int) -> int:
        """Smallest slot width that holds a sum of ``terms`` products of values below
        2^v at 2^-scale with operands below 2^op_bits at 2^-fw, plus a mask in
        [-2^(mask_bits-1), 2^(mask_bits-1)): their sum needs one bit more than the
        larger, a sign one more, and one bit is kept spare."""
        return max(self.v + scale + op_bits + self.fw + ceil_log2(terms), mask_bits - 1) + 3

    def slot_for(self, terms: int, n_bits: int, op_bits: int, scale: int, mask_bits: int) -> int:
        need = self.slot_need(terms, op_bits, scale, mask_bits)
        s = self.slot_bits if self.slot_bits is not None else need
        if s < need or s > n_bits - 1:
            raise ConfigError(
                f"a slot of {s} bits cannot hold sums of {terms} products plus a {mask_bits}-bit "
                f"mask (needs {need} bits) within a {n_bits}-bit modulus",
                path="exchange.params.slot_bits",
            )
        return s

    def protocol_slot(self, layout_is_cols: bool, terms: int, op_bits: int, n_bits: int) -> int:
        """The slot width of a protocol blob (:meth:`PaillierKey.encrypt_shared`):
        ``cols`` blobs are multiplied by a weight share below 2^op_bits, ``rows`` blobs
        by the peer's embedding (below 2^v); values at 2^-fxs."""
        hidden = self.hidden_bits(layout_is_cols)
        m = self.mask_bits(terms, hidden, self.fxs)
        return self.slot_for(terms, n_bits, op_bits if layout_is_cols else self.v, self.fxs, m)

    def generic_slot(self, terms: int, n_bits: int) -> int:
        """The slot width of a generic blob (:meth:`PaillierKey.encrypt`): any operand
        below 2^scalar_bits, all of it hidden; values at 2^-precision_bits."""
        return self.slot_for(terms, n_bits, self.sb, self.fx, self.mask_bits(terms, self.sb, self.fx))
