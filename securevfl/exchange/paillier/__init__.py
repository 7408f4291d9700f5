"""``paillier``: the two-party HE interactive layer of :mod:`securevfl.exchange.he`
with packed Paillier encryption (g = n + 1), arithmetic in gmpy2.

What it protects is that protocol's (A never sees h'_i, P_i never sees dL/dz,
nobody holds W_i; DESIGN §4, SECURITY.md ``paillier``); this package is the scheme:

- :mod:`.options`     the options, and the bit budgets derived from them;
- :mod:`.encoding`    fixed point (one public scale per blob) and slot packing;
- :mod:`.obfuscation` fresh n-th residues from fixed-base tables (statistical bound);
- :mod:`.scheme`      keys held by their owner: generation, encryption, decryption;
- :mod:`.kernels`     multi-exponentiation and batched powers (evaluation);
- :mod:`.peer`        the evaluator: products under the peer's key, masks, obfuscation;
- :mod:`.wire`        the public key and blob formats (validated, no pickle);
- :mod:`.counters`    counts of primitive operations per process;
- :mod:`.backend`     the :class:`HEScheme` and the registered ``paillier`` backend.

Fixed point, one public scale per role, never a per-value exponent
    Every encrypted value x (an embedding h'_i or a gradient dL/dz) is the integer
    round(x 2^f) with |x| < 2^value_bits; every plaintext operand (a weight share,
    or h'_i in ``tmatmul``) is round(w 2^scalar_precision_bits) with |w| <
    2^scalar_bits; results carry the sum of the two. phe's default encoding picks
    an exponent per value, sends it in the clear (it leaks the magnitude) and makes
    every mixed addition a modexp; here a blob's header has one scale field and the
    values have none. f is a public constant of the blob's role: the generic
    :meth:`PaillierKey.encrypt` uses ``precision_bits`` (48), he.py's protocol
    (:meth:`PaillierKey.encrypt_shared`) ``shared_precision_bits`` (24). Why 48 for
    the generic API: a party that multiplies its own unrounded copy of an operand
    by a large weight share (2^20 or more) next to the peer's product on the
    rounded one gets the rounding error times that share. In the protocol the owner
    multiplies :meth:`PaillierKey.shared_copy`, the values exactly as encrypted, so
    the two halves share one rounding and its error meets W_i = W^A + W^P (|W_i|
    of order 1): 24 bits keep it near 1e-7 on z. The plaintext operand's rounding
    error only meets values below 2^value_bits, and 20 bits keep it near 1e-6
    while the exponents of the scalar multiplications stay short.

Packing (FATE-style; only additions and one scalar per ciphertext are possible)
    A plaintext holds L = (|n| - 1) // S signed slots of S bits. S is sized so that
    no slot can overflow: S >= F + max(value_bits + s + ceil(log2 terms),
    mask_bits) + 3, with F the result scale, 2^s the bound on the plaintext
    operands and ``terms`` the length of the sums (the encryptor knows it from the
    shape); the evaluator re-checks the slot width against its actual operands
    and refuses a product that could overflow. ``slot_bits`` may fix S, which
    ``check`` then verifies against the batch size and the embedding sizes for any
    operand below 2^scalar_bits. Generic :meth:`PaillierKey.encrypt`: s =
    scalar_bits (40), S = 123..127 bits, L = 16 at 2048-bit keys. The protocol
    (:meth:`PaillierKey.encrypt_shared`) knows its operands: A multiplies Enc(h'_i)
    by its share W_i - U, below 2^(share_bits+1); P_i multiplies the ``cols`` of
    Enc(dL/dz) by its share U, below 2^share_bits, and the ``rows`` by h'_i, below
    2^value_bits. At the defaults (F = 44, share_bits 20, terms 64 or 256) that is
    S = 82 bits, L = 24 for Enc(h'_i); S = 81, L = 25 for dL/dz's ``cols``; and
    S = 71, L = 28 for its ``rows``.

    Layouts: ``cols`` packs L consecutive rows of one column into a ciphertext,
    so ``Enc(X) @ w`` multiplies every slot of column k by the same w[k, j] and
    the result comes out in the same layout (one multi-exponentiation per output
    ciphertext over the c ciphertexts of its row block). ``tmatmul`` sums over
    the rows, which need a different scalar per row, so it needs ``rows``: L
    consecutive columns of one row per ciphertext (the ``cols`` layout of X^T);
    p^T @ Y is then the same kernel with p as the scalars. Slots cannot be
    unpacked without the key, so :meth:`PaillierKey.encrypt` writes the layouts
    the peer's operations need (``ops``; each a fresh encryption): the blob of
    dL/dz both, the blob of h'_i only ``cols``.

Masks and hiding
    :meth:`PaillierScheme.mask` draws uniform values on the grid 2^(mask_bits-52)
    in [-2^mask_bits, 2^mask_bits) (exact in float64); the peer adds them under
    encryption. The hiding is statistical: a masked value y + eps has statistical
    distance at most |y - y'| / 2^(mask_bits+1) <= |y| 2^-mask_bits from y' + eps,
    per value (the part of y the decryptor already knows, e.g. its own mask
    contributions to the weight shares, does not count). With the default
    mask_bits = 24 and values of magnitude <= 16 that is 2^-20 per value. Larger
    masks hide better but cost precision in he.py's float64 weight shares
    (absolute error on z ~2^(mask_bits-45) after a long run); ``check`` refuses
    mask_bits < 20. Unused slots of a partial block get fresh masks as well.

Keys and randomness
    2048-bit moduli at least (about 112-bit security; 3072 for 128). The public
    part is n only. Every ciphertext that leaves a party carries its own fresh
    obfuscator, an n-th residue within statistical distance 2^-65 of uniform
    (:mod:`.obfuscation`: leftover hash lemma over fixed-base tables; short
    DJN exponents were rejected because the key owner, who knows p and q, could
    attack them with discrete logarithms modulo 1024-bit primes). gmpy2's list
    powmod releases the GIL, so ``threads`` workers split every batch of
    decryption exponentiations; with ``precompute`` a daemon thread also makes
    the next obfuscators while the party waits on the network.

Costs and floors (reference workload, DESIGN §10: B = 256, h = o = 64, k = 2 passive)
    Per passive party and step the protocol moves the encrypted matrices h'_i
    (B x h), h'_i W^A + eps (B x o), dL/dz (B x o; Paillier needs it in both
    packings, ``cols`` for g W^P^T and ``rows`` for h'^T g), g W^P^T + mu (B x h)
    and h'^T g - R (h x o), and three plaintext float64 matrices (B x o, B x h,
    and the re-draw's h x o). Bytes floor (:func:`.profile.bytes_floor`): every
    encrypted value at the density of its blob, 2|n|/8 / L bytes (512 / 24 =
    21.3 for h'_i and h'_i W^A + eps, 512 / 25 = 20.5 for dL/dz and g W^P^T + mu,
    512 / 28 = 18.3 for h'^T g - R), dL/dz counted once, plus the floats: 1.66 MiB
    per party, 3.32 MiB per step. The blobs as sent: ciphertexts 704 + 704 + 704
    + 768 (dL/dz in both packings) + 704 + 192 per party (704 = 64 columns x 11
    row blocks), 4.25 MiB per step with the floats and headers (1.28x the floor;
    the second packing of dL/dz is most of the difference).
    Operation counts per step: 2,880 encryptions (h'_i 704 per party, dL/dz
    1,472 once), 3,200 decryptions and as many evaluator obfuscators (one per
    output ciphertext: 704 + 704 + 192 per party), 278,528 ciphertext x scalar
    products (64 per output for z and g W^P^T, exponents of ~41 bits; 256 per
    output for h'^T g, exponents of ~22 bits), inside shared multi-exponentiations.
    :mod:`.profile` counts them with :mod:`.counters`, times each primitive, and
    ``benchmarks/exchange.py`` prints count x unit cost beside the measured step.
    Decryption (two 1024-bit exponentiations mod p^2 and q^2 per ciphertext,
    ~2.5 ms) has no fixed-base shortcut, so the floor is set by the number of
    output ciphertexts, i.e. by the slot width: with the evaluator's obfuscator
    (~1.5 ms) each output costs ~4 ms of one core, 13 s a step at 3,200 outputs,
    already more than two cores can do in 900x plain's 5.9 ms (README, "paillier,
    issue #14 second round"). A multi-exponentiation output squares its
    accumulator with products, not ``powmod`` (kernels.multiexp). P_i makes its backward products'
    obfuscators while A evaluates its forward product (``prepare_operands``),
    when it would otherwise wait.

Weight shares (re-drawn every step; he.py, SECURITY.md ``paillier``)
    Each side starts from a Gaussian half N(0, 1/(6d)) (``private``) or A from
    plain's W_i and P_i from 0 (``seeded``). After every update P_i draws U uniform
    in [-2^share_bits, 2^share_bits), sends delta = W^P - U and keeps U; A adds
    delta. A's share is then W_i - U, which hides W_i within statistical distance
    |W_i - W'_i| / 2^(share_bits+1) per weight and step (2^-20 for |W_i - W'_i|
    <= 2 at the default 20, the standard the masks meet for values up to 16;
    ``check`` refuses share_bits < 20), and the scalars stay below 2^41 at 2^-20
    (before: a random walk of P_i's masks, 2^23 after 3 steps, 2^27 after 1,000,
    with exponents growing alike).
"""

from __future__ import annotations

from securevfl.exchange.paillier.backend import PaillierBackend, PaillierScheme
from securevfl.exchange.paillier.counters import OpCounts, counting
from securevfl.exchange.paillier.encoding import COLS, ROWS, pack, unpack
from securevfl.exchange.paillier.options import PaillierOptions
from securevfl.exchange.paillier.peer import PaillierPeer
from securevfl.exchange.paillier.scheme import PaillierKey
from securevfl.exchange.paillier.wire import (
    BLOB_HEAD,
    SEC_HEAD,
    SEC_LEN,
    Section,
    dump_public,
    load_blob,
)

__all__ = [
    "BLOB_HEAD",
    "COLS",
    "ROWS",
    "SEC_HEAD",
    "SEC_LEN",
    "OpCounts",
    "PaillierBackend",
    "PaillierKey",
    "PaillierOptions",
    "PaillierPeer",
    "PaillierScheme",
    "Section",
    "counting",
    "dump_public",
    "load_blob",
    "pack",
    "unpack",
]
