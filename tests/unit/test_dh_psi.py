"""The DH-PSI curve arithmetic (securevfl.data.dh_psi): RFC 9380's expander and
Elligator 2 encoding onto Curve25519, commutative X25519 blinding, malformed
elements."""

from __future__ import annotations

import hashlib

import gmpy2
import pytest

from securevfl.data import dh_psi

QUUX_DST = b"QUUX-V01-CS02-with-expander-SHA512-256"


@pytest.mark.parametrize(
    ("msg", "n", "expected"),
    [  # RFC 9380 Appendix K.3 (expand_message_xmd, SHA-512)
        (b"", 0x20, "6b9a7312411d92f921c6f68ca0b6380730a1a4d982c507211a90964c394179ba"),
        (b"abc", 0x20, "0da749f12fbe5483eb066a5f595055679b976e93abe9be6f0f6318bce7aca8dc"),
        (
            b"",
            0x80,
            "41b037d1734a5f8df225dd8c7de38f851efdb45c372887be655212d07251b921"
            "b052b62eaed99b46f72f2ef4cc96bfaf254ebbbec091e1a3b9e4fb5e5b619d2e"
            "0c5414800a1d882b62bb5cd1778f098b8eb6cb399d5d9d18f5d5842cf5d13d7e"
            "b00a7cff859b605da678b318bd0e65ebff70bec88c753b159a805d2c89c55961",
        ),
    ],
)
def test_expand_message_xmd_matches_rfc9380_vectors(msg, n, expected):
    assert dh_psi.expand_message_xmd(msg, QUUX_DST, n).hex() == expected


NU_DST = b"QUUX-V01-CS02-with-curve25519_XMD:SHA-512_ELL2_NU_"


@pytest.mark.parametrize(
    ("msg", "q_x", "p_x"),
    [  # RFC 9380 Appendix J.4.2 (curve25519_XMD:SHA-512_ELL2_NU_): Q = map_to_curve(u), P = 8 Q
        (
            b"",
            "51125222da5e763d97f3c10fcc92ea6860b9ccbbd2eb1285728f566721c1e65b",
            "1bb913f0c9daefa0b3375378ffa534bda5526c97391952a7789eb976edfe4d08",
        ),
        (
            b"abc",
            "7d56d1e08cb0ccb92baf069c18c49bb5a0dcd927eff8dcf75ca921ef7f3e6eeb",
            "7c22950b7d900fa866334262fcaea47a441a578df43b894b4625c9b450f9a026",
        ),
        (
            b"abcdef0123456789",
            "3fbe66b9c9883d79e8407150e7c2a1c8680bee496c62fabe4619a72b3cabe90f",
            "31ad08a8b0deeb2a4d8b0206ca25f567ab4e042746f792f4b7973f3ae2096c52",
        ),
    ],
)
def test_encode_to_curve_matches_rfc9380_vectors(msg, q_x, p_x):
    x = dh_psi.encode_to_curve_x(msg, NU_DST)
    assert f"{x:064x}" == q_x
    assert f"{dh_psi.clear_cofactor_x(x):064x}" == p_x


def _on_curve(x: int) -> bool:
    g = (x * x * x + 486662 * x * x + x) % int(dh_psi.P)
    return gmpy2.legendre(g, dh_psi.P) >= 0


def test_hash_to_group_is_deterministic_distinct_ordered_and_on_the_curve():
    ids = [f"id-{i}" for i in range(600)]
    a = dh_psi.hash_to_group(ids)
    elems = dh_psi.unpack(a)
    assert len(elems) == 600 and len(set(elems)) == 600
    assert a == dh_psi.hash_to_group(ids)
    assert elems[5] == dh_psi.unpack(dh_psi.hash_to_group(["id-5"]))[0]
    # never on the twist: a twist point would tell a receiver one bit about the ID
    assert all(_on_curve(int.from_bytes(e, "little")) for e in elems)
    # a bare SHA-256 u-coordinate (SecretFlow's hash) lands on the twist about half the time
    bare = [int.from_bytes(hashlib.sha256(i.encode()).digest(), "little") & ((1 << 255) - 1) for i in ids]
    assert 200 < sum(not _on_curve(u) for u in bare) < 400


def test_blinding_commutes_and_stays_on_the_curve():
    h = dh_psi.hash_to_group([f"x{i}" for i in range(300)])
    a, b = dh_psi.Key.fresh(), dh_psi.Key.fresh()
    ab = dh_psi.multiply(b, dh_psi.multiply(a, h))
    ba = dh_psi.multiply(a, dh_psi.multiply(b, h))
    assert ab == ba
    assert dh_psi.multiply(a, h) != dh_psi.multiply(b, h)  # fresh keys differ
    assert all(_on_curve(int.from_bytes(e, "little")) for e in dh_psi.unpack(ab)[:50])


def test_malformed_elements_are_refused():
    key = dh_psi.Key.fresh()
    good = dh_psi.hash_to_group(["a", "b"])
    with pytest.raises(dh_psi.InvalidElement, match="element 1"):
        dh_psi.multiply(key, good[:32] + b"\xff" * 32)  # top bit set: not canonical
    p_bytes = int(dh_psi.P).to_bytes(32, "little")
    with pytest.raises(dh_psi.InvalidElement, match="element 0"):
        dh_psi.multiply(key, p_bytes + good[32:])  # p itself: a second encoding of 0
    with pytest.raises(dh_psi.InvalidElement, match="element 0"):
        dh_psi.multiply(key, bytes(32) + good[32:])  # a small-order point
    with pytest.raises(dh_psi.InvalidElement, match="element 1"):
        dh_psi.multiply(key, good[:32] + (1).to_bytes(32, "little"))  # u = 1: a point of order 4
    with pytest.raises(dh_psi.InvalidElement, match="whole number"):
        dh_psi.multiply(key, good[:-1])
    dh_psi.check_canonical((int(dh_psi.P) - 1).to_bytes(32, "little"))  # p - 1 is canonical


def test_blinder_workers_give_what_multiply_gives_in_order():
    h = dh_psi.hash_to_group([f"w{i}" for i in range(300)])
    key = dh_psi.Key.fresh()
    with dh_psi.Blinder(key, workers=2, min_parallel=0, slice_elements=64) as blinder:
        pending = [blinder.submit(h), blinder.submit(h[: 32 * 10])]  # 5 slices, then 1
        assert [len(p.parts) for p in pending] == [5, 1]
        assert pending[0].result() == dh_psi.multiply(key, h)
        assert pending[1].result() == dh_psi.multiply(key, h[: 32 * 10])
    # below min_parallel, or with one worker, the batch is blinded here, at once
    with dh_psi.Blinder(key, workers=2, min_parallel=1000) as inline:
        done = inline.submit(h)
        assert all(p.done() for p in done.parts) and done.result() == dh_psi.multiply(key, h)


def test_blinder_names_a_bad_element_by_its_place_in_the_batch():
    key = dh_psi.Key.fresh()
    h = dh_psi.hash_to_group([f"w{i}" for i in range(200)])
    small = h[: 32 * 150] + (1).to_bytes(32, "little") + h[32 * 151 :]  # u = 1 in the third slice
    with dh_psi.Blinder(key, workers=2, min_parallel=0, slice_elements=64) as blinder:
        pending = blinder.submit(small)
        with pytest.raises(dh_psi.InvalidElement, match="element 150 "):
            pending.result()
        with pytest.raises(dh_psi.InvalidElement, match="element 70 "):  # refused before any work
            blinder.submit(h[: 32 * 70] + b"\xff" * 32 + h[32 * 71 :])


def test_sorted_elements_hide_the_input_order():
    ids = [f"id-{i}" for i in range(50)]
    h = dh_psi.hash_to_group(ids)
    rev = dh_psi.hash_to_group(ids[::-1])
    assert h != rev
    assert dh_psi.sorted_elements(h) == dh_psi.sorted_elements(rev)
    assert dh_psi.unpack(dh_psi.sorted_elements(h)) == sorted(dh_psi.unpack(h))


def test_key_repr_hides_the_secret():
    key = dh_psi.Key.fresh()
    assert "secret" in repr(key) and not hasattr(key, "scalar")
