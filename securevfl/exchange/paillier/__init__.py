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
    round(x 2^precision_bits) with |x| < 2^value_bits; every plaintext operand
    (a weight share, or h'_i in ``tmatmul``) is round(w 2^scalar_precision_bits)
    with |w| < 2^scalar_bits; results carry the sum of the two. phe's default
    encoding picks an exponent per value, sends it in the clear (it leaks the
    magnitude) and makes every mixed addition a modexp; here a blob's header has
    one scale field and the values have none. Why two scales: in ``he.py`` the
    party that owns an encrypted operand also multiplies its own float copy by
    its weight share, and the weight shares absorb the masks R of every step
    (dW^P = R), so they grow to ~2^(mask_bits+4). The rounding error of the
    encrypted operand is multiplied by that share, hence the 48 fractional bits
    (error ~2^(mask_bits+6-precision_bits) on z); the plaintext operand's
    rounding error only meets values below 2^value_bits, and 20 bits keep it
    near 1e-6 while the exponents of the scalar multiplications stay short.

Packing (FATE-style; only additions and one scalar per ciphertext are possible)
    A plaintext holds L = (|n| - 1) // S signed slots of S bits. S is sized so that
    no slot can overflow: S >= F + max(value_bits + scalar_bits + ceil(log2
    terms), mask_bits) + 3, with F the result scale and ``terms`` the length of
    the sums (the encryptor knows it from the shape; the peer re-checks it;
    ``slot_bits`` may fix S, which ``check`` then verifies against the batch size
    and the embedding sizes). With the defaults S is 123..127 bits and L = 16 at
    2048-bit keys.

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
    and h'^T g - R (h x o), and two masked float64 matrices (B x o, B x h).
    Bytes floor: with dL/dz counted once, 2Bh + 2Bo + ho = 69,632 values per party
    at the best safe density, 2|n|/8 / L = 512 / 16 = 32 bytes per value (L slots
    of S = 127 bits: a slot must hold a sum of 64 products of a 56-bit encrypted
    integer and a 60-bit scalar plus a mask), plus 256 KiB of floats: 2.375 MiB
    per party, 4.75 MiB per step; the second packing of dL/dz adds 0.5 MiB per
    party, so the blobs as sent are 5.75 MiB plus headers (about 1.2x the floor).
    Operation floor: per step 4,096 encryptions (h'_i 1,024 per party, dL/dz 2,048
    once), 4,608 decryptions and as many evaluator obfuscators (one per output
    ciphertext: 1,024 + 1,024 + 256 per party), and 393,216 ciphertext x scalar
    products (B h o / L in each of the three products per party: one exponent of
    ~43 bits for a weight share of ~2^23, ~22 bits for h'_i, inside a shared
    multi-exponentiation). :mod:`.profile` counts them with :mod:`.counters`,
    times each primitive, and ``benchmarks/exchange.py`` prints count x unit cost
    beside the measured step. Decryption (two 1024-bit exponentiations mod p^2 and
    q^2 per ciphertext, ~2.5 ms) has no fixed-base shortcut, so 4,608 of them are
    ~11 s of one core per step whatever else is done: the floor is set by the
    number of output ciphertexts, i.e. by the slot width.

Weight shares (not bounded yet)
    Today (he.py) each side starts from a Gaussian half N(0, 1/(6d)) (``private``)
    and P_i's share then moves by -lr v, v the momentum sum of its masks R (uniform
    in +-2^mask_bits), so the shares grow like lr 2^mask_bits / sqrt(3) / (1 -
    momentum) sqrt(t) = 2^22.2 sqrt(t) at lr 0.05, momentum 0.9: 2^23 after 3 steps,
    2^27 after 1,000, and the scalar exponents (share bits + 20) with them. Re-drawing
    P_i's share every step uniformly in [-2^k, 2^k) (A's share: W_i minus it) would
    hide W_i from A within statistical distance |W_i - W'_i| / 2^(k+1) per weight
    (k = 20, |W| <= 2: 2^-19, the masks' standard), cap the exponents at k + 20 = 40
    bits and allow scalar_bits = 32 (S 127 -> 119 bits, L 16 -> 17 slots). It changes
    he.py's protocol, which ``ckks`` shares, so it is left for later.
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
