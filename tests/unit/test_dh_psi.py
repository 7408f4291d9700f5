"""The DH-PSI group arithmetic (securevfl.data.dh_psi): RFC 9380's expander,
hashing onto ristretto255, commutative blinding, malformed elements."""

from __future__ import annotations

import sys
from pathlib import Path

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


def test_hash_to_group_is_deterministic_distinct_and_ordered():
    ids = [f"id-{i}" for i in range(600)]
    a = dh_psi.hash_to_group(ids, threads=1)
    b = dh_psi.hash_to_group(ids, threads=2)
    assert a == b  # threads split the work but keep the order
    elems = dh_psi.unpack(a)
    assert len(elems) == 600 and len(set(elems)) == 600
    assert elems[5] == dh_psi.unpack(dh_psi.hash_to_group(["id-5"]))[0]
    assert all(dh_psi.rbcl.crypto_core_ristretto255_is_valid_point(e) for e in elems[:20])


def test_blinding_commutes_and_unblinding_inverts():
    h = dh_psi.hash_to_group([f"x{i}" for i in range(300)])
    a, b = dh_psi.Key.fresh(), dh_psi.Key.fresh()
    ab = dh_psi.multiply(b.scalar, dh_psi.multiply(a.scalar, h))
    ba = dh_psi.multiply(a.scalar, dh_psi.multiply(b.scalar, h))
    assert ab == ba
    assert dh_psi.multiply(a.inverse, ab) == dh_psi.multiply(b.scalar, h)
    assert dh_psi.multiply(a.scalar, h) != dh_psi.multiply(b.scalar, h)  # fresh keys differ


def test_malformed_elements_are_refused():
    key = dh_psi.Key.fresh()
    good = dh_psi.hash_to_group(["a", "b"])
    with pytest.raises(dh_psi.InvalidElement, match="element 1"):
        dh_psi.multiply(key.scalar, good[:32] + b"\xff" * 32)  # not canonical
    with pytest.raises(dh_psi.InvalidElement, match="element 0"):
        dh_psi.multiply(key.scalar, bytes(32) + good[32:])  # the identity
    with pytest.raises(dh_psi.InvalidElement, match="whole number"):
        dh_psi.multiply(key.scalar, good[:-1])


def test_sorted_elements_hide_the_input_order():
    ids = [f"id-{i}" for i in range(50)]
    h = dh_psi.hash_to_group(ids)
    rev = dh_psi.hash_to_group(ids[::-1])
    assert h != rev
    assert dh_psi.sorted_elements(h) == dh_psi.sorted_elements(rev)
    assert dh_psi.unpack(dh_psi.sorted_elements(h)) == sorted(dh_psi.unpack(h))


def test_key_repr_hides_the_secret():
    key = dh_psi.Key.fresh()
    assert key.scalar.hex() not in repr(key) and "secret" in repr(key)


def test_the_bundled_library_leaves_no_temporary_file_behind():
    path = Path(sys.modules["rbcl._sodium"].lib_path)
    assert path.suffix == ".so" and not path.exists()
