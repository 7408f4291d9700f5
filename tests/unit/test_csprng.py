"""securevfl.csprng: the AES-256-CTR secret stream and its samplers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from securevfl.csprng import KEY_BYTES, SecretStream, fresh_key, laplace_from_words, open_uniform

KEY = bytes(range(32))


def test_keystream_is_aes_256_ctr_from_a_zero_counter():
    ref = Cipher(algorithms.AES(KEY), modes.CTR(bytes(16))).encryptor().update(bytes(100))
    s = SecretStream(KEY)
    assert s.bytes(7) + s.bytes(93) == ref
    assert s.position == 100


def test_same_key_same_draws_in_the_same_order_and_fresh_keys_differ():
    a, b = SecretStream(KEY), SecretStream(KEY)
    assert torch.equal(a.ring((3, 4)), b.ring((3, 4)))
    assert not torch.equal(SecretStream.fresh().ring((8,)), SecretStream.fresh().ring((8,)))
    assert len(fresh_key()) == KEY_BYTES


@pytest.mark.parametrize("skip", [0, 1, 15, 16, 17, 1000])
def test_state_resumes_at_any_byte_position(skip):
    a = SecretStream(KEY)
    a.bytes(skip)
    saved = a.state()
    expect = a.ring((5, 3))
    b = SecretStream.from_state(saved)
    assert torch.equal(b.ring((5, 3)), expect)
    assert b.position == skip + 120


def test_malformed_state_is_refused():
    for bad in (
        {},
        {"key": "zz", "position": 0},
        {"key": KEY.hex(), "position": -1},
        {"key": "00", "position": 0},
    ):
        with pytest.raises(ValueError):
            SecretStream.from_state(bad)


def test_bad_keys_are_refused():
    for bad in (b"", b"x" * 31, b"x" * 33, "k" * 32):
        with pytest.raises(ValueError):
            SecretStream(bad)  # type: ignore[arg-type]


def test_children_are_independent_and_do_not_advance_the_parent():
    s = SecretStream(KEY)
    c1, c2 = s.child("a"), s.child("b")
    assert s.position == 0
    assert not torch.equal(c1.ring((8,)), c2.ring((8,)))
    assert torch.equal(
        SecretStream(KEY).child("a").ring((8,)), SecretStream(KEY).child("a").ring((4, 2)).reshape(8)
    )


def test_pinned_seed_streams_are_reproducible_marked_and_use_all_64_bits_of_the_seed():
    a, b = SecretStream.from_seed(5, "noise", "P1"), SecretStream.from_seed(5, "noise", "P1")
    assert a.pinned and b.pinned and not SecretStream.fresh().pinned
    assert torch.equal(a.normal((6,)), b.normal((6,)))
    # torch's CPU generator keeps the low 32 bits of a seed; these streams differ
    assert not torch.equal(SecretStream.from_seed(5).ring((4,)), SecretStream.from_seed(5 + 2**40).ring((4,)))
    assert a.child("x").pinned
    assert "key" not in repr(a) and KEY.hex() not in repr(SecretStream(KEY))


def test_ring_elements_reach_both_ends_of_the_ring():
    s = SecretStream(KEY)
    x = s.ring((1 << 16,))
    assert x.dtype == torch.int64
    assert int(x.min()) < -(2**62) and int(x.max()) > 2**62
    # every bit position is set about half the time
    ones = [(x >> b & 1).float().mean().item() for b in range(64)]
    assert all(abs(p - 0.5) < 0.02 for p in ones)


@pytest.mark.parametrize("bits", [1, 5, 31, 32, 33, 63, 64])
def test_kbits_stay_in_range(bits):
    x = SecretStream(KEY).kbits((4096,), bits)
    if bits < 64:
        assert int(x.min()) >= 0 and int(x.max()) < 2**bits
        assert int(x.max()) >= 2 ** (bits - 1) if bits > 1 else int(x.max()) == 1


@pytest.mark.parametrize(
    ("low", "high"), [(0, 1), (0, 2), (-3, 4), (0, 10), (-(2**40), 2**40 + 7), (0, 2**63)]
)
def test_integers_are_exactly_in_range_and_cover_it(low, high):
    x = SecretStream(KEY).integers((20000,), low, high)
    assert int(x.min()) >= low and int(x.max()) < high
    if high - low <= 10:
        counts = torch.bincount(x - low, minlength=high - low).double()
        assert int((counts > 0).sum()) == high - low
        # chi-square against uniform, 1e-4 level (fixed key: deterministic)
        exp = 20000 / (high - low)
        assert float(((counts - exp) ** 2 / exp).sum()) < 35.0


def test_integers_refuse_empty_ranges():
    with pytest.raises(ValueError):
        SecretStream(KEY).integers((3,), 5, 5)


def test_below_draws_big_integers_uniformly():
    s = SecretStream(KEY)
    n = 2**2048 - 159
    vals = [s.below(n) for _ in range(200)]
    assert all(0 <= v < n for v in vals)
    assert max(vals).bit_length() == 2048
    small = [s.below(3) for _ in range(300)]
    assert all(70 < small.count(v) < 130 for v in (0, 1, 2))


def test_uniform_floats_lie_on_the_2_pow_53_grid_in_the_unit_interval():
    u = SecretStream(KEY).uniform_np((100000,))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))
    assert abs(u.mean() - 0.5) < 0.005


def test_normal_and_laplace_moments():
    s = SecretStream(KEY)
    z = s.normal_np((200001,))
    assert z.shape == (200001,)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert np.abs(z).max() <= math.sqrt(-2.0 * math.log(2.0**-53)) + 1e-9
    lap = s.laplace_np((200000,), scale=2.0)
    assert np.isfinite(lap).all()
    assert abs(lap.mean()) < 0.03 and abs(np.abs(lap).mean() - 2.0) < 0.03
    t = s.normal((3, 2), dtype=torch.float32)
    assert t.dtype == torch.float32 and t.shape == (3, 2)


# the extreme raw words: all zeros, all ones, and those beside the middle and the ends
EXTREMES = np.array([0, 1, 2**12 - 1, 2**12, 2**63 - 1, 2**63, 2**64 - 2**12, 2**64 - 1], dtype=np.uint64)


def test_open_uniform_stays_inside_the_open_unit_interval_at_the_extreme_words():
    u = open_uniform(EXTREMES)
    assert u.min() == 2.0**-53 and u.max() == 1.0 - 2.0**-53  # exactly, never 0 or 1
    assert np.all(u != 0.5)  # the midpoints of 2^52 cells: 1/2 is a cell edge
    k = EXTREMES >> np.uint64(12)
    assert np.all(u * 2.0**53 == (2 * k + 1).astype(np.float64))  # exact: no rounding to the end
    assert np.array_equal(open_uniform(~EXTREMES), 1.0 - u)  # symmetric about 1/2


def test_laplace_is_finite_and_symmetric_at_the_extreme_words():
    """The old sampler, (w + 1/2) 2^-53 - 1/2 on the top 53 bits, rounded the all-ones
    word to u = 1/2 exactly and returned +inf (probability 2^-53 per draw)."""
    x = laplace_from_words(EXTREMES, scale=2.0)
    assert np.isfinite(x).all()
    bound = 2.0 * 52 * math.log(2.0)
    assert abs(x[0]) == pytest.approx(bound, rel=1e-12) and abs(x[-1]) == pytest.approx(bound, rel=1e-12)
    assert np.abs(x).max() <= bound * (1 + 1e-12)
    assert np.array_equal(laplace_from_words(~EXTREMES, scale=2.0), -x)  # exactly antisymmetric
    w = np.uint64(2**64 - 1) >> np.uint64(11)  # the old formula on the all-ones word
    with np.errstate(divide="ignore"):
        old = -np.sign((w.astype(np.float64) + 0.5) * 2.0**-53 - 0.5) * np.log1p(
            -2.0 * abs((w.astype(np.float64) + 0.5) * 2.0**-53 - 0.5)
        )
    assert np.isinf(old)  # what the bound above rules out


def test_the_stream_draws_laplace_through_the_pure_function():
    a, b = SecretStream(KEY), SecretStream(KEY)
    words = np.frombuffer(b.bytes(8 * 20), dtype="<u8")  # the same keystream, as 64-bit words
    assert np.array_equal(a.laplace_np((4, 5), scale=3.0), laplace_from_words(words, 3.0).reshape(4, 5))


def test_bits_are_balanced():
    b = SecretStream(KEY).bits((10001,))
    assert b.dtype == torch.bool and b.shape == (10001,)
    assert abs(b.float().mean().item() - 0.5) < 0.02
