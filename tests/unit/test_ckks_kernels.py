"""The ``ckks`` evaluation schedule and its background work: chained baby steps
and Horner giant steps (every rotation of the reference step is one key
switching), preparation on a worker thread, and the backward ``tmatmul`` started
while ``matmul``'s result is sent. One key pair per module; no processes.
Tolerance as in test_ckks.py (the stated precision: 8 sigma of the flooding and
smudging, 6.1e-7 at the defaults)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tenseal")

from securevfl.csprng import SecretStream
from securevfl.exchange.ckks import CkksOptions
from securevfl.exchange.ckks.kernels import chain_cost, naf_weight, signed_units
from securevfl.exchange.ckks.params import flood_sigma, smudge_sigma
from securevfl.exchange.ckks.scheme import CkksScheme
from securevfl.exchange.ckks.worker import Worker

OPTS = CkksOptions()
TOL = 8 * float(np.hypot(flood_sigma(OPTS), smudge_sigma(OPTS))) + 2.0**-26
SLOTS = OPTS.poly_modulus_degree // 2


@pytest.fixture(scope="module")
def scheme() -> CkksScheme:
    return CkksScheme(OPTS)


@pytest.fixture(scope="module")
def key(scheme):
    return scheme.new_key()


@pytest.fixture(scope="module")
def peer(scheme, key):
    return scheme.peer(key.public(), sender="rank 1 (left)")


def _naf() -> np.ndarray:
    """Key switchings per rotation by k (step 1), k = 0..SLOTS-1."""
    return np.array([naf_weight(k if k <= SLOTS // 2 else k - SLOTS) for k in range(SLOTS)])


def test_chain_cost_pays_the_gaps():
    naf = _naf()
    assert chain_cost(np.arange(0, 8), naf) == 7  # 1..7 one after the other: one switching each
    assert chain_cost(np.array([7]), naf) == naf_weight(7) == 2  # straight to 7: 8 - 1
    assert chain_cost(np.array([-24, -8, -16, 0]), naf) == 3  # gaps of 8 on the negative side
    assert chain_cost(np.array([0]), naf) == 0
    assert chain_cost(np.array([3, 6]), naf) == 2 * naf_weight(3)


def test_signed_units_wrap_to_the_short_way_round():
    got = signed_units(np.array([0, 1, 255, 256, 257, 511]), 512)
    np.testing.assert_array_equal(got, [0, 1, 255, 256, -255, -1])


def test_reference_step_rotations_cost_one_key_switching_each(scheme, key, peer):
    """B=256, d=o=64: with chains and Horner every rotation is by a power of two,
    so key switchings = rotations (+ one conjugation per matmul output)."""
    rng = np.random.default_rng(3)
    h, w, g = rng.normal(size=(256, 64)), rng.normal(scale=0.1, size=(64, 64)), rng.normal(size=(256, 64))
    blob_g = key.encrypt(g)
    peer.ops.reset()
    gh = key.decrypt(peer.matmul(blob_g, (256, 64), w, np.zeros((256, 64))), (256, 64))
    assert peer.ops.key_switch == peer.ops.rotate + 2  # two output ciphertexts, one conjugation each
    assert peer.ops.key_switch <= 20
    peer.ops.reset()
    gw = key.decrypt(peer.tmatmul(h, blob_g, (256, 64), np.zeros((64, 64))), (64, 64))
    assert peer.ops.key_switch == peer.ops.rotate <= 46
    assert np.abs(gh - g @ w).max() < TOL
    assert np.abs(gw - h.T @ g).max() < TOL


def test_tmatmul_started_by_matmul_matches_and_is_used_only_for_its_input(scheme, key, peer):
    rng = np.random.default_rng(4)
    r, d, o = 64, 16, 8
    h, h2 = rng.normal(size=(r, d)), rng.normal(size=(r, d))
    w, g, g2 = rng.normal(size=(o, d)), rng.normal(size=(r, o)), rng.normal(size=(r, o))
    blob_g, blob_g2 = key.encrypt(g), key.encrypt(g2)
    masks = SecretStream.from_seed(4, "test")
    mu, big_r = scheme.mask(masks, (r, d)), scheme.mask(masks, (d, o))

    # the backward pass: prepared operands, then matmul and tmatmul on the same input
    peer.prepare_operands((r, o), w=w, p=h)
    gh = key.decrypt(peer.matmul(blob_g, (r, o), w, mu), (r, d))
    peer.ops.reset()
    gw = key.decrypt(peer.tmatmul(h, blob_g, (r, o), -big_r), (d, o))
    assert peer.ops.deserialize == 0  # the input matmul() read and checked; evaluated meanwhile
    assert np.abs(gh - mu - g @ w).max() < TOL
    assert np.abs(gw + big_r - h.T @ g).max() < TOL

    # another input, or another left factor: computed afresh, still right
    peer.prepare_operands((r, o), w=w, p=h)
    peer.matmul(blob_g, (r, o), w, mu)
    gw2 = key.decrypt(peer.tmatmul(h, blob_g2, (r, o), -big_r), (d, o))
    assert np.abs(gw2 + big_r - h.T @ g2).max() < TOL
    peer.prepare_operands((r, o), w=w, p=h)
    peer.matmul(blob_g, (r, o), w, mu)
    gw3 = key.decrypt(peer.tmatmul(h2, blob_g, (r, o), -big_r), (d, o))
    assert np.abs(gw3 + big_r - h2.T @ g).max() < TOL


def test_prepared_encodings_are_counted_apart(scheme, key, peer):
    rng = np.random.default_rng(5)
    h, w = rng.normal(size=(64, 16)), rng.normal(size=(8, 16))
    peer.prep_ops.reset()
    peer.ops.reset()
    peer.prepare_operands((64, 8), w=w, p=h)
    peer.matmul(key.encrypt(rng.normal(size=(64, 8))), (64, 8), w, np.zeros((64, 16)))
    assert peer.prep_ops.encode > 2 and peer.ops.encode == 2  # diagonals ahead; mask and smudging now


def test_worker_returns_or_reraises():
    assert Worker(lambda a, b: a + b, 2, 3).result() == 5
    with pytest.raises(ZeroDivisionError):
        Worker(lambda: 1 / 0).result()
