"""``ckks``: the two-party HE interactive layer (:mod:`securevfl.exchange.he.protocol`) with CKKS.

What it protects: W_i exists only as two additive shares (A's and P_i's); every
operand that crosses to the other party is a CKKS ciphertext under the key of
the party that produced it (P_i's h'_i, A's dL/dz) or a value the receiver may
learn plus a mask. A learns z_i = h'_i W_i (the declared output); P_i learns
dL/dh'_i (docs/design.md §4, SECURITY.md ``ckks``). Semi-honest parties; TenSEAL/SEAL
with 128-bit parameters (N = 8192, 218 bits, HomomorphicEncryption.org table).

Decryptions that leave the key owner are flooded (IND-CPA-D). CKKS decrypts to
m + e, where the error e is a function of the key owner's secret key and
encryption randomness: an evaluator that knows a ciphertext (c0, c1) and learns
m + e exactly solves c0 + c1 s = m + e for the key s (Li and Micciancio,
"On the Security of Homomorphic Encryption on Approximate Numbers", Eurocrypt
2021). Here every decryption's result leaves its owner (P_i's z-share, A's
masked dL/dh) or shapes later messages (A's gradient share), so the key owner
adds, before it decrypts, fresh Gaussian noise of standard deviation sigma_f on
every real slot coordinate (:meth:`CkksKey.decrypt`; an integer polynomial added
exactly in the ring, so e is never decoded alone). The argument, after Li,
Micciancio, Schultz and Sorrell ("Securing Approximate Homomorphic Encryption
Using Differential Privacy", CRYPTO 2022) and OpenFHE's NOISE_FLOODING_DECRYPT
(sigma = sqrt(12 tau) 2^(s/2) times the noise estimate, s >= 30 recommended):

* Error bound. A result slot's error has standard deviation (root mean square
  over the slots) at most sigma_e = 2 sqrt(c_w^2 A^2 + c_0^2) / Delta, with A =
  2^operand_norm_bits the l2 bound of the evaluator's operand column (guarded),
  c_w^2 = (N/2) 3.2^2 + 3.5 sigma_ks^2 (fresh error, then on average half of at
  most 7 chained baby-step key switchings of variance sigma_ks^2 = (N/2)
  (N 3.2^2 sum q_j^2 / (3 P^2) + N / 18)) and c_0 the switchings after the
  rescale, the rescale and the mask's public-key encryption
  (:func:`~securevfl.exchange.ckks.params.error_model`). At the defaults c_w =
  2^13.81; measured against SEAL over nine key pairs, the reference forward
  product gave 2^13.2 to 2^14.5 per unit operand norm (the key switching error's
  energy sits in a few slots and varies with the Galois keys: hence the factor 2
  of margin; tests/unit/test_ckks_noise.py), so sigma_e <= 2^-55.2.
* Flooding. sigma_f = 2^(s/2) sqrt(Q N) sigma_e with s = flood_security_bits = 30,
  Q = max_decryptions = 2^20 ciphertexts per key pair (refused beyond: a
  100k-step run of the reference workload decrypts 6 x 10^5 under A's key, 2 x
  10^5 under each P_i's): sigma_f = 2^-23.7 = 7.4e-8 per value, a coefficient
  standard deviation of sigma_f Delta / sqrt(N/2) = 2^59.3.
* Statistical distance. Let the ideal run replace every decryption by the
  error-free result plus the same noise: nothing in it depends on the key or the
  owner's encryption randomness. Flooded Gaussians shifted by the errors differ
  from it by KL <= Q N sigma_e^2 / (2 sigma_f^2) = 2^-(s+1) over the whole run
  (KL adds over adaptively chosen decryptions), so by Pinsker the two runs are
  within statistical distance 2^-(s/2+1) = 2^-16; in the LMSS form, Gaussian
  flooding of 2^(s/2) sqrt(Q) ||e||_2 with ||e||_2 the error polynomial's norm.
* Key recovery. The Renyi divergence of order alpha is exp(alpha 2^-(s+1)); by
  probability preservation a key recovery with probability p in the ideal run
  (RLWE: p ~ 2^-128) has at most (p e^(alpha 2^-31))^(1 - 1/alpha) in the real
  one: alpha = 2^20 keeps 127.99 bits.
* What it is not: the bound holds for the protocol's operands within the guards
  (semi-honest evaluator); the noise is float64 Box-Muller (AES-CTR uniforms)
  rounded to integers by the encoder, not an exact discrete Gaussian.

Masks (the key owner's view of every result; :mod:`~securevfl.exchange.ckks.peer`):
Gaussian of mask_std = 2^21 on every real slot coordinate (|mask| <= 2^24.1);
per value, statistical distance |v - v'| / 2^22 (v: the part of the masked
product the key owner must not learn); over a run, Gaussian masks compose as
KL: ||v - v'||_2 / 2^22 for all masked values together (a 100k-step reference
run masks about 2^31 values per key owner: 2^-6.5 for unit differences in every
value, far from docs/design.md §13's 2^-40; uniform masks of the same width would
compose linearly, to about 2^8). The masks are float64, on the grid of their ulp
(2^-28); the evaluator's smudging noise (2^-27, two ulps) hides that grid. P_i's
weight share is re-drawn uniform in +-2^share_bits (2^16) every step
(:meth:`CkksScheme.share_bits`): A's share W_i - U hides W_i within
|W_i - W'_i| / 2^17 per weight and step, linearly over steps (a uniform share's
order statistics leak at that rate: T steps pin W_i to about 2^17 / T).

Bounds by construction, and guards (:mod:`~securevfl.exchange.he.bounds`,
:mod:`~securevfl.exchange.ckks.key`, :mod:`~securevfl.exchange.ckks.peer`):
encrypted operands have rows (and, for dL/dz, columns) of l2 norm <=
2^value_norm_bits = 2^8: P_i clips every row of h'_i to it and A scales dL/dz
into it before encrypting, whatever the bottom model; the evaluator's operands
have columns <= 2^operand_norm_bits = 2^19 (re-drawn shares: about 2^18.2;
h'_i's columns at most sqrt(batch) 2^8, checked at load), so every product stays
below 2^27 and, with its mask, below the exact-decryption limit 2^27.5 (Q_out =
2^118 at Delta = 2^89); the key owner also refuses a decryption with any slot past
the limit (a wrap). A violation raises :class:`~securevfl.errors.Diverged` naming
the value and the bound; the norm that passed it stays in the owner's ``detail``.

Precision: every decrypted value carries sigma_f (7.4e-8) and the smudging
(7.5e-9), plus float64 decoding (~|value| 2^-50).

Modules, one job each (this face is the declaration alone, :class:`Ckks`: it imports
neither torch nor TenSEAL):

* :mod:`~securevfl.exchange.ckks.params`: options, the 128-bit and budget checks, the noise model,
  the context;
* :mod:`~securevfl.exchange.ckks.packing`: slot layouts and the diagonal maps (pure numpy);
* :mod:`~securevfl.exchange.ckks.wire`: blobs and the public part on the wire;
* :mod:`~securevfl.exchange.ckks.kernels`: BSGS evaluation of the maps with SEAL (chained baby
  steps, Horner giant steps);
* :mod:`~securevfl.exchange.ckks.worker`: one computation on a thread while the party waits;
* :mod:`~securevfl.exchange.ckks.key` / :mod:`~securevfl.exchange.ckks.peer`: the key owner and the evaluator;
* :mod:`~securevfl.exchange.ckks.counters`: primitive-operation counts for floors;
* :mod:`~securevfl.exchange.ckks.scheme`: the scheme behind :mod:`securevfl.exchange.he.protocol`;
* :mod:`~securevfl.exchange.ckks.roles`: the role objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.exchange.ckks.params import CkksOptions, check, describe
from securevfl.exchange.he.declaration import HEBackend


class Ckks(HEBackend):
    """The ``ckks`` backend's declaration (its role objects: :mod:`.roles`)."""

    name = "ckks"
    roles = "securevfl.exchange.ckks.roles:CkksRoles"
    options = CkksOptions
    description = (
        "CKKS (TenSEAL) two-party interactive layer: batch-packed ciphertexts, shares of W_i, masked openings"
    )

    @classmethod
    def check_scheme(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, CkksOptions)
        check(proto, options)

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, CkksOptions)
        return describe(options)


__all__ = ["Ckks", "CkksOptions"]
