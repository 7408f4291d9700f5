"""CKKS ring and security parameters: the options a protocol file may set, the
128-bit check against the HomomorphicEncryption.org standard (SEAL's
``native/src/seal/util/hestdparms.h``, specs/anchors-crypto-performance.md §3),
and the key owner's TenSEAL context.

Threat model: semi-honest A and P_i (SECURITY.md, ``ckks``). Whoever loads a
protocol file with parameters below 128-bit security, a mask that could
overflow decryption (and so leak the unmasked value) or a mask too small to
hide a value statistically, is refused before any key exists.

Ring choice (default N = 8192, [47, 47, 40, 60], scale 2^60). One rescale
level: fresh ciphertexts hold [q0.., q1], results the output primes only. The
output primes must hold a masked value exactly: sqrt(2) (M + |v|) 2^scale <
q_out / 2, i.e. 22 (mask 2^22) + scale + ~2 bits; q1 sets the precision of the
encoded plaintext operand (weights, embeddings) and the special prime must
exceed the data primes to keep key-switching noise small. N = 4096 allows 109
bits in all: with the default mask and a scale that still tracks float64
training to 1e-6 (>= 2^40) the output primes alone need > 64 bits, q1 >= 40
and the special prime >= the largest data prime, > 109 bits; so N = 8192 is
the smallest ring that keeps both the security and the precision.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.ckks._tenseal import sa, ts

# SEAL's HomomorphicEncryption.org table (native/src/seal/util/hestdparms.h):
# the largest total coefficient-modulus size that still gives 128-bit security.
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MAX_PRIME_BITS = 60
MIN_MASK_BOUND = 2.0**12


class CkksOptions(BaseModel):
    """``exchange.params`` of a ``ckks`` protocol file."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [47, 47, 40, 60])
    global_scale_bits: int = Field(default=60, ge=20, le=MAX_PRIME_BITS)
    mask_bound: float = Field(default=2.0**22, gt=0)
    weight_init: Literal["private", "seeded"] = "private"


def mask_limit(opts: CkksOptions) -> float:
    """Largest |value| a result slot (real or imaginary part) may hold so that
    decryption on the output primes alone is exact (see the module docstring)."""
    return 2.0 ** (sum(opts.coeff_mod_bit_sizes[:-2]) - 1 - opts.global_scale_bits - 0.5)


def context(opts: CkksOptions) -> Any:
    """A fresh key owner's TenSEAL context (secret key included; never sent)."""
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=opts.poly_modulus_degree,
        coeff_mod_bit_sizes=list(opts.coeff_mod_bit_sizes),
        n_threads=1,
    )
    ctx.global_scale = 2.0**opts.global_scale_bits
    return ctx


def _refuse(msg: str, field: str) -> CryptoParameterError:
    return CryptoParameterError(msg, path=f"exchange.params.{field}")


def check(proto: Protocol, options: CkksOptions) -> None:
    """Refuse, at load, parameters below 128-bit security, primes SEAL cannot
    build, masks that overflow decryption or hide too little, and batches that
    do not fit the slots (CryptoParameterError naming the field)."""
    if importlib.util.find_spec("tenseal") is None:
        raise ConfigError(
            "the ckks backend needs TenSEAL (install the 'crypto' extra)", path="exchange.backend"
        )
    n, bits = options.poly_modulus_degree, list(options.coeff_mod_bit_sizes)
    if n not in MAX_BITS_128:
        raise _refuse(
            f"poly_modulus_degree {n} is not one of {sorted(MAX_BITS_128)} "
            "(powers of two with a 128-bit security bound)",
            "poly_modulus_degree",
        )
    if len(bits) < 3:
        raise _refuse(
            f"coeff_mod_bit_sizes {bits}: need [q0, q1, special] (one rescale level plus the "
            "key-switching prime)",
            "coeff_mod_bit_sizes",
        )
    if any(b > MAX_PRIME_BITS or b < 1 for b in bits):
        bad = [b for b in bits if b > MAX_PRIME_BITS or b < 1]
        raise _refuse(
            f"coeff_mod_bit_sizes {bits}: primes of {bad} bits; each prime must have 1 to "
            f"{MAX_PRIME_BITS} bits",
            "coeff_mod_bit_sizes",
        )
    if sum(bits) > MAX_BITS_128[n]:
        raise _refuse(
            f"sum of coefficient moduli {sum(bits)} bits exceeds {MAX_BITS_128[n]}, the "
            f"128-bit security limit for N={n}",
            "coeff_mod_bit_sizes",
        )
    try:
        sa.CoeffModulus.Create(n, bits)
    except Exception as exc:  # SEAL raises std exceptions for primes it cannot find
        raise _refuse(
            f"coeff_mod_bit_sizes {bits}: SEAL cannot build these primes for N={n} ({exc})",
            "coeff_mod_bit_sizes",
        ) from None
    limit = mask_limit(options)
    if options.mask_bound > limit / 2:
        raise _refuse(
            f"mask_bound {options.mask_bound:g} overflows the last prime: with a {bits[0]}-bit q0 "
            f"and scale 2^{options.global_scale_bits}, masked values must stay below {limit:g} "
            f"(half of it for the mask); use at most {limit / 2:g} or a smaller global_scale_bits",
            "mask_bound",
        )
    if options.mask_bound < MIN_MASK_BOUND:
        raise _refuse(
            f"mask_bound {options.mask_bound:g} is below {MIN_MASK_BOUND:g}: a uniform mask of "
            "bound M hides a value v only up to statistical distance |v|/(2M) per entry",
            "mask_bound",
        )
    slots = n // 2
    if proto.training.batch_size > slots:
        raise CryptoParameterError(
            f"batch_size {proto.training.batch_size} exceeds the {slots} CKKS slots of "
            f"N={n} (a batch is packed along the slots); use a larger poly_modulus_degree "
            "or a smaller batch",
            path="training.batch_size",
        )


def describe(options: CkksOptions) -> dict[str, Any]:
    """What result.json records about the parameters."""
    return {
        "slots": options.poly_modulus_degree // 2,
        "security_bits": 128,
        "coeff_modulus_bits": sum(options.coeff_mod_bit_sizes),
        "max_coeff_modulus_bits": MAX_BITS_128.get(options.poly_modulus_degree),
        "mask_statistical_distance_per_unit_entry": 1.0 / (2.0 * options.mask_bound),
    }
