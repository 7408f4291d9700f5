"""The CKKS key-recovery attack of Li and Micciancio ("On the Security of
Homomorphic Encryption on Approximate Numbers", Eurocrypt 2021), played by the
evaluating party of ``ckks`` with what it gets back.

The evaluator holds the key owner's public key, so it can make a ciphertext
(c0, c1) of a message it knows (zero), hand it over in place of a product, and
read the key owner's decryption of it, as every decryption in the protocol
leaves its owner (P_i's z-share, A's masked dL/dh). Unflooded, the decryption is
e = c0 + c1 s exactly (decoded to float64, which at scale Delta still holds e's
integer coefficients), so modulo the first prime s = (e - c0) / c1 coefficient-
wise in SEAL's NTT domain: one decryption gives the whole secret key. Flooded
(:meth:`securevfl.exchange.ckks.key.CkksKey.decrypt`), the decryption is e + noise
of ~2^58.8 per coefficient and the same algebra yields garbage.

Verified against the owner's actual secret key (read here only to score the
attack). Written against the ckks API that both the unflooded code (4956a32) and
the flooded one expose, so the same test shows the attack working there.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tenseal")

from securevfl.exchange.ckks import CkksOptions
from securevfl.exchange.ckks.packing import spread_layout
from securevfl.exchange.ckks.scheme import CkksScheme
from securevfl.exchange.ckks.wire import frame

pytestmark = pytest.mark.timeout(300)


def _words(obj: object, start: int, count: int) -> list[int]:
    """``count`` 64-bit words of a SEAL ciphertext's data from ``start``."""
    arr = obj.dyn_array()  # type: ignore[attr-defined]
    return [int(arr[i]) for i in range(start, start + count)]


def _plain_words(pt: object, count: int) -> list[int]:
    """The first ``count`` 64-bit words of a SEAL plaintext (its first prime's values)."""
    return [int(pt.data(i)) for i in range(count)]  # type: ignore[attr-defined]


def recover_key_ntt(key, peer) -> list[int]:
    """The evaluator's attack: the secret key's NTT values modulo the first prime,
    from one decryption of a zero it encrypted itself."""
    ring = peer.ring
    n, slots = 2 * ring.slots, ring.slots
    pt0 = ring.encode(np.zeros(slots), ring.out_level, peer.scale)
    ct = peer.encrypt_plaintext(pt0)  # a public-key encryption of 0: the evaluator knows m = 0
    layout = spread_layout(slots, 2, slots)  # one ciphertext, every slot a data position
    got = key.decrypt(frame(layout, [peer.io.dump(ct)]), (slots, 2))  # what leaves the key owner
    # the decrypted polynomial from the float64 slots, re-encoded exactly at Delta (NTT form)
    dec = ring.encode(got[:, 0] + 1j * got[:, 1], ring.out_level, peer.scale)
    q0 = int(ring.sc.get_context_data(ring.out_level).parms().coeff_modulus()[0].value())
    n_mod = ct.coeff_modulus_size()
    c0, c1 = _words(ct, 0, n), _words(ct, n_mod * n, n)
    e = _plain_words(dec, n)
    return [((ei - a) * pow(b, -1, q0)) % q0 for ei, a, b in zip(e, c0, c1, strict=True)]


def owner_key_ntt(key, n: int) -> list[int]:
    """The key owner's secret key in SEAL's NTT form modulo the first prime (scoring only)."""
    return _plain_words(key.ctx.secret_key().data.data(), n)


@pytest.fixture(scope="module")
def parties():
    scheme = CkksScheme(CkksOptions())
    key = scheme.new_key()
    return key, scheme.peer(key.public(), sender="rank 1 (left)")


def test_flooded_decryption_does_not_give_the_key(parties):
    key, peer = parties
    n = key.opts.poly_modulus_degree
    truth = owner_key_ntt(key, n)
    guess = recover_key_ntt(key, peer)
    # a right key matches everywhere; a wrong one (uniform mod q0) almost nowhere
    assert sum(g == t for g, t in zip(guess, truth, strict=True)) < 4


def test_the_attack_itself_works_on_an_unflooded_decryption(parties, monkeypatch):
    """Sanity of the attack: with the flooding switched off (its width set to 0)
    the same evaluator recovers the whole key from one decryption."""
    key, peer = parties
    n = key.opts.poly_modulus_degree
    monkeypatch.setattr(key, "flood_sigma", 0.0)
    assert recover_key_ntt(key, peer) == owner_key_ntt(key, n)
