"""The ``ckks`` noise budget against SEAL: the CKKS error model the flooding is
sized for, the flooding every decryption carries, the evaluator's smudging, and
the guards that keep values inside the budget (evaluator operands, encrypted
operands, decrypted range, decryption count). One key pair per module; no
processes. Statistical checks use fixed streams; their tolerances are several
times the spread seen over repeated runs (noted at each)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from securevfl.app.loader import load_protocol_dict
from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError, CryptoParameterError, Diverged
from tests.support.protocols import small_digits

pytest.importorskip("tenseal")

from securevfl.exchange.ckks import CkksOptions
from securevfl.exchange.ckks.params import (
    ERROR_MARGIN,
    error_model,
    error_std,
    flood_sigma,
    primes,
    smudge_sigma,
)
from securevfl.exchange.ckks.scheme import CkksScheme
from securevfl.exchange.ckks.wire import unframe

OPTS = CkksOptions()
SENDER = "rank 1 (left)"


@pytest.fixture(scope="module")
def scheme() -> CkksScheme:
    return CkksScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme):
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender=SENDER)


def _share(stream: SecretStream, shape: tuple[int, int]) -> np.ndarray:
    """A re-drawn weight share: uniform in +-2^share_bits, as he/protocol.py draws P_i's."""
    return 2.0**OPTS.share_bits * (2.0 * stream.uniform_np(shape) - 1.0)


def _unflooded(key, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
    """The key owner's own view of a result, without the flooding (decrypt_slots)."""
    layout, cts = unframe(blob, key.io, "test")
    return layout.unpack(np.stack([key.decrypt_slots(c) for c in cts]))


# -- the error model ----------------------------------------------------------------------


def test_error_model_bounds_the_measured_ckks_error(scheme, key, peer, monkeypatch):
    """Products on a zero input with zero masks (padding slots too: a mask anywhere in a
    ciphertext adds float64 decoding error everywhere) and without the smudging (2^28
    times the error) decrypt, unflooded, to their CKKS error. Per unit l2 norm of the
    evaluator's column, its root mean square is within a factor 2 of the model's c_w
    either way (the model is neither vacuous nor far off) and below the bound the
    flooding uses (ERROR_MARGIN c_w). Seen over nine key pairs: 2^13.2 to 2^14.5
    against the model's 2^13.81 and the bound's 2^14.81."""
    monkeypatch.setattr(peer, "smudge_sigma", 0.0)
    monkeypatch.setattr(peer, "opts", OPTS.model_copy(update={"mask_std": 1e-300}))
    stream = SecretStream.from_seed(11, "noise-model")
    c_w, _ = error_model(OPTS.poly_modulus_degree, primes(OPTS))
    delta = 2.0**OPTS.global_scale_bits
    r, d, o = 256, 64, 64
    w = _share(stream, (d, o))
    blob = peer.matmul(key.encrypt(np.zeros((r, d)), ops=frozenset({"matmul"})), (r, d), w, np.zeros((r, o)))
    err = _unflooded(key, blob, (r, o))
    fwd = float(np.sqrt((err**2).mean()))
    per_norm = fwd * delta / float(np.sqrt((w**2).mean(axis=1).sum()))
    assert c_w / 2 < per_norm < ERROR_MARGIN * c_w
    assert fwd < error_std(OPTS)

    h = stream.normal_np((r, d))
    blob = peer.tmatmul(h, key.encrypt(np.zeros((r, o))), (r, o), np.zeros((d, o)))
    err = _unflooded(key, blob, (d, o))
    tm = float(np.sqrt((err**2).mean()))
    assert tm < error_std(OPTS)  # h's columns have norm ~16: c_0 (2^16.4) dominates


# -- the flooding -------------------------------------------------------------------------


def test_flood_width_is_the_specified_one(key):
    """sigma_f = 2^(s/2) sqrt(Q N) sigma_e (package docstring), 7.4e-8 at the defaults."""
    q_n = OPTS.max_decryptions * OPTS.poly_modulus_degree
    want = 2.0 ** (OPTS.flood_security_bits / 2) * math.sqrt(q_n) * error_std(OPTS)
    assert key.flood_sigma == pytest.approx(want, rel=1e-12) == pytest.approx(flood_sigma(OPTS), rel=1e-12)
    assert 7e-8 < key.flood_sigma < 8e-8


def test_every_decryption_carries_fresh_flooding_of_that_width(scheme, key, peer, monkeypatch):
    """The same result decrypted K times: what leaves the key owner differs between
    decryptions by Gaussian noise of standard deviation sigma_f in every value (the
    CKKS error and the evaluator's smudging are in the ciphertext, the same each
    time), centred on the exact product plus the mask. Pooled over 64 x 64 x 16
    values, over eight flooding streams: sample deviation within 0.6% of sigma_f
    (3% here), share within one sigma within 0.004 of 0.6827 (0.015 here)."""
    monkeypatch.setattr(key, "_flood", SecretStream.from_seed(0, "flood"))
    monkeypatch.setattr(peer, "_stream", SecretStream.from_seed(0, "smudge"))
    stream = SecretStream.from_seed(12, "flood")
    r, d, o, reps = 64, 64, 64, 16
    h, w = stream.normal_np((r, d)), _share(stream, (d, o))
    eps = scheme.mask(stream, (r, o))
    blob = peer.matmul(key.encrypt(h, ops=frozenset({"matmul"})), (r, d), w, eps)
    before = key.decryptions
    got = np.stack([key.decrypt(blob, (r, o)) for _ in range(reps)])
    assert key.decryptions == before + reps  # counted against max_decryptions
    dev = got - got.mean(axis=0)
    sd = float(np.sqrt((dev**2).sum() / (dev.size - r * o)))
    assert sd == pytest.approx(key.flood_sigma, rel=0.03)
    within = float((np.abs(dev) < key.flood_sigma * np.sqrt((reps - 1) / reps)).mean())
    assert within == pytest.approx(0.6827, abs=0.015)  # Gaussian, not uniform (0.577) or absent
    exact = h @ w + eps
    slack = 6 * key.flood_sigma / np.sqrt(reps) + 6 * smudge_sigma(OPTS) + 1e-8
    assert np.abs(got.mean(axis=0) - exact).max() < slack


def test_the_key_owner_refuses_past_max_decryptions(scheme):
    opts = CkksOptions(max_decryptions=3)
    key = CkksScheme(opts).new_key()
    blob = key.encrypt(np.ones((8, 4)))
    for _ in range(3):
        key.decrypt(blob, (8, 4))
    with pytest.raises(ConfigError) as info:
        key.decrypt(blob, (8, 4))
    assert info.value.path == "exchange.params.max_decryptions"
    assert "decrypted 3 ciphertexts" in str(info.value)


# -- smudging -------------------------------------------------------------------------------


def test_results_carry_the_evaluators_smudging(key, peer, monkeypatch):
    """A zero product with a zero mask decrypts (unflooded) to the smudging, 2^-27 per
    coordinate (plus a CKKS error 2^10 times smaller): the float64 mask's grid is
    covered by two of its steps. Over 512 values and eight smudging streams the
    sample deviation was within -3% and +6.4% of it; 15% here."""
    monkeypatch.setattr(peer, "_stream", SecretStream.from_seed(0, "smudge"))
    r, d, o = 64, 16, 8
    blob = peer.matmul(key.encrypt(np.zeros((r, d))), (r, d), np.zeros((d, o)), np.zeros((r, o)))
    got = _unflooded(key, blob, (r, o))
    assert float(got.std()) == pytest.approx(smudge_sigma(OPTS), rel=0.15)
    assert smudge_sigma(OPTS) == 2.0**-27


# -- guards ---------------------------------------------------------------------------------


def test_evaluator_refuses_a_share_past_the_operand_bound(key, peer):
    """A weight share that outgrew its bound (forced here: one column of l2 norm 2^20)
    aborts the product before anything is computed, naming the operand and bound; the
    column and its norm go to the owner's detail only (the message reaches every peer)."""
    r, d, o = 32, 16, 8
    blob = key.encrypt(np.ones((r, d)), ops=frozenset({"matmul"}))
    w = np.zeros((d, o))
    w[:, 3] = 2.0**20 / 4.0  # 16 entries: column norm 2^20
    with pytest.raises(Diverged) as info:
        peer.matmul(blob, (r, d), w, np.zeros((r, o)))
    msg = str(info.value)
    assert "weight share multiplied into rank 1 (left)'s ciphertext" in msg
    assert "2^19 = 524288" in msg and "operand_norm_bits" in msg
    assert "column 3" not in msg and "1.049e+06" not in msg
    assert info.value.detail == "column 3 has l2 norm 1.049e+06"


def test_evaluator_refuses_an_embedding_past_the_operand_bound(key, peer):
    r, d, o = 32, 16, 8
    blob_g = key.encrypt(np.ones((r, o)) * 1e-2)
    h = np.ones((r, d))
    h[:, 5] = 2.0**19  # column norm 2^19 * sqrt(32)
    with pytest.raises(Diverged, match=r"embedding h'_i multiplied into rank 1 \(left\)'s dL/dz") as info:
        peer.tmatmul(h, blob_g, (r, o), np.zeros((d, o)))
    assert "column 5" not in str(info.value) and info.value.detail.startswith("column 5 has l2 norm")


def test_key_owner_refuses_to_encrypt_past_the_value_bound(key):
    h = np.ones((8, 4))
    h[6] = 200.0  # row norm 400 > 2^8
    with pytest.raises(Diverged, match=r"the embedding h'_i \(8x4\) has a row of l2 norm above 2\^8") as info:
        key.encrypt(h, ops=frozenset({"matmul"}))
    assert "400" not in str(info.value) and info.value.detail == "row 6 has l2 norm 400"
    g = np.zeros((300, 4))
    g[:, 1] = 16.0  # each row norm 16, column 1 norm 277 > 2^8
    with pytest.raises(Diverged, match=r"dL/dz \(300x4\) has a column of l2 norm above 2\^8") as info:
        key.encrypt(g)
    assert "277" not in str(info.value) and info.value.detail == "column 1 has l2 norm 277.1"


def test_a_decryption_past_the_exact_limit_is_refused(key, peer):
    """A result whose slots pass the exact-decryption limit (forced with a mask of
    2^28, beyond 2^27.5) is discarded by the key owner, naming the limit."""
    r, d, o = 16, 8, 4
    blob = key.encrypt(np.zeros((r, d)), ops=frozenset({"matmul"}))
    out = peer.matmul(blob, (r, d), np.zeros((d, o)), np.full((r, o), 2.0**28))
    with pytest.raises(
        Diverged, match=r"holds a value above 1\.9\d*e\+08, the limit under which decryption"
    ) as info:
        key.decrypt(out, (r, o))
    assert info.value.detail is not None and info.value.detail.startswith(
        "the largest decrypted value was 2.68"
    )


# -- the share re-draw and the load-time budget --------------------------------------------


def test_shares_are_redrawn_within_share_bits(scheme):
    """he/protocol.py's re-draw runs for ckks: P_i's share uniform in +-2^16 every step, whose
    columns (64 entries, norm ~2^18.2) fit the evaluator's operand bound 2^19."""
    assert scheme.share_bits() == OPTS.share_bits == 16
    w = _share(SecretStream.from_seed(13, "share"), (64, 64))
    assert float(np.sqrt((w**2).sum(axis=0)).max()) < 2.0**OPTS.operand_norm_bits


def _ckks(**params):
    doc = small_digits(batch_size=64)
    doc["exchange"] = {"backend": "ckks", "params": params}
    return doc


@pytest.mark.parametrize(
    ("params", "field", "fragment"),
    [
        ({"share_bits": 18}, "share_bits", "too close to the operand bound 2^19"),
        ({"flood_security_bits": 16}, "flood_security_bits", "below 20"),
        ({"max_decryptions": 2**40}, "global_scale_bits", "decryption flooding would need"),
        (
            {"coeff_mod_bit_sizes": [47, 47, 40, 60], "global_scale_bits": 60},
            "global_scale_bits",
            "decryption flooding would need",
        ),
        ({"operand_norm_bits": 21}, "operand_norm_bits", "values overflow the output primes"),
    ],
)
def test_load_refuses_a_budget_that_does_not_hold(params, field, fragment):
    with pytest.raises(CryptoParameterError) as info:
        load_protocol_dict(_ckks(**params))
    assert info.value.path == f"exchange.params.{field}"
    assert fragment in str(info.value)
