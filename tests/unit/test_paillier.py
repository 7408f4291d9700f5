"""The ``paillier`` scheme: fixed-point encoding with one scale per blob, packed
slots, homomorphic products against numpy, masks, key and blob validation, and
the load-time parameter checks. 2048-bit keys, tiny matrices."""

from __future__ import annotations

import struct

import gmpy2
import numpy as np
import pytest
import torch
from phe import paillier as phe_paillier
from pydantic import ValidationError

from securevfl.app.loader import load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, CryptoParameterError, ProtocolError
from securevfl.exchange import EXCHANGES
from securevfl.exchange.he.protocol import _Shares
from securevfl.exchange.he.scheme import redraw_share
from securevfl.exchange.paillier import PaillierOptions, exact
from securevfl.exchange.paillier.backend import PaillierScheme
from securevfl.exchange.paillier.counters import counting
from securevfl.exchange.paillier.encoding import COLS, ROWS, pack, unpack, unpack_ints
from securevfl.exchange.paillier.scheme import PaillierKey
from securevfl.exchange.paillier.wire import BLOB_HEAD, SEC_HEAD, SEC_LEN, dump_public, load_blob
from tests.support.protocols import load_yaml

OPTS = PaillierOptions(precompute=False, threads=1)
FX, FW, FXS = OPTS.precision_bits, OPTS.scalar_precision_bits, OPTS.shared_precision_bits
FS = FXS + FW  # the protocol's result scale: shares, masks and masked results


@pytest.fixture(scope="module")
def scheme() -> PaillierScheme:
    return PaillierScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme) -> PaillierKey:
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender="rank 1 (left)")


@pytest.fixture(scope="module")
def arith(scheme):
    return scheme.arith()


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
    x = r.normal(0.0, 2.0, size=(19, 4))  # 19 rows: two row blocks of 10 slots
    w = r.normal(0.0, 2.0**28, size=(4, 3))  # large operands, as weight shares are
    w[0, 0] = 0.0
    mask = r.uniform(-(2.0**24), 2.0**24, size=(19, 3))  # the generic API takes float masks too
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
    mask = -r.uniform(-(2.0**24), 2.0**24, size=(a, m))
    got = key.decrypt(peer.tmatmul(p, key.encrypt(y), y.shape, mask), (a, m))
    assert np.max(np.abs(got - (p.T @ y + mask))) < rows * 2.0**-FW * 0.05 * 4 + 2.0**-24


def test_padding_slots_are_masked_too(key, peer, scheme):
    """The last row block has unused slots; the peer masks them as well (as wide as
    the slot allows, whatever the caller's mask), so even a sender that put values
    there would read nothing but noise."""
    x = np.ones((17, 2))
    out = peer.matmul(key.encrypt(x), x.shape, np.ones((2, 1)), np.zeros((17, 1)))
    (sec,) = load_blob(out, key.n, key.n2, "test")
    assert sec.slots == 10
    slots = unpack_ints(key.decrypt_ints(sec.cts), key.n, sec.slots, sec.slot_bits)
    assert np.all(slots[0] == 2 << sec.scale) and np.all(slots[1, :7] == 2 << sec.scale)  # rows 0..16
    assert all(abs(int(v)).bit_length() > sec.slot_bits - 40 for v in slots[1, 7:])  # the rest: masks


def test_products_need_the_right_layout(key, peer):
    x = np.ones((3, 2))
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\).*'rows'"):
        peer.tmatmul(np.ones((3, 1)), key.encrypt(x, ops=frozenset({"matmul"})), (3, 2), np.zeros((1, 2)))
    with pytest.raises(ProtocolError, match="'cols'"):
        peer.matmul(key.encrypt(x, ops=frozenset({"tmatmul"})), (3, 2), np.ones((2, 1)), np.zeros((3, 1)))


def test_masks_are_uniform_integers_over_every_bit_of_their_width(scheme, arith):
    """A mask of the forward product (terms 64, hiding A's share) at the reference
    run: sigma = 75 over a 63-bit bound on the hidden part, so 138 bits, uniform on
    [-2^137, 2^137) at the result scale 2^-44: no bit below the top is fixed (the
    grid of the masks of an earlier version left the low 16 bits of every slot bare)."""
    prm = scheme.prm
    assert (prm.sigma, prm.share) == (75, 78)
    width = prm.mask_bits(64, prm.hidden_bits(True), prm.fxs)
    assert width == 8 + 24 + 5 + 20 + 6 + 75 == 138
    m = arith.mask(SecretStream.from_seed(3, "test"), (64, 64), terms=64, share=True)
    assert m.dtype == object and m.shape == (64, 64)
    vals = [int(v) for v in m.ravel()]
    assert min(vals) >= -(1 << (width - 1)) and max(vals) < 1 << (width - 1)
    assert max(vals) > 1 << (width - 2) and min(vals) < -(1 << (width - 2))  # spread over the range
    for bit in (*range(24), width - 2):  # every low bit (and a high one) is a fair coin
        ones = sum((v >> bit) & 1 for v in vals)
        assert abs(ones - len(vals) / 2) < 5 * (len(vals) / 4) ** 0.5, bit
    # a weight-gradient mask (tmatmul: terms = batch, hiding the whole embedding)
    r = arith.mask(SecretStream.from_seed(4, "test"), (8, 8), terms=256, share=False)
    assert exact.signed_bits(r) <= prm.mask_bits(256, prm.v, prm.fxs) == 8 + 24 + 8 + 20 + 8 + 75


def test_out_of_range_operands_are_refused(key, peer):
    with pytest.raises(ConfigError, match="value_bits"):
        key.encrypt(np.full((2, 2), 2.0**8))
    blob = key.encrypt(np.ones((2, 2)))
    with pytest.raises(ConfigError, match="scalar_bits"):
        peer.matmul(blob, (2, 2), np.full((2, 1), 2.0**40), np.zeros((2, 1)))
    with pytest.raises(ProtocolError, match="could overflow"):  # a mask wider than the slot
        peer.matmul(blob, (2, 2), np.ones((2, 1)), np.full((2, 1), 2.0**140))
    with pytest.raises(ValueError, match="finite"):
        peer.matmul(blob, (2, 2), np.ones((2, 1)), np.full((2, 1), np.inf))


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
    for section in ("dataset", "top"):
        assert pai[section] == plain[section]
    # the file's header states the size reduction: 5 epochs at twice the learning rate
    schedule = {"epochs", "lr"}
    assert {k: v for k, v in pai["training"].items() if k not in schedule} == {
        k: v for k, v in plain["training"].items() if k not in schedule
    }
    assert (pai["training"]["epochs"], pai["training"]["lr"]) == (5, 0.006)
    for a, b in zip(plain["parties"]["passive"], pai["parties"]["passive"], strict=True):
        assert a["columns"] == b["columns"] and a["model"]["kind"] == b["model"]["kind"]


def test_check_refuses_small_keys():
    with pytest.raises(CryptoParameterError) as info:
        load_protocol_dict(paillier_doc(key_bits=1024))
    assert info.value.path == "exchange.params.key_bits"
    assert "exchange.params.key_bits" in str(info.value) and "112-bit" in str(info.value)


def test_check_refuses_a_run_bound_weaker_than_2_to_the_40():
    with pytest.raises(CryptoParameterError, match="statistical distance") as info:
        load_protocol_dict(paillier_doc(distance_bits=39))
    assert info.value.path == "exchange.params.distance_bits"
    load_protocol_dict(paillier_doc(distance_bits=40))


def test_check_refuses_a_run_longer_than_the_bound_covers():
    doc = paillier_doc(run_steps=1000)
    doc["training"] = {**doc["training"], "max_steps": 1001}
    with pytest.raises(CryptoParameterError, match="run_steps=1000") as info:
        load_protocol_dict(doc)
    assert info.value.path == "exchange.params.run_steps"
    doc["training"]["max_steps"] = 1000
    load_protocol_dict(doc)


@pytest.mark.parametrize("field,value", [("mask_bits", 12), ("share_bits", 16)])
def test_the_former_width_options_are_refused(field, value):
    """Mask and share widths follow from distance_bits, run_steps and weight_bits;
    a protocol file cannot set a narrower one."""
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(paillier_doc(**{field: value}))
    assert info.value.path == f"exchange.params.{field}"


def test_check_refuses_overflowing_slots():
    """paillier.yaml (batch 64, 16-wide embeddings and z, run_steps 1,024): sigma 64,
    the widest protocol slot (the weight gradient's) 132 bits; at batch 512, 138; at
    the default run_steps (131,072 passes) sigma 71 and 139 bits."""
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(paillier_doc(slot_bits=100))
    assert info.value.path == "exchange.params.slot_bits"
    assert "overflow" in str(info.value) and "batch_size 64" in str(info.value)
    load_protocol_dict(paillier_doc(slot_bits=132))
    with pytest.raises(ConfigError, match="slot_bits"):
        load_protocol_dict(paillier_doc(slot_bits=131))
    with pytest.raises(ConfigError, match="slot_bits"):  # a larger batch needs wider slots
        load_protocol_dict({**paillier_doc(slot_bits=132), "training": {"batch_size": 512}})
    with pytest.raises(ConfigError, match="slot_bits"):  # a longer run needs wider masks
        load_protocol_dict(paillier_doc(slot_bits=138, run_steps=1 << 17))
    load_protocol_dict(paillier_doc(slot_bits=139, run_steps=1 << 17))


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


# -- he/protocol.py's protocol path: re-drawn shares, narrow slots, the owner's rounded copy ------


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


def test_exact_redraw_keeps_the_sum_exactly_and_draws_u_at_full_resolution(arith, scheme):
    """P_i's re-draw in exact integers: the sum W^A + W^P does not move by one unit of
    2^-44, and U is uniform on [-2^(k+44), 2^(k+44)) (k = 78), every low bit a coin."""
    st = SecretStream.from_seed(10, "test")
    w_a = exact.uniform(st, (40, 40), 150)
    w_p = exact.uniform(st, (40, 40), 150)
    delta, u = arith.redraw(st, w_p)
    assert ((w_a + delta) + u == w_a + w_p).all()
    k = scheme.prm.share + FS
    vals = [int(v) for v in u.ravel()]
    assert min(vals) >= -(1 << k) and max(vals) < 1 << k and max(vals) > 1 << (k - 1)
    for bit in range(8):
        ones = sum((v >> bit) & 1 for v in vals)
        assert abs(ones - len(vals) / 2) < 5 * (len(vals) / 4) ** 0.5, bit


def test_exact_sgd_step_matches_float_and_adds_up_on_shares(arith):
    """lr and momentum act on integer shares as the exact dyadic rationals they are,
    rounded once per side: the two shares' updates add up to the update of W_i
    within one unit of 2^-44 per product."""
    st = SecretStream.from_seed(11, "test")
    w = arith.from_float(rng(11).normal(0.0, 0.3, size=(6, 5)))
    u = exact.uniform(st, (6, 5), 120)
    a, p = _Shares(w - u, 0.05, 0.9, arith), _Shares(u, 0.05, 0.9, arith)
    grads = [arith.from_float(rng(12 + t).normal(0.0, 1e-3, size=(6, 5))) for t in range(5)]
    plain_w, plain_v = arith.to_float(w), None
    for g in grads:
        r = exact.uniform(st, (6, 5), 140)
        a.step(g - r)
        p.step(r)
        gf = arith.to_float(g)
        plain_v = gf if plain_v is None else 0.9 * plain_v + gf
        plain_w = plain_w - 0.05 * plain_v
    got = arith.to_float(a.w + p.w)
    assert np.max(np.abs(got - plain_w)) < 20 * 2.0**-FS
    assert exact.bit_length(a.w) > 100  # the shares themselves are masks


def test_limbs_round_trip_and_refuse_what_does_not_fit():
    st = SecretStream.from_seed(12, "test")
    v = exact.uniform(st, (5, 7), 150)
    v[0, 0], v[0, 1] = -(1 << 191), (1 << 191) - 1
    t = exact.to_limbs(v, 3)
    assert t.dtype == np.int64 and t.shape == (5, 7, 3)
    assert (exact.from_limbs(t) == v).all()
    assert exact.limbs_for(v) == 3
    with pytest.raises(OverflowError):
        exact.to_limbs(v, 2)


def test_exact_matmul_matches_python_integers():
    r = rng(13)
    st = SecretStream.from_seed(13, "test")
    a = r.integers(-(2**32), 2**32, size=(9, 64))
    b = exact.uniform(st, (64, 5), 160)
    assert (exact.matmul(a, b, 32) == exact.ints(a) @ b).all()
    wide = r.integers(-(2**61), 2**61, size=(3, 4))  # too wide for int64 limbs: big-integer path
    assert (exact.matmul(wide, b[:4], 61) == exact.ints(wide) @ b[:4]).all()


def test_shared_packing_decrypts_exactly_to_the_shared_integers(key, scheme):
    """The protocol's Enc(h'_i): operands below 2^79 (A's share) and values at 2^-24,
    masks of 138 bits: 140-bit slots, 14 per ciphertext; the generic packing hides
    a whole 40-bit operand at 2^-48: 199-bit slots, 10."""
    x = rng(11).normal(0.0, 1.0, size=(50, 64))
    blob = key.encrypt_shared(x, ops=frozenset({"matmul"}), share_bits=scheme.share_bits() + 1)
    ((head, _),) = sections(blob)
    layout, scale, slot_bits, slots, rows, cols, _, count = head
    assert (layout, scale, slot_bits, slots) == (COLS, 24, 140, 14)
    assert (rows, cols, count) == (50, 64, 64 * 4)  # 50 rows in blocks of 14
    generic = sections(key.encrypt(x, ops=frozenset({"matmul"})))[0][0]
    assert generic[2] == 199 and generic[3] == 10
    copy = key.shared_copy(x)
    np.testing.assert_array_equal(key.decrypt(blob, x.shape), copy)
    np.testing.assert_array_equal(np.ldexp(key.shared_ints(x).astype(np.float64), -24), copy)
    assert np.max(np.abs(copy - x)) <= 2.0**-25
    assert sections(key.encrypt_shared(x, share_bits=None)) == sections(key.encrypt(x))  # generic


def test_protocol_forward_product_is_exact(key, peer, scheme, arith):
    """z = Dec(Enc(h) W^A + eps) + h W^P - eps with W^A = W - U, |U| < 2^78: the
    masked share is exactly H round(W^A 2^20) + round(H W^P 2^20 / 2^24)... at 2^-44,
    and z meets h W within A's rounding of its operand to 2^-20."""
    r = rng(12)
    st = SecretStream.from_seed(12, "test")
    h = r.normal(0.0, 1.0, size=(30, 8))
    w = r.normal(0.0, 0.2, size=(8, 4))
    _, u = arith.redraw(st, arith.from_float(np.zeros((8, 4))))
    w_a = arith.from_float(w) - u
    eps = arith.mask(st, (30, 4), terms=8, share=True)
    blob = key.encrypt_shared(h, ops=frozenset({"matmul"}), share_bits=scheme.share_bits() + 1)
    out = peer.matmul(blob, h.shape, arith.operand(w_a), eps)
    v = arith.decrypt(key, out, (30, 4))
    hq = key.shared_ints(h)
    assert (v == exact.matmul(hq, arith.operand(w_a), 32) + eps).all()
    s = v + arith.product(hq, u)
    z = arith.to_float(s - eps)
    tol = 8 * np.abs(h).sum(axis=1).max() * 2.0**-21 + 8 * 2.0**-25 * np.abs(w).sum(axis=0).max()
    assert np.max(np.abs(z - h @ w)) < tol < 1e-4


def test_tmatmul_on_the_shared_rows_layout(key, peer, scheme, arith):
    r = rng(13)
    st = SecretStream.from_seed(13, "test")
    g = r.normal(0.0, 0.01, size=(40, 6))
    h = r.normal(0.0, 1.0, size=(40, 5))
    mask = arith.mask(st, (5, 6), terms=40, share=False)
    blob = key.encrypt_shared(g, share_bits=scheme.share_bits())
    got = arith.decrypt(key, peer.tmatmul(h, blob, g.shape, -mask), (5, 6))
    hw = np.rint(np.ldexp(h, FW)).astype(np.int64)  # h as the evaluator encodes it
    assert (got == exact.ints(hw.T) @ exact.ints(key.shared_ints(g)) - mask).all()


def test_evaluator_refuses_operands_that_could_overflow_narrow_slots(key, peer, scheme):
    k = scheme.share_bits()
    blob = key.encrypt_shared(np.ones((3, 2)), ops=frozenset({"matmul"}), share_bits=k + 1)
    peer.matmul(blob, (3, 2), exact.ints(np.full((2, 1), 1)) << (k + FW), np.zeros((3, 1)))  # promised
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\).*could overflow"):
        peer.matmul(blob, (3, 2), exact.ints(np.full((2, 1), 1)) << (k + FW + 8), np.zeros((3, 1)))


def test_prepared_obfuscators_are_the_ones_the_products_take(key, peer, scheme, arith):
    """P_i makes the obfuscators of its backward products while it waits: exactly one
    per output ciphertext, each used once, and the products still decrypt right."""
    r = rng(14)
    st = SecretStream.from_seed(14, "test")
    b, d, o = 30, 5, 4
    g, h = r.normal(0.0, 0.01, size=(b, o)), r.normal(0.0, 1.0, size=(b, d))
    wp = exact.uniform(st, (d, o), scheme.share_bits() + FW + 1)
    peer.prepare_operands((b, o), w=wp.T, p=h)
    stocked = list(peer._fresh._stock)
    assert len(stocked) == d * 2 + d * 1  # u: d cols x 2 blocks of 15; dW: d rows x 1 block
    blob = key.encrypt_shared(g, share_bits=scheme.share_bits())
    zero = exact.ints(np.zeros((b, d), dtype=np.int64))
    with counting() as c:
        u = peer.matmul(blob, (b, o), wp.T, zero)
        dw = peer.tmatmul(h, blob, (b, o), exact.ints(np.zeros((d, o), dtype=np.int64)))
    assert c.obfuscations == 0 and peer._fresh.stocked() == 0
    assert len({int(v) for v in stocked}) == len(stocked)
    gq = key.shared_ints(g)
    assert (arith.decrypt(key, u, (b, d)) == exact.ints(gq) @ wp.T).all()
    hw = np.rint(np.ldexp(h, FW)).astype(np.int64)
    assert (arith.decrypt(key, dw, (d, o)) == exact.ints(hw.T) @ exact.ints(gq)).all()


def test_prepared_encryption_randomness_is_used_once(scheme):
    key = scheme.new_key()
    x = rng(15).normal(0.0, 1.0, size=(50, 7))
    k = scheme.share_bits() + 1
    key.prepare_encryption(x.shape, ops=frozenset({"matmul"}), share_bits=k)
    stocked = list(key._fresh._stock)
    blob = key.encrypt_shared(x, ops=frozenset({"matmul"}), share_bits=k)
    ((head, _),) = sections(blob)
    assert len(stocked) == head[-1] == 7 * 4  # 7 columns x 4 row blocks of 14
    assert key._fresh.stocked() == 0
    np.testing.assert_array_equal(key.decrypt(blob, x.shape), key.shared_copy(x))


def test_a_run_longer_than_run_steps_stops_with_a_clear_error():
    arith = PaillierScheme(PaillierOptions(run_steps=3, threads=1)).arith()
    for passes in (1, 2, 3):
        arith.check_pass(passes)
    with pytest.raises(ConfigError, match="run_steps=3") as info:
        arith.check_pass(4)
    assert info.value.path == "exchange.params.run_steps"


def test_checkpointed_shares_load_exactly_and_from_float(arith):
    st = SecretStream.from_seed(16, "test")
    v = exact.uniform(st, (4, 3), 160)
    assert (arith.load(arith.save(v)) == v).all()
    old = torch.tensor([[0.5, -0.25], [1e-3, 3.0]], dtype=torch.float64)  # a float share of an older run
    assert (arith.load(old) == exact.from_float(old.numpy(), FS)).all()
