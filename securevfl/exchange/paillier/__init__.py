"""``paillier``: the two-party HE interactive layer of :mod:`securevfl.exchange.he.protocol`
with packed Paillier encryption (g = n + 1), arithmetic in gmpy2.

What it protects is that protocol's (A never sees h'_i, P_i never sees dL/dz,
nobody holds W_i; docs/design.md §4, SECURITY.md ``paillier``); this package is the scheme:

- :mod:`.options`     the options, and the bit budgets derived from them;
- :mod:`.encoding`    fixed point (one public scale per blob) and slot packing;
- :mod:`.exact`       exact integer arithmetic of shares, masks and masked results;
- :mod:`.arith`       that arithmetic as he/scheme.py's :class:`ShareArith` (and its wire form);
- :mod:`.obfuscation` fresh n-th residues from fixed-base tables (statistical bound);
- :mod:`.scheme`      keys held by their owner: generation, encryption, decryption;
- :mod:`.kernels`     multi-exponentiation and batched powers (evaluation);
- :mod:`.peer`        the evaluator: products under the peer's key, masks, obfuscation;
- :mod:`.wire`        the public key and blob formats (validated, no pickle);
- :mod:`.counters`    counts of primitive operations per process;
- :mod:`.checks`      the load-time checks and the security figures a result records;
- :mod:`.backend`     the :class:`HEScheme` (keys, peers, arithmetic, sized for the run);
- :mod:`.roles`       the role objects; this face is the declaration alone,
  :class:`Paillier` (it imports neither torch nor gmpy2).

Fixed point, one public scale per role, never a per-value exponent
    Every encrypted value x (an embedding h'_i or a gradient dL/dz) is the integer
    round(x 2^f) with |x| < 2^value_bits; every plaintext operand (a weight share,
    or h'_i in ``tmatmul``) is round(w 2^scalar_precision_bits). Results carry the
    sum of the two scales. phe's default encoding picks an exponent per value,
    sends it in the clear (it leaks the magnitude) and makes every mixed addition a
    modexp; here a blob's header has one scale field and the values have none. f is
    a public constant of the blob's role: the HE protocol (he/protocol.py)
    (:meth:`PaillierKey.encrypt_shared`) uses ``shared_precision_bits`` (24), the
    generic :meth:`PaillierKey.encrypt` ``precision_bits`` (48).

Exact integers, no float64 (:mod:`.exact`, :mod:`.arith`)
    In the protocol every weight share, momentum buffer, mask and masked result is
    an integer at the result scale 2^-Fs, Fs = shared_precision_bits +
    scalar_precision_bits (44), held as Python ints: a mask that hides a value has
    the value's bits plus sigma (about 75) more, which float64's 53 bits cannot
    carry. The evaluator multiplies its share rounded to 2^-fw (the exponent); the
    owner of an encrypted operand multiplies the integers it encrypted by its own
    share at full precision and rounds once, so the only error that meets z_i or
    dL/dh'_i is the evaluator's rounding of its share (|h| 2^-21 per term) and the
    rounding of the encrypted values to 2^-24 (2^-25 |W_i| per term), as before.
    SGD with momentum runs on the integer shares with lr and momentum as the exact
    dyadic rationals their float64 values are, rounded to 2^-44 on each side.
    The plaintext matrices on the wire (z share, masked dL/dh, re-draw delta) are
    int64 limbs; only z_i and dL/dh'_i, the protocol outputs, become float64.

Masks: uniform over every bit of the slot, bounded for a whole run (docs/design.md §13)
    Every mask is an integer at 2^-Fs, uniform on [-2^(m-1), 2^(m-1)), drawn from
    the party's secret stream (AES-256-CTR, :mod:`securevfl.csprng`): no bit of a
    slot lies outside its range. (An earlier version drew float64 masks on a 2^-28
    grid under 2^-44 slots: the low 16 bits of every slot were H X mod 2^16, which
    the key owner, knowing H, solved for the other party's encoded share;
    tests/threat_model/test_paillier_slot_bits.py plays that attack.)
    Against the key owner, who knows its own input and share, a masked sum y + M
    is compared with y_ref + M, y_ref the same sum with the other party's secret
    set to zero (which the key owner can compute itself): their statistical
    distance is |y - y_ref| / 2^m < 2^(h - m) when |y - y_ref| < 2^h, and
    m = h + sigma makes it 2^-sigma per value. The bounds h (Params.mask_bits):

    - eps (B x o; A draws, P_i decrypts Enc(h W^A + eps)): P_i knows h and U, so
      the unknown is h W_i: h = v + fxs + (wb + 1) + fw + ceil log2 d, with
      |W_i| < 2^wb (``weight_bits``) and one bit for the rounding of W^A;
    - mu (B x d; P_i draws, A decrypts Enc(g U^T + mu)): A knows g and W^A = W_i - U,
      so the unknown is g W_i^T: h = v + fxs + (wb + 1) + fw + ceil log2 o;
    - R (d x o; P_i draws, A decrypts Enc(h^T g - R)): A knows g, all of h^T g is
      unknown: h = v + fw + v + fxs + ceil log2 B;
    - U, the re-drawn share (d x o; A then holds W_i - U): uniform on [-2^k, 2^k) at
      2^-Fs with k = wb + sigma - 1: distance |W_i| / 2^(k+1) < 2^-sigma per weight.

    A training step masks sum_i (B o + B d_i + 2 d_i o) values (an evaluation or
    prediction batch only B o per party), and the joint start of W_i sum_i 2 d_i o
    (he/protocol.py, "Start"), so a run of ``run_steps`` passes masks at most N = run_steps x
    the first plus the second. Each mask is used once, and each bound holds whatever
    the other values are, so by a hybrid argument over the values the key owner's
    whole view is within N 2^-sigma of one computed from its own inputs and outputs;
    sigma = distance_bits + 1 + ceil log2 N makes that <= 2^-(distance_bits + 1). The
    obfuscators get the other half (obf_sigma = distance_bits + 1 + ceil log2 of a
    bound on the run's ciphertexts, at least 64; :mod:`.obfuscation`), so the run's
    masks and obfuscators together are within 2^-distance_bits (default 2^-40).
    Reference workload (B = 256, d = o = 64, 2 passive parties) and the default
    ``run_steps`` of 131,072 passes (100,000 training steps and 31,072 evaluation or
    prediction batches): N = 1.07e10 <= 2^34, sigma = 75; eps and mu of 138 bits, R
    of 143; U below 2^78; obf_sigma = 76. A run beyond ``run_steps`` stops with an error naming the option
    (he/protocol.py counts passes, checkpoints keep the count); ``training.max_steps`` above it
    is refused at load, as are ``distance_bits`` below 40 and the former fixed-width
    options ``mask_bits`` and ``share_bits``. Assumptions the bound states: inputs
    below 2^value_bits (P_i clips h'_i's rows and A scales dL/dz to l2 norm just under
    it before encrypting, :mod:`securevfl.exchange.he.bounds`; the encoding refuses
    anything past it) and |W_i| < 2^weight_bits (default 4; nobody can check W_i: a
    weight of 2^(wb+t) weakens its own terms by 2^t).

Packing (FATE-style; only additions and one scalar per ciphertext are possible)
    A plaintext holds L = (|n| - 1) // S signed slots of S bits. S is sized so that
    no slot can overflow: S >= max(v + f + s + fw + ceil log2 terms, m - 1) + 3,
    with f the encrypted values' scale, 2^s the bound on the plaintext operands,
    ``terms`` the length of the sums and m the mask's width (the encryptor knows
    them from the shape and the parameters, both parties derive the same); the
    evaluator re-checks the slot width against its actual operands and mask and
    refuses a product that could overflow. ``slot_bits`` may fix S, which ``check``
    verifies against the batch size and the embedding sizes. The protocol's blobs
    (:meth:`PaillierKey.encrypt_shared`): A multiplies Enc(h'_i) by its share W_i - U,
    below 2^(k+1); P_i multiplies the ``cols`` of Enc(dL/dz) by its share U, below
    2^k, and the ``rows`` by h'_i, below 2^value_bits. At the reference workload
    (k = 78) that is S = 140 bits, L = 14 for Enc(h'_i) and for dL/dz's ``cols``
    (the masks set the width), and S = 145, L = 14 for its ``rows`` (before the
    masks covered every bit: 82, 81 and 71 bits, L = 24, 25 and 28). The generic
    :meth:`PaillierKey.encrypt` sizes for masks that hide a whole operand below
    2^scalar_bits at 2^-48: about 199 bits, L = 10.

    Layouts: ``cols`` packs L consecutive rows of one column into a ciphertext,
    so ``Enc(X) @ w`` multiplies every slot of column k by the same w[k, j] and
    the result comes out in the same layout (one multi-exponentiation per output
    ciphertext over the c ciphertexts of its row block). ``tmatmul`` sums over
    the rows, which need a different scalar per row, so it needs ``rows``: L
    consecutive columns of one row per ciphertext (the ``cols`` layout of X^T);
    p^T @ Y is then the same kernel with p as the scalars. Slots cannot be
    unpacked without the key, so :meth:`PaillierKey.encrypt` writes the layouts
    the peer's operations need (``ops``; each a fresh encryption): the blob of
    dL/dz both, the blob of h'_i only ``cols``. Unused slots of a partial block are
    masked by the evaluator as widely as they hold.

Keys and randomness
    2048-bit moduli at least (about 112-bit security; 3072 for 128). The public
    part is n only. Every ciphertext that leaves a party carries its own fresh
    obfuscator, an n-th residue within statistical distance 2^-obf_sigma of
    uniform (:mod:`.obfuscation`: leftover hash lemma over fixed-base tables; short
    DJN exponents were rejected because the key owner, who knows p and q, could
    attack them with discrete logarithms modulo 1024-bit primes). gmpy2's list
    powmod releases the GIL, so ``threads`` workers split every batch of
    decryption exponentiations; with ``precompute`` a daemon thread also makes
    the next obfuscators while the party waits on the network.

Costs and floors (reference workload, docs/design.md §10: B = 256, h = o = 64, k = 2 passive)
    Per passive party and step the protocol moves the encrypted matrices h'_i
    (B x h), h'_i W^A + eps (B x o), dL/dz (B x o; Paillier needs it in both
    packings, ``cols`` for g W^P^T and ``rows`` for h'^T g), g W^P^T + mu (B x h)
    and h'^T g - R (h x o), and three plaintext integer matrices (B x o, B x h, and
    the re-draw's h x o). Bytes floor (:func:`.profile.bytes_floor`): every
    encrypted value at the density of its blob, 2|n|/8 / L bytes (512 / 14 = 36.6),
    dL/dz counted once, plus the integers at their widths (140 bits for the z share
    and the masked dL/dh, 124 for the re-draw): 3.04 MiB per party, 6.07 MiB per
    step (3.32 MiB before the masks covered every bit). The blobs as sent:
    ciphertexts 1,216 + 1,216 + 2,496 (dL/dz in both packings) + 1,216 + 320 per
    party, 6.31 MiB a step, plus the integers as int64 limbs (3 per value, 24
    bytes): 8.0 MiB per step as measured (1.32x the floor; 4.25 MiB before).
    Operation counts per step: 4,928 encryptions (h'_i 1,216 per party, dL/dz
    2,496 once), 5,504 decryptions and as many evaluator obfuscators (one per
    output ciphertext: 1,216 + 1,216 + 320 per party), 475,136 ciphertext x scalar
    products (64 per output for z and g W^P^T, exponents of ~99 bits; 256 per
    output for h'^T g, exponents of ~22 bits), inside shared multi-exponentiations
    (before: 2,880 encryptions, 3,200 decryptions, 278,528 products with 41-bit
    exponents). :mod:`.profile` counts them with :mod:`.counters`, times each
    primitive, and ``benchmarks/exchange.py`` prints count x unit cost beside the
    measured step. Decryption (two 1024-bit exponentiations mod p^2 and q^2 per
    ciphertext, ~2.5 ms) has no fixed-base shortcut, so the floor is set by the
    number of output ciphertexts, i.e. by the slot width. A multi-exponentiation
    output squares its accumulator with products, not ``powmod``
    (kernels.multiexp). P_i makes its backward products' obfuscators while A
    evaluates its forward product (``prepare_operands``), when it would otherwise wait.
    Measured cost of masking every bit (``benchmarks/exchange.py --quick --backends
    plain,paillier --max-steps 2``, two pairs interleaved with the float-mask version
    on the 2-core machine under a load of 11 to 18): 2.1x the step time and 2.0x the
    CPU per step of all ranks (51.2 and 59.9 s against 25.9 and 30.5 s), from 1.7x the
    ciphertexts and 2.4x longer exponents in two thirds of the products; the exact
    integer arithmetic around them takes milliseconds a step.

Weight shares (re-drawn every step; he/protocol.py, SECURITY.md ``paillier``)
    W_i^0 is A's random rotation of P_i's Gaussian factor (a Gaussian start), formed by one
    masked product and a re-draw (``private``, the default: no party knows it; he/protocol.py,
    "Start"), or A starts from plain's W_i and P_i from 0 (``seeded``, only with
    ``insecure: true``: A knows W_i^0). After every update P_i draws U
    uniform on [-2^k, 2^k) at full resolution (``Masks`` above), sends delta = W^P - U
    and keeps U; A adds delta. A's share is then W_i - U, and the plaintext operands
    stay below 2^(k+1) (without the re-draw P_i's share would be a random walk of
    its masks R, growing like sqrt(steps)).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.exchange.he.declaration import HEBackend
from securevfl.exchange.paillier.checks import check, describe
from securevfl.exchange.paillier.options import PaillierOptions


class Paillier(HEBackend):
    """The ``paillier`` backend's declaration (its role objects: :mod:`.roles`)."""

    name = "paillier"
    roles = "securevfl.exchange.paillier.roles:PaillierRoles"
    options = PaillierOptions
    description = "packed Paillier (phe keys, gmpy2); W_i shared between A and P_i; z_i revealed to A only"

    @classmethod
    def check_scheme(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, PaillierOptions)
        check(proto, options)

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, PaillierOptions)
        return describe(options)


__all__ = ["Paillier", "PaillierOptions"]
