"""CKKS ring, security and noise parameters: the options a protocol file may set,
the 128-bit check against the HomomorphicEncryption.org standard (SEAL's
``native/src/seal/util/hestdparms.h``, docs/crypto-performance.md §3),
the noise budget (the CKKS error model, the flooding and smudging widths, the
bounds the guards enforce) as pure functions, and the key owner's TenSEAL context.

Threat model: semi-honest A and P_i (SECURITY.md, ``ckks``; the argument is in
the package docstring, :mod:`securevfl.exchange.ckks`). Whoever loads a protocol
file with parameters below 128-bit security, a value budget that could overflow
decryption (and so leak the unmasked value), a mask too small to hide a value
statistically, or a flooding so wide that decryptions are useless, is refused
before any key exists.

Ring choice (default N = 8192, primes [59, 59, 40, 60], scale 2^89). One rescale
level: fresh ciphertexts hold [out primes..., q1] at scale Delta = 2^89, results
the output primes only, back at Delta (the plaintext diagonals are encoded at
q1, the prime the rescale drops). Three budgets meet in the 218 bits that N =
8192 allows at 128-bit security:

* exact decryption: a result slot holds a product bounded by the guards,
  2^(operand_norm_bits + value_norm_bits) = 2^27, plus a mask of at most
  8.58 mask_std = 2^24.1; decryption on the output primes alone is exact while
  sqrt(2) |slot| Delta < Q_out / 2 (:func:`mask_limit`: 2^27.5 at 118 bits and
  Delta = 2^89);
* flooding: the width that hides the key grows with the CKKS error in value
  units, c * 2^operand_norm_bits / Delta, so Delta is as large as the first budget
  allows (:func:`flood_sigma`: 7.4e-8 at the defaults, the precision the flooding
  costs);
* q1 = 2^40 sets the precision of the plaintext operands' encodings (about
  2^-35 per diagonal entry) and the special prime (60 bits, the largest SEAL
  builds) must exceed the data primes to keep key switching noise small.

N = 4096 (109 bits) cannot hold Delta * 2^27 on its output primes with any useful
Delta; N = 16384 (438 bits) would leave room for a larger scale and a narrower
flooding, in a ring twice as long (not measured here).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError, CryptoParameterError
from securevfl.exchange.ckks._tenseal import sa, ts
from securevfl.exchange.he.declaration import HEWeightInit

# SEAL's HomomorphicEncryption.org table (native/src/seal/util/hestdparms.h):
# the largest total coefficient-modulus size that still gives 128-bit security.
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MAX_PRIME_BITS = 60
#: smallest mask standard deviation accepted: per value a Gaussian mask of width
#: sigma hides v within statistical distance |v| / (2 sigma)
MIN_MASK_STD = 2.0**12
#: |SecretStream.normal_np| <= sqrt(-2 ln 2^-53) = 8.573 (Box-Muller on 53-bit uniforms)
GAUSS_MAX = 8.58
#: SEAL's error distribution: standard deviation 3.2 (util/globals.h)
NOISE_STD = 3.2
#: baby steps of the evaluation plan at most (:func:`securevfl.exchange.ckks.kernels.plan`):
#: an input's rotations form one chain, so the error under a diagonal's weight has
#: gone through at most MAX_BABY_STEPS - 1 key switchings (half of that on average)
MAX_BABY_STEPS = 8
#: value-independent key switchings bounded generously (giant steps, conjugations,
#: folds; the reference tmatmul does 46 in all)
MAX_FREE_SWITCHES = 128
#: the flooding must leave at least this much precision (else the parameters are refused)
MAX_FLOOD_SIGMA = 2.0**-16
#: the lowest flood_security_bits accepted (OpenFHE recommends at least 30)
MIN_FLOOD_SECURITY_BITS = 20
#: a re-drawn share's column norm is sqrt(n/3) 2^share_bits; this leaves room for W_i
SHARE_NORM_SLACK = 1.25


class CkksOptions(BaseModel):
    """``exchange.params`` of a ``ckks`` protocol file."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [59, 59, 40, 60])
    global_scale_bits: int = Field(default=89, ge=20, le=400)
    #: standard deviation of the Gaussian masks (the key owner's view of every result)
    mask_std: float = Field(default=2.0**21, gt=0)
    #: P_i re-draws its weight share uniform in [-2^share_bits, 2^share_bits) every step
    share_bits: int = Field(default=16, ge=1, le=40)
    #: l2 bound of every column of the evaluator's plaintext operand (weight shares, h'_i in tmatmul)
    operand_norm_bits: int = Field(default=19, ge=0, le=60)
    #: l2 bound of every row (and column, for dL/dz) of an encrypted operand (h'_i, dL/dz)
    value_norm_bits: int = Field(default=8, ge=0, le=60)
    #: s: flooding of 2^(s/2) sqrt(Q N) times the error's standard deviation
    flood_security_bits: int = Field(default=30, ge=1, le=128)
    #: Q: decryptions one key pair may answer (the flooding is sized for them)
    max_decryptions: int = Field(default=2**20, ge=1)
    #: the start of the weight shares (:mod:`securevfl.exchange.he.protocol`, "Start")
    weight_init: HEWeightInit = "private"
    #: allows ``weight_init: seeded`` (A then knows W_i^0; comparisons with plain only)
    insecure: bool = False


@functools.lru_cache(maxsize=16)
def _primes(n: int, bits: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(p.value()) for p in sa.CoeffModulus.Create(n, list(bits)))


def primes(opts: CkksOptions) -> tuple[int, ...]:
    """The primes SEAL builds for these bit sizes (data primes, then the special prime)."""
    return _primes(opts.poly_modulus_degree, tuple(opts.coeff_mod_bit_sizes))


def mask_limit(opts: CkksOptions) -> float:
    """Largest |value| a result slot (real or imaginary part) may hold so that
    decryption on the output primes alone is exact: a slot vector bounded by L
    has coefficients below sqrt(2) L Delta (canonical embedding), which must stay
    below Q_out / 2."""
    return 2.0 ** (sum(opts.coeff_mod_bit_sizes[:-2]) - 1 - opts.global_scale_bits - 0.5)


def mask_max(opts: CkksOptions) -> float:
    """The largest mask value: a Gaussian of mask_std never exceeds GAUSS_MAX of it."""
    return GAUSS_MAX * opts.mask_std


def product_bound(opts: CkksOptions) -> float:
    """|X w| for an encrypted operand X whose rows (columns, for ``tmatmul``) have l2
    norm <= 2^value_norm_bits and a plaintext operand w whose columns have l2 norm
    <= 2^operand_norm_bits (Cauchy-Schwarz); both owners check theirs (the guards)."""
    return 2.0 ** (opts.operand_norm_bits + opts.value_norm_bits)


def smudge_sigma(opts: CkksOptions) -> float:
    """Width of the evaluator's smudging noise (per real slot coordinate): two
    float64 ulps of the largest mask. A float64 mask lies on the grid of its own
    ulp, far coarser than the encoding's resolution (Delta^-1); a Gaussian of two
    grid steps makes the mask's lattice invisible (per coordinate, the density of
    grid + Gaussian differs from a smooth one by exp(-2 pi^2 4) ~ 2^-114)."""
    return 2.0 ** (math.floor(math.log2(mask_max(opts))) - 52 + 1)


def error_model(n: int, qs: tuple[int, ...]) -> tuple[float, float]:
    """(c_w, c_0): standard deviation of the CKKS error of one result slot coordinate,
    in coefficient units (divide by Delta for value units), per unit l2 norm of the
    evaluator's operand column (c_w) and independent of it (c_0). ``qs``: data primes
    then the special prime.

    Heuristic variance model (independent coefficients; a slot coordinate of a
    polynomial with i.i.d. coefficients of variance v has variance v N / 2):
    fresh encryption error sigma^2 = 3.2^2 per coefficient; one key switching with
    the special prime P adds N sigma^2 sum(q_j^2) / (3 P^2) (the digits times the
    key's error, divided by P) plus N / 18 (the rounding of the division, times the
    ternary secret). An input's baby-step rotations form a chain, so the error a
    diagonal's weight multiplies has gone through at most MAX_BABY_STEPS - 1
    switchings, (MAX_BABY_STEPS - 1) / 2 on average over the diagonals the
    protocol's operands fill evenly (the re-drawn shares are i.i.d.). c_0 covers the
    switchings after the rescale (giant steps, conjugation, folds), the rescale's
    rounding and the public-key encryption of the mask. Measured at the defaults
    for the reference forward product (tests/unit/test_ckks_noise.py): 2^13.2 to
    2^14.5 per unit operand norm over nine key pairs, against the model's 2^13.81."""
    data, special = qs[:-1], qs[-1]
    fresh = n / 2 * NOISE_STD**2
    switch = (
        n / 2 * (n * NOISE_STD**2 * sum(float(q) ** 2 for q in data) / (3 * float(special) ** 2) + n / 18)
    )
    c_w = math.sqrt(fresh + (MAX_BABY_STEPS - 1) / 2 * switch)
    c_0 = math.sqrt(MAX_FREE_SWITCHES * switch + n / 2 * (n * NOISE_STD**2 + n / 6))
    return c_w, c_0


#: the error bound's margin over the model (:func:`error_std`)
ERROR_MARGIN = 2.0


def error_std(opts: CkksOptions, qs: tuple[int, ...] | None = None) -> float:
    """Bound on the standard deviation (root mean square over a result's slots) of
    the CKKS error of one result slot coordinate in value units, for evaluator
    operands within 2^operand_norm_bits: the model (:func:`error_model`) times
    ERROR_MARGIN. The margin covers the spread between key pairs: a key switching
    error is i.i.d. over coefficients only in part (the decomposition digits are not
    centred), so its energy sits in a few slots and depends on the Galois keys'
    error; over nine key pairs the reference forward product's error measured
    2^13.2 to 2^14.5 per unit operand norm, around the model's 2^13.81."""
    c_w, c_0 = error_model(opts.poly_modulus_degree, primes(opts) if qs is None else qs)
    a = 2.0**opts.operand_norm_bits
    return ERROR_MARGIN * math.hypot(c_w * a, c_0) / 2.0**opts.global_scale_bits


def flood_sigma(opts: CkksOptions, qs: tuple[int, ...] | None = None) -> float:
    """Standard deviation of the key owner's flooding noise per real slot coordinate
    (value units): 2^(s/2) sqrt(Q N) sigma_e, with s = flood_security_bits, Q =
    max_decryptions, N = poly_modulus_degree and sigma_e = :func:`error_std`
    (package docstring: the run's decryptions are within statistical distance
    2^-(s/2+1) of key-independent ones)."""
    q_n = float(opts.max_decryptions) * opts.poly_modulus_degree
    return 2.0 ** (opts.flood_security_bits / 2) * math.sqrt(q_n) * error_std(opts, qs)


def share_norm(share_bits: int, n: int) -> float:
    """Expected-maximum l2 norm of n entries uniform in [-2^k, 2^k), with room for W_i."""
    return SHARE_NORM_SLACK * 2.0**share_bits * math.sqrt(n / 3.0)


def embedding_column_norm(opts: CkksOptions, batch: int) -> float:
    """The largest l2 norm a column of P_i's encrypted embedding can have: its rows are
    clipped to 2^value_norm_bits (:mod:`securevfl.exchange.he.bounds`), so a column of
    ``batch`` rows is at most sqrt(batch) 2^value_norm_bits. P_i multiplies Enc(dL/dz)
    by it (``tmatmul``), whose guard asks columns within 2^operand_norm_bits."""
    return math.sqrt(batch) * 2.0**opts.value_norm_bits


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


def _embed_dims(proto: Protocol) -> list[int]:
    return [(p.model or ModelSpec()).out for p in proto.parties.passive]


def check(proto: Protocol, options: CkksOptions) -> None:
    """Refuse, at load, parameters below 128-bit security, primes SEAL cannot
    build, a value budget that overflows decryption, masks that hide too little,
    a flooding that drowns the values, shares that cannot fit the operand bound,
    and batches that do not fit the slots (CryptoParameterError naming the field)."""
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
        qs = primes(options)
    except Exception as exc:  # SEAL raises std exceptions for primes it cannot find
        raise _refuse(
            f"coeff_mod_bit_sizes {bits}: SEAL cannot build these primes for N={n} ({exc})",
            "coeff_mod_bit_sizes",
        ) from None
    if options.mask_std < MIN_MASK_STD:
        raise _refuse(
            f"mask_std {options.mask_std:g} is below {MIN_MASK_STD:g}: a Gaussian mask of "
            "standard deviation sigma hides a value v only up to statistical distance |v|/(2 sigma)",
            "mask_std",
        )
    limit = mask_limit(options)
    sigma_f, sigma_a = flood_sigma(options, qs), smudge_sigma(options)
    need = product_bound(options) + mask_max(options) + 12.0 * (sigma_f + sigma_a)
    if need > limit:
        field = "mask_std" if mask_max(options) > product_bound(options) else "operand_norm_bits"
        raise _refuse(
            f"values overflow the output primes: products up to 2^{options.operand_norm_bits} x "
            f"2^{options.value_norm_bits} (operand_norm_bits x value_norm_bits) plus masks up to "
            f"{mask_max(options):g} ({GAUSS_MAX} mask_std) reach {need:g}, but with "
            f"{sum(bits[:-2])} bits of output primes at scale 2^{options.global_scale_bits} a "
            f"result slot must stay below {limit:g} for decryption to be exact; lower those, "
            "or global_scale_bits",
            field,
        )
    if options.flood_security_bits < MIN_FLOOD_SECURITY_BITS:
        raise _refuse(
            f"flood_security_bits {options.flood_security_bits} is below {MIN_FLOOD_SECURITY_BITS}: "
            "the decryptions of a whole run must stay within statistical distance "
            "2^-(flood_security_bits/2 + 1) of key-independent ones (IND-CPA-D, Li and Micciancio 2021)",
            "flood_security_bits",
        )
    if sigma_f > MAX_FLOOD_SIGMA:
        raise _refuse(
            f"the decryption flooding would need a standard deviation of {sigma_f:.3g} (above "
            f"{MAX_FLOOD_SIGMA:g}): 2^(flood_security_bits/2) sqrt(max_decryptions N) times the CKKS "
            f"error, {error_std(options, qs):.3g} at scale 2^{options.global_scale_bits} for operands "
            f"up to 2^{options.operand_norm_bits}; raise global_scale_bits (with the output primes), "
            "or lower operand_norm_bits or max_decryptions",
            "global_scale_bits",
        )
    dims = _embed_dims(proto)
    widest = max(proto.interactive.out, *dims)
    if share_norm(options.share_bits, widest) > 2.0**options.operand_norm_bits:
        raise _refuse(
            f"share_bits {options.share_bits}: a re-drawn weight share's column of {widest} entries "
            f"uniform in +-2^{options.share_bits} has l2 norm about "
            f"{share_norm(options.share_bits, widest) / SHARE_NORM_SLACK:.3g}, too close to the operand "
            f"bound 2^{options.operand_norm_bits} (operand_norm_bits); lower share_bits or raise "
            "operand_norm_bits",
            "share_bits",
        )
    if embedding_column_norm(options, proto.training.batch_size) > 2.0**options.operand_norm_bits:
        raise _refuse(
            f"value_norm_bits {options.value_norm_bits}: P_i's embedding rows are clipped to l2 norm "
            f"2^{options.value_norm_bits}, so a column of a batch of {proto.training.batch_size} rows "
            f"can reach {embedding_column_norm(options, proto.training.batch_size):.4g}, above the "
            f"operand bound 2^{options.operand_norm_bits} of the weight-gradient product "
            "(operand_norm_bits); lower value_norm_bits or training.batch_size, or raise operand_norm_bits",
            "value_norm_bits",
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
    """What result.json records about the parameters and the noise they imply."""
    try:
        qs: tuple[int, ...] | None = primes(options)
    except Exception:  # parameters check() refuses; nothing to derive
        qs = None
    info: dict[str, Any] = {
        "slots": options.poly_modulus_degree // 2,
        "security_bits": 128,
        "coeff_modulus_bits": sum(options.coeff_mod_bit_sizes),
        "max_coeff_modulus_bits": MAX_BITS_128.get(options.poly_modulus_degree),
        "mask_statistical_distance_per_unit_entry": 1.0 / (2.0 * options.mask_std),
        "exact_decryption_limit": mask_limit(options),
        "product_bound": product_bound(options),
        "share_bits": options.share_bits,
        "smudge_sigma": smudge_sigma(options),
        "max_decryptions": options.max_decryptions,
        "flood_security_bits": options.flood_security_bits,
        # P_i clips every row of h'_i, and A scales dL/dz, to this l2 norm before encrypting
        "encrypted_row_norm_bound": 2.0**options.value_norm_bits,
    }
    if qs is not None:
        info["flood_sigma"] = flood_sigma(options, qs)
        info["error_std_bound"] = error_std(options, qs)
    return info
