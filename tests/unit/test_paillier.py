"""The ``paillier`` scheme: fixed-point encoding with one scale per blob, packed
slots, homomorphic products against numpy, masks, key and blob validation, and
the load-time parameter checks. 2048-bit keys, tiny matrices."""

from __future__ import annotations

import struct

import gmpy2
import numpy as np
import pytest
from conftest import load_yaml
from phe import paillier as phe_paillier
from pydantic import ValidationError

from securevfl.app.loader import load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, CryptoParameterError, ProtocolError
from securevfl.exchange import EXCHANGES
from securevfl.exchange.he import redraw_share
from securevfl.exchange.paillier import (
    BLOB_HEAD,
    COLS,
    ROWS,
    SEC_HEAD,
    SEC_LEN,
    PaillierKey,
    PaillierOptions,
    PaillierScheme,
    counting,
    dump_public,
    load_blob,
    pack,
    unpack,
)

OPTS = PaillierOptions(precompute=False, threads=1)
FX, FW, M = OPTS.precision_bits, OPTS.scalar_precision_bits, OPTS.mask_bits


@pytest.fixture(scope="module")
def scheme() -> PaillierScheme:
    return PaillierScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme) -> PaillierKey:
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender="rank 1 (left)")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def sections(blob: bytes) -> list[tuple[tuple[int, ...], int]]:
    """(header fields, number of ciphertext bytes) of every section of a blob."""
    _, _, nsec = BLOB_HEAD.unpack_from(blob, 0)
    pos, out = BLOB_HEAD.size, []
    for _ in range(nsec):
        (length,) = SEC_LEN.unpack_from(blob, pos)
        head = SEC_HEAD.unpack_from(blob, pos + SEC_LEN.size)
        out.append((head, length - SEC_HEAD.size))
        pos += SEC_LEN.size + length
    assert pos == len(blob)
    return out


def test_backend_is_registered():
    backend = EXCHANGES.get("paillier")
    assert backend.options is PaillierOptions
    assert "he" in backend.capabilities


def test_round_trip_is_exact_at_the_fixed_point_resolution(key):
    x = rng().normal(0.0, 3.0, size=(19, 3))
    x[0, 0], x[1, 1], x[2, 2] = 0.0, -(2.0**8) + 1e-3, 1e-9
    got = key.decrypt(key.encrypt(x), x.shape)
    np.testing.assert_array_equal(got, np.rint(np.ldexp(x, FX)) / 2.0**FX)
    assert np.max(np.abs(got - x)) <= 2.0 ** -(FX + 1)


def test_decryption_agrees_with_phe(key):
    """Our CRT encryption/decryption is textbook Paillier with g = n + 1."""
    pub = phe_paillier.PaillierPublicKey(int(key.n))
    priv = phe_paillier.PaillierPrivateKey(pub, int(key._p), int(key._q))
    ms = [0, 1, 12345, int(key.n) - 1, int(key.n) // 3]
    cts = key.encrypt_ints(ms)
    assert [priv.raw_decrypt(int(c)) for c in cts] == ms
    assert [int(m) for m in key.decrypt_ints(cts)] == ms
    assert pub.raw_encrypt(7, r_value=1) == 1 + 7 * int(key.n)


def test_packing_round_trip_with_negative_totals():
    s, slots = 127, 16
    n = (1 << (slots * s + 2)) + 1
    y = rng().integers(-(2**63), 2**63 - 1, size=(3, slots), dtype=np.int64)
    y[0] = -1  # a negative packed total, wrapped mod n
    y[1, -1] = -(2**63)
    got = unpack([p % n for p in pack(y, s)], n, slots, s)
    np.testing.assert_array_equal(got, y.astype(np.float64))


def test_matmul_matches_numpy(key, peer, scheme):
    r = rng(1)
    x = r.normal(0.0, 2.0, size=(19, 4))  # 19 rows: two row blocks of 16 slots
    w = r.normal(0.0, 2.0**28, size=(4, 3))  # weight shares carry masks, so they are large
    w[0, 0] = 0.0
    mask = scheme.mask(SecretStream.from_seed(int(r.integers(1 << 30)), "test"), (19, 3))
    got = key.decrypt(peer.matmul(key.encrypt(x), x.shape, w, mask), (19, 3))
    want = x @ w + mask
    # rounding: x at 2^-48 times |w|, w at 2^-20 times |x|, plus float64 on ~2^30 values
    tol = 4 * (np.abs(w).max() * 2.0**-FX + np.abs(x).max() * 2.0**-FW) + 2.0**-20
    assert np.max(np.abs(got - want)) < tol
    assert np.max(np.abs((got - mask) - x @ w)) < tol


@pytest.mark.parametrize("rows,a,m", [(19, 2, 3), (5, 2, 20)], ids=["one-block", "two-col-blocks"])
def test_tmatmul_matches_numpy(key, peer, scheme, rows, a, m):
    r = rng(2)
    p = r.normal(0.0, 2.0, size=(rows, a))
    y = r.normal(0.0, 0.05, size=(rows, m))
    mask = -scheme.mask(SecretStream.from_seed(int(r.integers(1 << 30)), "test"), (a, m))
    got = key.decrypt(peer.tmatmul(p, key.encrypt(y), y.shape, mask), (a, m))
    assert np.max(np.abs(got - (p.T @ y + mask))) < rows * 2.0**-FW * 0.05 * 4 + 2.0**-24


def test_padding_slots_are_masked_too(key, peer, scheme):
    """The last row block has unused slots; the peer masks them as well, so even a
    sender that put values there would read nothing but noise."""
    x = np.ones((19, 2))
    out = peer.matmul(key.encrypt(x), x.shape, np.ones((2, 1)), np.zeros((19, 1)))
    (sec,) = load_blob(out, key.n, key.n2, "test")
    slots = unpack(key.decrypt_ints(sec.cts), key.n, sec.slots, sec.slot_bits)
    np.testing.assert_allclose(np.ldexp(slots[0], -sec.scale), 2.0)  # rows 0..15
    assert np.all(np.abs(slots[1, 3:]) > 2.0**sec.scale)  # rows 16..18 are real, the rest masks


def test_products_need_the_right_layout(key, peer):
    x = np.ones((3, 2))
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\).*'rows'"):
        peer.tmatmul(np.ones((3, 1)), key.encrypt(x, ops=frozenset({"matmul"})), (3, 2), np.zeros((1, 2)))
    with pytest.raises(ProtocolError, match="'cols'"):
        peer.matmul(key.encrypt(x, ops=frozenset({"tmatmul"})), (3, 2), np.ones((2, 1)), np.zeros((3, 1)))


def test_masks_are_in_range_and_on_the_grid(scheme):
    m = scheme.mask(SecretStream.from_seed(3, "test"), (64, 64))
    assert m.dtype == np.float64
    assert np.max(np.abs(m)) <= 2.0**M
    k = np.ldexp(m, 52 - M)
    np.testing.assert_array_equal(k, np.rint(k))  # exact in float64, on the 2^(M-52) grid
    assert np.max(m) > 2.0 ** (M - 1) and np.min(m) < -(2.0 ** (M - 1))  # spread over the range
    assert abs(np.mean(m)) < 2.0 ** (M - 4)


def test_out_of_range_operands_are_refused(key, peer):
    with pytest.raises(ConfigError, match="value_bits"):
        key.encrypt(np.full((2, 2), 2.0**8))
    blob = key.encrypt(np.ones((2, 2)))
    with pytest.raises(ConfigError, match="scalar_bits"):
        peer.matmul(blob, (2, 2), np.full((2, 1), 2.0**40), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="mask"):
        peer.matmul(blob, (2, 2), np.ones((2, 1)), np.full((2, 1), 2.0 ** (M + 1)))


def test_every_value_in_a_blob_shares_one_scale(key):
    """No per-value exponent: the header has one scale, the body only ciphertexts,
    and blobs of tiny and large values are indistinguishable but for the ciphertexts."""
    small = np.full((5, 3), 1e-6)
    large = rng(4).normal(0.0, 50.0, size=(5, 3))
    a, b = key.encrypt(small), key.encrypt(large)
    assert len(a) == len(b)
    sa, sb = sections(a), sections(b)
    assert [h for h, _ in sa] == [h for h, _ in sb]
    for (_layout, scale, _s, _slots, _r, _c, ct_bytes, count), body in sa:
        assert scale == FX
        assert body == count * ct_bytes  # nothing but fixed-width ciphertexts
    assert {h[0] for h, _ in sa} == {0, 1}  # both layouts


def test_ciphertexts_are_fresh(key, peer):
    x = np.ones((3, 2))
    a, b = key.encrypt(x), key.encrypt(x)
    assert a[:30] == b[:30] and a != b
    w, mask = np.ones((2, 2)), np.zeros((3, 2))
    assert peer.matmul(a, (3, 2), w, mask) != peer.matmul(a, (3, 2), w, mask)


def test_precomputed_obfuscators_are_never_reused():
    sch = PaillierScheme(PaillierOptions(precompute=True, threads=1))
    k = sch.new_key()
    seen: list = []
    for size in (3, 5, 4):
        seen += k._fresh.take(size)
    assert len({int(v) for v in seen}) == len(seen)


def test_public_part_holds_no_secret_and_cannot_decrypt(key, scheme):
    pub = key.public()
    nb = (key.n.bit_length() + 7) // 8
    assert len(pub) == 7 + nb and pub.endswith(key.n.to_bytes(nb, "big"))
    lam = (key._p - 1) * (key._q - 1)
    for secret in (key._p, key._q, lam):
        raw = secret.to_bytes((secret.bit_length() + 7) // 8, "big")
        assert raw not in pub
    p = scheme.peer(pub, sender="A")
    assert p.n == key.n
    assert not hasattr(p, "decrypt")
    assert not {"_p", "_q", "_hp", "_hq"} & set(vars(p))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b"",
        lambda b: b"garbage" * 10,
        lambda b: b[:-1],
        lambda b: b + b"\0",
        lambda b: b"XXXX" + b[4:],
        lambda b: b[: BLOB_HEAD.size] + struct.pack(">I", 10**6) + b[BLOB_HEAD.size + 4 :],
        lambda b: b[:-512] + b"\xff" * 512,  # a ciphertext >= n^2
    ],
    ids=["empty", "random", "truncated", "trailing", "magic", "length", "range"],
)
def test_garbage_blobs_raise_protocol_error(key, peer, mutate):
    blob = mutate(key.encrypt(np.ones((3, 2))))
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\)"):
        peer.matmul(blob, (3, 2), np.ones((2, 1)), np.zeros((3, 1)))
    with pytest.raises(ProtocolError):
        key.decrypt(blob, (3, 2))


def test_wrong_shape_raises_protocol_error(key, peer):
    blob = key.encrypt(np.ones((3, 2)))
    with pytest.raises(ProtocolError, match="3x2"):
        peer.matmul(blob, (2, 3), np.ones((3, 1)), np.zeros((2, 1)))
    with pytest.raises(ProtocolError, match="3x2"):
        key.decrypt(blob, (3, 3))


@pytest.mark.parametrize(
    "data",
    [b"", b"SVPK", b"SVPK\x01\x00\x10" + b"\x01" * 15, b"\x00" * 300],
    ids=["empty", "header", "short", "zeros"],
)
def test_malformed_public_key_raises_protocol_error(scheme, data):
    with pytest.raises(ProtocolError, match="rank 2 \\(right\\)"):
        scheme.peer(data, sender="rank 2 (right)")


def test_public_key_with_extra_bytes_is_refused(scheme, key):
    with pytest.raises(ProtocolError, match="only n"):
        scheme.peer(key.public() + b"\x01" * 256, sender="A")


def test_small_public_key_is_refused(scheme):
    pub, _ = phe_paillier.generate_paillier_keypair(n_length=1024)
    with pytest.raises(ProtocolError, match="below key_bits=2048"):
        scheme.peer(dump_public(gmpy2.mpz(pub.n)), sender="A")


def paillier_doc(**params):
    doc = load_yaml("paillier.yaml")
    doc["exchange"]["params"] = {**doc["exchange"].get("params", {}), **params}
    return doc


def test_protocol_file_is_the_plain_task():
    proto = load_protocol_dict(paillier_doc())
    assert proto.exchange.backend == "paillier"
    plain, pai = load_yaml("plain.yaml"), load_yaml("paillier.yaml")
    for section in ("dataset", "training", "top"):
        assert pai[section] == plain[section]
    for a, b in zip(plain["parties"]["passive"], pai["parties"]["passive"], strict=True):
        assert a["columns"] == b["columns"] and a["model"]["kind"] == b["model"]["kind"]


def test_check_refuses_small_keys():
    with pytest.raises(CryptoParameterError) as info:
        load_protocol_dict(paillier_doc(key_bits=1024))
    assert info.value.path == "exchange.params.key_bits"
    assert "exchange.params.key_bits" in str(info.value) and "112-bit" in str(info.value)


def test_check_refuses_weak_masks():
    with pytest.raises(CryptoParameterError, match="statistical"):
        load_protocol_dict(paillier_doc(mask_bits=12, scalar_bits=30))


def test_check_refuses_overflowing_slots():
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(paillier_doc(slot_bits=100))
    assert info.value.path == "exchange.params.slot_bits"
    assert "overflow" in str(info.value) and "batch_size 64" in str(info.value)
    load_protocol_dict(paillier_doc(slot_bits=126))
    with pytest.raises(ConfigError, match="slot_bits"):  # a larger batch needs wider slots
        load_protocol_dict({**paillier_doc(slot_bits=126), "training": {"batch_size": 512}})


def test_options_reject_unknown_keys():
    with pytest.raises(ValidationError):
        PaillierOptions.model_validate({"key_bits": 2048, "exponent": 3})
    with pytest.raises(ValidationError):
        PaillierOptions.model_validate({"key_bits": "2048"})  # strict: no coercion
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(paillier_doc(exponent=3))
    assert info.value.path == "exchange.params.exponent"


def test_encrypt_writes_only_the_layouts_the_peer_operations_need(key):
    """h'_i is only ever multiplied (``cols``); dL/dz is multiplied and
    transposed-multiplied (both layouts). A second layout doubles the bytes."""
    x = np.ones((40, 3))
    one = load_blob(key.encrypt(x, ops=frozenset({"matmul"})), key.n, key.n2, "test")
    both = load_blob(key.encrypt(x), key.n, key.n2, "test")
    assert [s.layout for s in one] == [COLS]
    assert sorted(s.layout for s in both) == [COLS, ROWS]
    with pytest.raises(ValueError, match="known"):
        key.encrypt(x, ops=frozenset({"transpose"}))
    with pytest.raises(ValueError, match="known"):
        key.encrypt(x, ops=frozenset())


# -- he.py's protocol path: re-drawn shares, narrow slots, the owner's rounded copy ------


def test_redrawn_share_keeps_the_sum_and_forgets_the_old_share():
    r = rng(10)
    w_a, w_p = r.normal(0.0, 2.0**22, size=(6, 5)), r.normal(0.0, 2.0**22, size=(6, 5))
    u = r.uniform(-(2.0**20), 2.0**20, size=(6, 5))
    delta, new_p = redraw_share(w_p, u)
    new_a = w_a + delta
    ulp = 2.0**-52 * float(np.max(np.abs(w_a) + np.abs(w_p) + np.abs(u)))  # float64 roundings
    np.testing.assert_allclose(new_a + new_p, w_a + w_p, rtol=0, atol=4 * ulp)
    assert np.max(np.abs(new_p - u)) <= 2 * ulp  # P_i's share is U: below 2^20
    # A's new share is W_i - U whatever the old shares were
    np.testing.assert_allclose(new_a, (w_a + w_p) - u, rtol=0, atol=4 * ulp)


def test_shared_packing_is_narrower_and_decrypts_to_the_shared_copy(key):
    """Operands below 2^21 (A's share) and values at 2^-24: 82-bit slots, 24 per
    ciphertext, instead of the generic 125-bit slots (16)."""
    x = rng(11).normal(0.0, 1.0, size=(50, 64))
    blob = key.encrypt_shared(x, ops=frozenset({"matmul"}), share_bits=21)
    ((head, _),) = sections(blob)
    layout, scale, slot_bits, slots, rows, cols, _, count = head
    assert (layout, scale, slot_bits, slots) == (COLS, 24, 82, 24)
    assert (rows, cols, count) == (50, 64, 64 * 3)  # 50 rows in blocks of 24
    generic = sections(key.encrypt(x, ops=frozenset({"matmul"})))[0][0]
    assert generic[2] == 125 and generic[3] == 16
    copy = key.shared_copy(x)
    np.testing.assert_array_equal(key.decrypt(blob, x.shape), copy)
    assert np.max(np.abs(copy - x)) <= 2.0**-25
    assert sections(key.encrypt_shared(x, share_bits=None)) == sections(key.encrypt(x))  # generic


def test_owner_copy_rounded_as_encrypted_cancels_against_a_large_share(key, peer, scheme):
    """z = Dec(Enc(h) W^A + eps) + h W^P - eps with W^A = W - U, |U| < 2^20: with the
    rounded copy the error meets W (small), with the raw copy it meets U (2^20)."""
    r = rng(12)
    h = r.normal(0.0, 1.0, size=(30, 8))
    w = r.normal(0.0, 0.2, size=(8, 4))
    u = r.uniform(-(2.0**20), 2.0**20, size=(8, 4))
    eps = scheme.mask(SecretStream.from_seed(int(r.integers(1 << 30)), "test"), (30, 4))
    out = peer.matmul(key.encrypt_shared(h, ops=frozenset({"matmul"}), share_bits=21), h.shape, w - u, eps)
    v = key.decrypt(out, (30, 4))
    z = v + key.shared_copy(h) @ u - eps
    # rounding: h at 2^-24 times |W|, W^A at 2^-20 times |h|, float64 on ~2^25 values
    tol = 8 * (np.abs(w).sum(axis=0).max() * 2.0**-25 + np.abs(h).sum(axis=1).max() * 2.0**-21) + 2.0**-26
    assert np.max(np.abs(z - h @ w)) < tol < 1e-4
    assert np.max(np.abs(v + h @ u - eps - h @ w)) > 100 * tol  # the raw copy would not do


def test_tmatmul_on_the_shared_rows_layout(key, peer, scheme):
    r = rng(13)
    g = r.normal(0.0, 0.01, size=(40, 6))
    h = r.normal(0.0, 1.0, size=(40, 5))
    mask = -scheme.mask(SecretStream.from_seed(int(r.integers(1 << 30)), "test"), (5, 6))
    blob = key.encrypt_shared(g, share_bits=20)
    got = key.decrypt(peer.tmatmul(h, blob, g.shape, mask), (5, 6))
    want = h.T @ key.shared_copy(g) + mask
    assert np.max(np.abs(got - want)) < 40 * 4 * 2.0**-21 * 0.05 + 2.0**-24


def test_evaluator_refuses_operands_that_could_overflow_narrow_slots(key, peer):
    blob = key.encrypt_shared(np.ones((3, 2)), ops=frozenset({"matmul"}), share_bits=21)
    peer.matmul(blob, (3, 2), np.full((2, 1), 2.0**20), np.zeros((3, 1)))  # within the promise
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\).*could overflow"):
        peer.matmul(blob, (3, 2), np.full((2, 1), 2.0**30), np.zeros((3, 1)))


def test_prepared_obfuscators_are_the_ones_the_products_take(key, peer, scheme):
    """P_i makes the obfuscators of its backward products while it waits: exactly one
    per output ciphertext, each used once, and the products still decrypt right."""
    r = rng(14)
    b, d, o = 30, 5, 4
    g, h = r.normal(0.0, 0.01, size=(b, o)), r.normal(0.0, 1.0, size=(b, d))
    wp = r.uniform(-(2.0**20), 2.0**20, size=(d, o))
    peer.prepare_operands((b, o), w=wp.T, p=h)
    stocked = list(peer._fresh._stock)
    assert len(stocked) == d * 2 + d * 1  # u: d cols x 2 blocks of 26; dW: d rows x 1 block
    blob = key.encrypt_shared(g, share_bits=20)
    with counting() as c:
        u = peer.matmul(blob, (b, o), wp.T, np.zeros((b, d)))
        dw = peer.tmatmul(h, blob, (b, o), np.zeros((d, o)))
    assert c.obfuscations == 0 and peer._fresh.stocked() == 0
    assert len({int(v) for v in stocked}) == len(stocked)
    gq = key.shared_copy(g)
    assert np.max(np.abs(key.decrypt(u, (b, d)) - gq @ wp.T)) < 1e-4
    assert np.max(np.abs(key.decrypt(dw, (d, o)) - h.T @ gq)) < 1e-6


def test_check_refuses_weak_share_bounds():
    with pytest.raises(CryptoParameterError, match="statistical") as info:
        load_protocol_dict(paillier_doc(share_bits=16))
    assert info.value.path == "exchange.params.share_bits"
    with pytest.raises(ConfigError, match="share_bits") as info:
        load_protocol_dict(paillier_doc(share_bits=30, scalar_bits=30))
    assert info.value.path == "exchange.params.scalar_bits"


def test_prepared_encryption_randomness_is_used_once(scheme):
    key = scheme.new_key()
    x = rng(15).normal(0.0, 1.0, size=(50, 7))
    key.prepare_encryption(x.shape, ops=frozenset({"matmul"}), share_bits=21)
    stocked = list(key._fresh._stock)
    blob = key.encrypt_shared(x, ops=frozenset({"matmul"}), share_bits=21)
    ((head, _),) = sections(blob)
    assert len(stocked) == head[-1] == 7 * 2  # 7 columns x 2 row blocks of 25
    assert key._fresh.stocked() == 0
    np.testing.assert_array_equal(key.decrypt(blob, x.shape), key.shared_copy(x))
