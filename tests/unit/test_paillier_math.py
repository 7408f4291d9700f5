"""Pure math of the ``paillier`` package: the fixed-base obfuscator sampler and its
statistical bound, n-th residuosity and spread of the obfuscators, phe as the
reference implementation in both directions, and the operation counters."""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest
from phe import paillier as phe_paillier

from securevfl.exchange.paillier import PaillierOptions
from securevfl.exchange.paillier.backend import PaillierScheme
from securevfl.exchange.paillier.counters import counting
from securevfl.exchange.paillier.kernels import multiexp
from securevfl.exchange.paillier.obfuscation import (
    TableShape,
    build_tables,
    distance_bound_log2,
    shape_for,
    table_products,
)
from securevfl.exchange.paillier.options import Params
from securevfl.exchange.paillier.profile import bytes_floor, step_counts

OPTS = PaillierOptions(precompute=False, threads=1)


@pytest.fixture(scope="module")
def scheme() -> PaillierScheme:
    return PaillierScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme):
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender="rank 1 (left)")


def test_default_table_shapes_meet_the_bound():
    """|n| = 2048: the n-th residues (rank 2, order < 2^2048); the key owner's CRT
    halves: cyclic of order p - 1 < 2^1024. Both within 2^-64 of uniform per sample."""
    full, half = shape_for(2048, 64), shape_for(1024, 64)
    assert (full.bases, full.digits, full.window) == (136, 2, 8)
    assert (half.bases, half.digits, half.window) == (144, 1, 8)
    for bits, rank, shape in ((2048, 2, full), (1024, 1, half), (3072, 2, shape_for(3072, 64))):
        assert shape.bases >= 2 * 64 + 2
        assert shape.bases * shape.exponent_bits >= bits + 128
        assert distance_bound_log2(bits, rank, shape) <= -64


def test_the_bound_fails_where_it_should():
    """Too few bases: the 2-torsion makes collisions likely (G is not cyclic), and a
    single base with a long exponent is not close to uniform on a rank-2 group."""
    assert distance_bound_log2(2048, 2, TableShape(1, 300, 8)) > -2
    assert distance_bound_log2(2048, 2, TableShape(16, 20, 8)) > -16
    assert distance_bound_log2(2048, 2, TableShape(136, 1, 8)) > -1  # too few exponent bits


def test_table_products_are_fixed_base_multi_exponentiations():
    rng = np.random.default_rng(0)
    mod = gmpy2.next_prime(gmpy2.mpz(2) ** 127) * gmpy2.next_prime(gmpy2.mpz(2) ** 126)
    shape = TableShape(5, 3, 8)
    bases = [gmpy2.mpz(int(v)) for v in rng.integers(2, 2**62, size=5)]
    tables = build_tables(bases, mod, shape)
    digits = rng.integers(0, 256, size=(4, 15), dtype=np.uint8)
    got = table_products(tables, digits, mod)
    for row, g in zip(digits.tolist(), got, strict=True):
        want = gmpy2.mpz(1)
        for j, z in enumerate(bases):
            x = sum(int(d) << (8 * i) for i, d in enumerate(row[3 * j : 3 * j + 3]))
            want = want * gmpy2.powmod(z, x, mod) % mod
        assert g == want


def test_obfuscators_are_spread_nth_residues(key, peer):
    """Both sides' obfuscators are n-th residues mod n^2 (order divides phi(n)), and
    they are not confined to a subgroup a key owner could test (quadratic
    residuosity mod p and mod q takes both values)."""
    phi = (key._p - 1) * (key._q - 1)
    for obf in (key._fresh.take(48), peer._fresh.take(48)):
        assert len({int(s) for s in obf}) == len(obf)
        for s in obf:
            assert gmpy2.powmod(s, phi, key.n2) == 1
        for prime in (key._p, key._q):
            assert {gmpy2.legendre(s % prime, prime) for s in obf} == {-1, 1}


def test_phe_is_the_reference_both_ways(key, peer):
    pub = phe_paillier.PaillierPublicKey(int(key.n))
    priv = phe_paillier.PaillierPrivateKey(pub, int(key._p), int(key._q))
    ms = [0, 1, 98765, int(key.n) - 2]
    assert [priv.raw_decrypt(int(c)) for c in key.encrypt_ints(ms)] == ms  # ours -> phe
    theirs = [gmpy2.mpz(pub.raw_encrypt(m)) for m in ms]
    assert [int(m) for m in key.decrypt_ints(theirs)] == ms  # phe -> ours
    # the evaluator's product and fresh obfuscator: phe decrypts sum_k w_k m_k
    cts, w = key.encrypt_ints([3, 5, 7]), np.array([[2], [-1], [4]], dtype=np.int64)
    (out,) = peer._products(cts, w, 1)
    (r,) = peer._fresh.take(1)
    assert priv.raw_decrypt(int(out * r % key.n2)) == 2 * 3 - 5 + 4 * 7


def test_counters_count_one_matmul(key, peer, scheme):
    """Generic packing of 3 terms: 195-bit slots (a 75-bit statistical margin over
    operands hidden whole), 10 per ciphertext: 40 rows are 4 row blocks."""
    x = np.ones((40, 3))
    blob = key.encrypt(x, ops=frozenset({"matmul"}))
    w = np.array([[1.0, 0.0], [2.0, 3.0], [0.5, 1.0]])
    with counting() as c:
        out = peer.matmul(blob, x.shape, w, np.zeros((40, 2)))
    assert c.obfuscations == 8 and c.encryptions == 0 and c.decryptions == 0
    assert c.ct_scalar == 4 * 5  # per row block: 5 non-zero scalars
    assert c.ct_add == 4 * (5 - 2) + 8  # sums within an output, then the mask
    with counting() as d:
        key.decrypt(out, (40, 2))
    assert d.decryptions == 8 and d.modexps == 16


@pytest.mark.parametrize("k,j,top", [(1, 1, 5), (3, 2, 2**40), (13, 5, 2**20), (70, 3, 2**36)])
def test_multiexp_matches_the_product_of_powers(k, j, top):
    """Signed exponents, a last group shorter than the rest, zero columns."""
    rng = np.random.default_rng(k)
    mod = gmpy2.next_prime(gmpy2.mpz(2) ** 255) * gmpy2.next_prime(gmpy2.mpz(2) ** 254)
    bases = [gmpy2.mpz(int(v)) | 1 for v in rng.integers(3, 2**62, size=k)]
    e = rng.integers(-top, top + 1, size=(k, j))
    e[0, 0] = 0
    got = multiexp(bases, e, mod)
    for jj in range(j):
        want = gmpy2.mpz(1)
        for kk in range(k):
            want = want * gmpy2.powmod(bases[kk], int(e[kk, jj]), mod) % mod
        assert got[jj] == want
    assert multiexp(bases, np.zeros((k, 2), dtype=np.int64), mod) == [1, 1]


@pytest.mark.parametrize(
    "batch,slots,blocks,enc,dec",
    [(20, [16, 16, 15], 2, 6 + 4 + 20, 4 + 6 + 3), (60, [15, 16, 15], 4, 12 + 8 + 60, 8 + 12 + 3)],
)
def test_step_counts_match_the_protocol_shapes(batch, slots, blocks, enc, dec):
    """One step, one passive party, d = 3, o = 2, in the protocol's packing for a run
    of this shape (sigma 65 or 67 bits, re-drawn shares below 2^68 or 2^70, values at
    2^-24): ``slots`` per ciphertext for h, g's ``cols`` and g's ``rows``.
    Enc(h) 3 cols x ``blocks``; Enc(g) cols 2 x ``blocks`` plus rows ``batch`` x 1;
    outputs z 2 x ``blocks``, u 3 x ``blocks``, dW 3 rows x 1, each obfuscated once
    and decrypted once."""
    prm = Params.of(OPTS, batch, [3], 2)
    assert [
        2047 // prm.protocol_slot(cols, t, op, 2048)
        for cols, t, op in ((True, 3, prm.share + 1), (True, 2, prm.share), (False, batch, prm.v))
    ] == slots
    counts, _ = step_counts(OPTS, batch, [3], 2)
    assert counts.encryptions == enc == 5 * blocks + batch
    assert counts.decryptions == counts.obfuscations == dec == 5 * blocks + 3
    assert counts.modexps == 2 * counts.decryptions  # set-up is not part of a step


def test_bytes_floor_is_every_value_at_its_blob_density():
    """Reference point (sigma 75, shares below 2^78): h'_i and its reply, dL/dz and
    g W^P^T in 140-bit slots, the weight gradient in 145-bit ones, 14 per 512-byte
    ciphertext, dL/dz once; plus the plaintext integers per party at their widths:
    z share and masked dL/dh at 140 bits, the re-draw at 124 (78 + 44 + 2)."""
    b, d, o = 256, 64, 64
    per_party = (2 * b * d + 2 * b * o + d * o) * 512 / 14
    per_party += (b * o + b * d) * 140 / 8 + d * o * 124 / 8
    assert bytes_floor(OPTS, b, [d, d], o) == pytest.approx(2 * per_party)
