"""The ``ckks`` scheme: packing layouts, encrypted products against numpy, masks,
public-context and blob validation, and the load-time parameter checks. One key
pair per module (key generation and the public part take ~0.5 s); no processes.

Tolerance: the stated precision. Every decryption is flooded (sigma_f = 7.4e-8
per value at the defaults) and every result smudged (7.5e-9); float64 decoding
of masked values of magnitude ~mask_std = 2^21 adds ~2^-28; the CKKS noise
itself is ~2^-55 at scale 2^89. TOL = 8 sigma (6.1e-7) leaves no realistic chance
of a Gaussian exceeding it over the ~10^5 values these tests compare; the noise
is tested for its width in test_ckks_noise.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydantic import ValidationError

from securevfl.app.loader import load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, CryptoParameterError, ProtocolError
from securevfl.exchange import EXCHANGES
from tests.support.protocols import load_yaml, small_digits

ts = pytest.importorskip("tenseal")

from securevfl.exchange.ckks import CkksOptions  # noqa: E402  (after the optional-dependency skip)
from securevfl.exchange.ckks.packing import (  # noqa: E402
    SlotLayout,
    matmul_map,
    simulate,
    standard_layout,
    tmatmul_map,
)
from securevfl.exchange.ckks.params import GAUSS_MAX, flood_sigma, smudge_sigma  # noqa: E402
from securevfl.exchange.ckks.scheme import CkksScheme  # noqa: E402
from securevfl.exchange.ckks.wire import HEADER, PUB_HEADER, unframe  # noqa: E402

OPTS = CkksOptions()
TOL = 8 * float(np.hypot(flood_sigma(OPTS), smudge_sigma(OPTS))) + 2.0**-26
SLOTS = OPTS.poly_modulus_degree // 2
SENDER = "rank 1 (left)"

MASKS = SecretStream.from_seed(0, "test-masks")  # reproducible masks for the products under test


@pytest.fixture(scope="module")
def scheme() -> CkksScheme:
    return CkksScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme):
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender=SENDER)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- layouts (pure numpy) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [
        standard_layout(256, 64, SLOTS),  # 2 ciphertexts, 16 blocks of 256
        standard_layout(64, 64, SLOTS),  # spread: 32 blocks of 128
        standard_layout(5, 3, SLOTS),
        standard_layout(4096, 3, SLOTS),
        SlotLayout(64, 64, 16, 256, 64),  # tmatmul output: a-vectors in 64-slot chunks
        SlotLayout(300, 7, 512, 8, 8),  # rows cut into row chunks
    ],
)
def test_layout_packs_every_entry_once(layout):
    assert layout.valid(SLOTS)
    x = _rng().normal(size=(layout.rows, layout.cols))
    packed = layout.pack(x, SLOTS)
    assert packed.shape == (layout.n_ct, SLOTS)
    np.testing.assert_array_equal(layout.unpack(packed), x)
    used = layout.used(SLOTS)
    assert used.sum() == x.size
    assert np.count_nonzero(packed.real) + np.count_nonzero(packed.imag) == x.size


def test_batch_is_packed_along_slots():
    """The rule: never one ciphertext per sample. B=256, 64 columns -> 2 ciphertexts."""
    assert standard_layout(256, 64, SLOTS).n_ct == 2
    assert standard_layout(64, 64, SLOTS).n_ct == 1
    assert standard_layout(4096, 2, SLOTS).n_ct == 1


# -- diagonal maps (pure numpy: the kernels' reference) -----------------------------------------


@pytest.mark.parametrize(
    ("r", "d", "o"),
    [
        (256, 64, 64),
        (64, 64, 64),
        (5, 3, 1),
        (100, 33, 7),
        (4, 70, 80),
        (256, 64, 10),
        (300, 64, 64),  # row chunks, the last one partial
        (1024, 16, 128),  # row chunks, output columns in groups
        (200, 30, 64),  # one chunk in, output wider than the input
    ],
)
def test_diagonal_maps_match_numpy(r, d, o):
    """simulate(map) on the packed slots, unpacked, equals numpy's product."""
    rng = _rng(7)
    x, w, p = rng.normal(size=(r, d)), rng.normal(size=(d, o)), rng.normal(size=(r, o))
    lin = standard_layout(r, d, SLOTS)
    mm = matmul_map(lin, w, SLOTS)
    np.testing.assert_allclose(mm.out.unpack(simulate(mm, lin.pack(x, SLOTS))), x @ w, atol=1e-9)
    tm = tmatmul_map(p, lin, SLOTS)
    np.testing.assert_allclose(tm.out.unpack(simulate(tm, lin.pack(x, SLOTS))), p.T @ x, atol=1e-9)


def test_reference_step_map_sizes():
    """The reference step's maps (B=256, d=o=64): how many diagonals each needs."""
    lin = standard_layout(256, 64, SLOTS)
    mm = matmul_map(lin, np.ones((64, 64)), SLOTS)
    tm = tmatmul_map(np.ones((256, 64)), lin, SLOTS)
    assert (mm.n_out, len(mm.t)) == (2, 64)  # 2 x 2 ciphertexts x 16 block shifts (a and b each)
    assert (tm.n_out, len(tm.t)) == (1, 2 * 191)
    # an operand of matmul only (Enc(h'_i)) is cut in two row chunks of 128 rows with all 32
    # complex columns: chunk c -> chunk c, 32 block shifts, the same diagonals in both chunks
    lin_h = standard_layout(256, 64, SLOTS, tmatmul=False)
    mm_h = matmul_map(lin_h, _rng(5).normal(size=(64, 64)), SLOTS)
    assert (lin_h.n_ct, mm_h.n_out, len(mm_h.t)) == (2, 2, 64)
    assert len({mm_h.diag(g)[0].tobytes() for g in range(len(mm_h.t))}) == 32


def test_products_grow_linearly_with_the_batch():
    """Past 256 rows, row chunks of fixed length: the backward tmatmul's diagonals grow like
    B (they grew like B^2 with one block per column), matmul's distinct diagonals not at all."""
    sizes = {}
    for b in (512, 1024, 2048):
        lin = standard_layout(b, 64, SLOTS)
        mm = matmul_map(lin, _rng(5).normal(size=(64, 64)), SLOTS)
        tm = tmatmul_map(np.ones((b, 64)), lin, SLOTS)
        sizes[b] = (len(mm.t), len({mm.diag(g)[0].tobytes() for g in range(len(mm.t))}), len(tm.t))
    assert sizes == {512: (128, 32, 508), 1024: (256, 32, 1016), 2048: (512, 32, 2032)}


# -- encrypted products ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16, 6), (1, 1), (64, 64)])
def test_encrypt_decrypt_round_trip(key, shape):
    x = _rng(1).normal(size=shape) * 3
    got = key.decrypt(key.encrypt(x), shape)
    assert got.shape == shape
    assert np.abs(got - x).max() < TOL


@pytest.mark.parametrize(
    ("r", "d", "o"),
    [
        (64, 64, 64),  # the protocol file's step
        (5, 3, 1),  # odd, tiny
        (100, 33, 7),  # tmatmul splits rows in slices folded at the end
        (4, 70, 80),  # a > block size: tmatmul output in row chunks
        (300, 64, 64),  # batch in row chunks of 128, the last one partial
    ],
)
def test_products_match_numpy(scheme, key, peer, r, d, o):
    rng = _rng(2)
    h = rng.normal(size=(r, d))
    w = rng.normal(scale=0.3, size=(d, o))
    g = rng.normal(scale=1e-2, size=(r, o))

    eps = scheme.mask(MASKS, (r, o))
    z = key.decrypt(peer.matmul(key.encrypt(h), (r, d), w, eps), (r, o))
    assert np.abs(z - eps - h @ w).max() < TOL

    blob_g = key.encrypt(g)
    mu = scheme.mask(MASKS, (r, d))
    gh = key.decrypt(peer.matmul(blob_g, (r, o), w.T, mu), (r, d))
    assert np.abs(gh - mu - g @ w.T).max() < TOL

    big_r = scheme.mask(MASKS, (d, o))
    gw = key.decrypt(peer.tmatmul(h, blob_g, (r, o), -big_r), (d, o))
    assert np.abs(gw + big_r - h.T @ g).max() < TOL


def test_prepared_products_match_and_encode_nothing_more(scheme, key, peer):
    """prepare_operands() encodes the diagonals ahead; the products then only encode their
    masks, and give the same results as unprepared ones."""
    rng = _rng(9)
    r, d, o = 64, 16, 8
    h, w, g = rng.normal(size=(r, d)), rng.normal(size=(o, d)), rng.normal(size=(r, o))
    blob_g = key.encrypt(g)
    mu, big_r = scheme.mask(MASKS, (r, d)), scheme.mask(MASKS, (d, o))
    peer.prepare_operands((r, o), w=w, p=h)
    peer.ops.reset()
    gh = key.decrypt(peer.matmul(blob_g, (r, o), w, mu), (r, d))
    gw = key.decrypt(peer.tmatmul(h, blob_g, (r, o), -big_r), (d, o))
    assert peer.ops.encode == 4  # a mask and a smudging plaintext per result ciphertext
    assert np.abs(gh - mu - g @ w).max() < TOL
    assert np.abs(gw + big_r - h.T @ g).max() < TOL
    peer.ops.reset()
    peer.matmul(blob_g, (r, o), w, mu)  # a prepared product is used once
    assert peer.ops.encode > 2


@pytest.mark.parametrize("value", [0.0, 1e-15])
def test_zero_weights_give_the_mask(scheme, key, peer, value):
    """A zero share (weight_init: seeded starts P_i at 0), or one so small that its
    diagonals round to zero, multiplies nothing (SEAL refuses such products)."""
    rng = _rng(3)
    eps = scheme.mask(MASKS, (8, 4))
    w = np.full((5, 4), value)
    out = key.decrypt(peer.matmul(key.encrypt(rng.normal(size=(8, 5))), (8, 5), w, eps), (8, 4))
    assert np.abs(out - eps).max() < TOL


# -- masks -----------------------------------------------------------------------------------


def test_masks_are_gaussian_of_mask_std(scheme):
    """Gaussian (they compose as KL over a run, package docstring) of standard deviation
    mask_std, never beyond GAUSS_MAX of it. Over 60,000 draws the sample deviation is
    within 0.6% of mask_std on repeated streams; 2% here."""
    m = scheme.mask(SecretStream.from_seed(4, "test"), (200, 300))
    assert m.dtype == np.float64
    assert float(m.std()) == pytest.approx(OPTS.mask_std, rel=0.02)
    assert abs(float(m.mean())) < 0.02 * OPTS.mask_std
    assert float((np.abs(m) < OPTS.mask_std).mean()) == pytest.approx(0.6827, abs=0.01)
    assert np.abs(m).max() <= GAUSS_MAX * OPTS.mask_std


def test_every_result_slot_is_masked(key, peer, monkeypatch):
    """Padding slots and imaginary halves get fresh Gaussian masks too: with w = 0 and
    a zero caller mask, every real coordinate the key owner can decode (its own,
    unflooded view) is a mask of standard deviation mask_std within GAUSS_MAX of it,
    except the data positions, which hold only the smudging (2^-27). The sample
    deviation of 8,177 draws has a relative spread of 0.8%; 3% here."""
    monkeypatch.setattr(peer, "_stream", SecretStream.from_seed(5, "slots"))
    r, d, o = 5, 3, 3  # one ciphertext, mostly padding, odd column count
    blob = peer.matmul(key.encrypt(np.ones((r, d))), (r, d), np.zeros((d, o)), np.zeros((r, o)))
    _, cts = unframe(blob, key.io, "test")
    for c in cts:
        v = key.decrypt_slots(c)
        parts = np.concatenate([v.real, v.imag])
        data = np.abs(parts) < 1e-6  # the zero data positions (caller mask 0)
        assert data.sum() == r * o
        assert 0 < np.abs(parts[data]).max() < 8 * smudge_sigma(OPTS)
        masks = parts[~data]
        assert np.abs(masks).max() <= GAUSS_MAX * OPTS.mask_std + 1e-6
        assert float(masks.std()) == pytest.approx(OPTS.mask_std, rel=0.03)  # 8,177 draws


# -- public context -----------------------------------------------------------------------------


def _split_public(pub: bytes) -> tuple[bytes, bytes]:
    _, _, n_ctx, _ = PUB_HEADER.unpack_from(pub, 0)
    return pub[PUB_HEADER.size : PUB_HEADER.size + n_ctx], pub[PUB_HEADER.size + n_ctx :]


def _in_galois(pub: bytes, at: int, patch: bytes) -> bytes:
    """``pub`` with ``patch`` written over its Galois keys from byte ``at`` on.

    Only the keys' structure can be checked: their body is zstd-compressed, and the
    blocks of random key material zstd stores raw carry no checksum, while SEAL takes
    any coefficient below the modulus. Bytes zeroed deep in the body can therefore
    load as a well-formed, wrong key (2 of 12 fresh keys did with 4,096 bytes at the
    blob's middle). Such a key makes the key owner's own results wrong; a key owner
    that sends one on purpose is outside the semi-honest model (SECURITY.md §1), and
    on the wire the sealed channel's authentication refuses any change."""
    off = PUB_HEADER.size + len(_split_public(pub)[0])
    return pub[: off + at] + patch + pub[off + at + len(patch) :]


def test_public_part_has_no_secret_key(key):
    pub = key.public()
    ctx_bytes, _ = _split_public(pub)
    ctx = ts.context_from(ctx_bytes)
    assert not ctx.has_secret_key() and not ctx.is_private() and ctx.has_public_key()
    with pytest.raises(ValueError):
        ctx.secret_key()
    # a ciphertext encrypted with the public key cannot be decrypted from it
    vec = ts.ckks_vector(ctx, [1.0, 2.0], scale=2.0**40)
    with pytest.raises(ValueError):
        vec.decrypt()
    # and the owner's serialized secret key does not appear in it
    sk = key.io.dump(key.ctx.secret_key().data)
    assert len(sk) > 1024 and sk[64:1024] not in pub


def test_peer_refuses_a_context_with_a_secret_key(scheme, key):
    ctx_bytes = key.ctx.serialize(save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
    _, gk = _split_public(key.public())
    bad = PUB_HEADER.pack(b"SVCP", 1, len(ctx_bytes), len(gk)) + ctx_bytes + gk
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\).*secret key"):
        scheme.peer(bad, sender=SENDER)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda pub: b"",
        lambda pub: b"not a context at all, just some bytes",
        lambda pub: pub[:-1],  # length mismatch
        lambda pub: b"XXXX" + pub[4:],
        lambda pub: pub[: PUB_HEADER.size + 10] + bytes(64) + pub[PUB_HEADER.size + 74 :],
        lambda pub: _in_galois(pub, 0, bytes(16)),  # the Galois keys' SEAL header
        lambda pub: _in_galois(pub, 8, struct.pack("<Q", 1 << 40)),  # its size field
        lambda pub: _in_galois(pub, 16, bytes(4096)),  # the start of the compressed keys
    ],
    ids=[
        "empty",
        "garbage",
        "truncated",
        "bad-magic",
        "bad-context",
        "bad-galois-header",
        "bad-galois-size",
        "bad-galois-body",
    ],
)
def test_peer_refuses_malformed_public_context(scheme, key, mangle):
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\)"):
        scheme.peer(mangle(key.public()), sender=SENDER)


def test_peer_refuses_other_parameters(key):
    other = CkksScheme(CkksOptions(poly_modulus_degree=16384, coeff_mod_bit_sizes=[40, 40, 40, 60]))
    with pytest.raises(ProtocolError, match="protocol says"):
        other.peer(key.public(), sender=SENDER)


# -- ciphertext blobs -----------------------------------------------------------------------------


def _mangled(blob: bytes) -> dict[str, bytes]:
    mid = len(blob) // 2
    hdr = list(HEADER.unpack_from(blob, 0))
    wrong_rows = HEADER.pack(*hdr[:2], hdr[2] + 1, *hdr[3:]) + blob[HEADER.size :]
    return {
        "empty": b"",
        "garbage": b"\x00" * 200,
        "bad-magic": b"XXXX" + blob[4:],
        "truncated": blob[:-10],
        "trailing": blob + b"\x00",
        "bad-count": HEADER.pack(*hdr[:-1], hdr[-1] + 1) + blob[HEADER.size :],
        "bad-length": blob[: HEADER.size] + struct.pack("<I", 1 << 30) + blob[HEADER.size + 4 :],
        "corrupt-ciphertext": blob[:mid] + bytes(512) + blob[mid + 512 :],
        "wrong-shape": wrong_rows,
    }


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "garbage",
        "bad-magic",
        "truncated",
        "trailing",
        "bad-count",
        "bad-length",
        "corrupt-ciphertext",
        "wrong-shape",
    ],
)
def test_garbage_blobs_raise_protocol_error(key, peer, case):
    rng = _rng(5)
    x = rng.normal(size=(8, 6))
    bad = _mangled(key.encrypt(x))[case]
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\)"):
        peer.matmul(bad, (8, 6), rng.normal(size=(6, 4)), np.zeros((8, 4)))
    with pytest.raises(ProtocolError, match=r"rank 1 \(left\)"):
        peer.tmatmul(rng.normal(size=(8, 3)), bad, (8, 6), np.zeros((3, 6)))
    with pytest.raises(ProtocolError):
        key.decrypt(bad, (8, 6))


def test_shape_mismatch_is_refused(key, peer):
    blob = key.encrypt(np.ones((8, 6)))
    with pytest.raises(ProtocolError, match="does not match"):
        peer.matmul(blob, (16, 6), np.ones((6, 2)), np.zeros((16, 2)))
    with pytest.raises(ProtocolError, match="expected"):
        key.decrypt(blob, (8, 5))


# -- load-time checks -----------------------------------------------------------------------------


def _ckks(batch_size: int = 64, **params):
    doc = small_digits(batch_size=batch_size)
    doc["exchange"] = {"backend": "ckks", "params": params}
    return doc


def test_protocol_file_and_registration():
    proto = load_protocol_dict(load_yaml("ckks.yaml"))
    assert proto.exchange.backend == "ckks"
    backend = EXCHANGES.get("ckks")
    assert backend.options is CkksOptions and "he" in backend.capabilities
    opts = CkksOptions.model_validate(proto.exchange.params)
    assert opts == CkksOptions()  # the file spells out the defaults
    info = backend.result_info(opts)
    assert info["security_bits"] == 128 and info["coeff_modulus_bits"] <= info["max_coeff_modulus_bits"]


@pytest.mark.parametrize(
    ("params", "batch", "path", "fragment"),
    [
        ({"poly_modulus_degree": 6000}, 64, "exchange.params.poly_modulus_degree", "not one of"),
        (
            {"coeff_mod_bit_sizes": [60, 60, 60, 60, 10]},
            64,
            "exchange.params.coeff_mod_bit_sizes",
            "sum of coefficient moduli 250 bits exceeds 218, the 128-bit security limit for N=8192",
        ),
        ({"poly_modulus_degree": 4096}, 64, "exchange.params.coeff_mod_bit_sizes", "exceeds 109"),
        ({"coeff_mod_bit_sizes": [61, 40, 60]}, 64, "exchange.params.coeff_mod_bit_sizes", "61"),
        (
            {"coeff_mod_bit_sizes": [60, 60]},
            64,
            "exchange.params.coeff_mod_bit_sizes",
            "need [q0, q1, special]",
        ),
        ({"coeff_mod_bit_sizes": [10, 40, 60]}, 64, "exchange.params.coeff_mod_bit_sizes", "cannot build"),
        ({"mask_std": 2.0**26}, 64, "exchange.params.mask_std", "values overflow the output primes"),
        (
            {"coeff_mod_bit_sizes": [30, 30, 40, 60], "global_scale_bits": 60},
            64,
            "exchange.params.operand_norm_bits",
            "values overflow the output primes",
        ),
        ({"mask_std": 100.0}, 64, "exchange.params.mask_std", "statistical distance"),
        ({}, 5000, "training.batch_size", "exceeds the 4096 CKKS slots"),
    ],
)
def test_check_refuses_insecure_parameters(params, batch, path, fragment):
    with pytest.raises(CryptoParameterError) as info:
        load_protocol_dict(_ckks(batch, **params))
    assert info.value.path == path
    assert fragment in str(info.value)


def test_options_are_strict():
    with pytest.raises(ValidationError):
        CkksOptions.model_validate({"poly_modulus_degre": 8192})
    with pytest.raises(ValidationError):
        CkksOptions.model_validate({"poly_modulus_degree": "8192"})
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(_ckks(scale_bits=40))
    assert "exchange.params.scale_bits" in str(info.value)
