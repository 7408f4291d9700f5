"""Paillier keys held by their owner: key generation, encryption and decryption.

Textbook Paillier with g = n + 1 (Paillier 1999): Enc(m) = (1 + m n) s mod n^2 with
s a fresh uniform n-th residue, Dec(c) = L(c^lambda mod n^2) mu mod n, computed by
CRT over p^2 and q^2. Keys come from phe's generator (``phe`` stays the reference
implementation: tests encrypt here and decrypt with phe and vice versa). The
owner draws s by CRT from fixed-base tables (:mod:`.obfuscation`): its halves are
statistically uniform on the order-(p-1) subgroup of (Z/p^2)^* and the order-(q-1)
subgroup of (Z/q^2)^*, which is the distribution of r^n for uniform r.

Threat model: the key pair never leaves its owner; :meth:`PaillierKey.public`
returns n only. Encryption hides plaintexts from the peer under the decisional
composite residuosity assumption (|n| >= 2048 bits: about 112-bit security).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gmpy2
import numpy as np
from phe import paillier as phe_paillier

from securevfl.errors import ProtocolError
from securevfl.exchange.he.scheme import BOTH_OPS, MATMUL, TMATMUL, HEKey
from securevfl.exchange.paillier.counters import count
from securevfl.exchange.paillier.encoding import (
    COLS,
    ROWS,
    arrange,
    block_count,
    encode,
    pack,
    unarrange,
    unpack,
    unpack_ints,
)
from securevfl.exchange.paillier.kernels import powmods
from securevfl.exchange.paillier.obfuscation import FixedBaseSampler, Fresh, randoms
from securevfl.exchange.paillier.options import Params
from securevfl.exchange.paillier.wire import Section, ciphertext_bytes, dump_blob, dump_public, load_blob

#: which packing each peer operation needs
LAYOUT_OF = {MATMUL: COLS, TMATMUL: ROWS}


def _half_sampler(p: Any, p2: Any, sigma: int) -> FixedBaseSampler:
    """Statistically uniform elements of the order-(p-1) subgroup of (Z/p^2)^*; its
    bases r^p mod p^2 (r uniform) are exactly uniform on it."""
    bits = p.bit_length()
    return FixedBaseSampler(lambda t: powmods(randoms(p2, t), p, p2, 1), p2, bits, sigma)


class PaillierKey(HEKey):
    """A Paillier key pair (secret p, q) held by its owner; encrypts and decrypts by CRT."""

    def __init__(self, params: Params, key_bits: int):
        pub, priv = phe_paillier.generate_paillier_keypair(n_length=key_bits)
        self.prm = params
        self.n = gmpy2.mpz(pub.n)
        self.n2 = self.n * self.n
        p, q = gmpy2.mpz(priv.p), gmpy2.mpz(priv.q)
        self._p, self._q = p, q
        self._p2, self._q2 = p * p, q * q
        self._q2inv = gmpy2.invert(self._q2, self._p2)
        self._qinv = gmpy2.invert(q, p)
        g = self.n + 1
        self._hp = gmpy2.invert((gmpy2.powmod(g, p - 1, self._p2) - 1) // p, p)
        self._hq = gmpy2.invert((gmpy2.powmod(g, q - 1, self._q2) - 1) // q, q)
        self.ct_bytes = ciphertext_bytes(self.n2)
        self._sp = _half_sampler(p, self._p2, params.obf_sigma)
        self._sq = _half_sampler(q, self._q2, params.obf_sigma)
        self._fresh = Fresh(self._make_obfuscators, params.precompute)

    def public(self) -> bytes:
        return dump_public(self.n)

    def prepare(self) -> None:
        """Build the obfuscator tables now (otherwise at the first encryption)."""
        self._sp.tables()
        self._sq.tables()

    def _make_obfuscators(self, k: int) -> list[Any]:
        """k fresh n-th residues mod n^2, joined by CRT from (Z/p^2)^* and (Z/q^2)^* halves."""
        ap, aq = self._sp.sample(k), self._sq.sample(k)
        p2, q2, q2inv = self._p2, self._q2, self._q2inv
        count(mulmods=2 * k)
        return [b + q2 * ((a - b) * q2inv % p2) for a, b in zip(ap, aq, strict=True)]

    def encrypt_ints(self, ms: list[int]) -> list[Any]:
        """Raw Paillier encryption of integers (mod n) with fresh obfuscators."""
        n, n2 = self.n, self.n2
        obf = self._fresh.take(len(ms))
        count(encryptions=len(ms), mulmods=len(ms))
        return [(1 + (m % n) * n) * r % n2 for m, r in zip(ms, obf, strict=True)]

    def encrypt(self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS) -> bytes:
        """Any plaintext operands below 2^scalar_bits, values at 2^-precision_bits;
        slots sized for masks that hide the whole operand (:meth:`Params.generic_slot`)."""
        prm = self.prm
        nbits = self.n.bit_length()
        return self._encrypt(x, ops, prm.fx, lambda lay, terms: prm.generic_slot(terms, nbits))

    def encrypt_shared(
        self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS, share_bits: int | None = None
    ) -> bytes:
        """The HE protocol (he/protocol.py): values at 2^-shared_precision_bits (the owner multiplies
        :meth:`shared_copy`, rounded alike, so the rounding meets W_i, not the shares);
        ``matmul`` operands are weight shares below 2^share_bits, ``tmatmul`` operands
        the peer's embedding, below 2^value_bits like every encrypted value. Narrower
        slots, more of them per ciphertext (package docstring, "Packing")."""
        if share_bits is None:
            return self.encrypt(x, ops=ops)
        prm = self.prm
        nbits = self.n.bit_length()
        sb = int(share_bits)
        return self._encrypt(
            x, ops, prm.fxs, lambda lay, terms: prm.protocol_slot(lay == COLS, terms, sb, nbits)
        )

    def prepare_encryption(
        self, shape: tuple[int, int], *, ops: frozenset[str] = BOTH_OPS, share_bits: int | None = None
    ) -> None:
        """Make the obfuscators of a coming :meth:`encrypt_shared` of ``shape`` now (he/protocol.py
        calls it while the party waits); they are handed out first, each exactly once."""
        prm = self.prm
        rows, cols = (int(v) for v in shape)
        nbits = self.n.bit_length()
        need = 0
        for lay in sorted(LAYOUT_OF[op] for op in ops):
            terms = cols if lay == COLS else rows
            if share_bits is None:
                s = prm.generic_slot(terms, nbits)
            else:
                s = prm.protocol_slot(lay == COLS, terms, int(share_bits), nbits)
            a, b = (rows, cols) if lay == COLS else (cols, rows)
            need += b * block_count(a, (nbits - 1) // s)
        self._fresh.stock(need - self._fresh.stocked())

    def shared_ints(self, x: np.ndarray) -> np.ndarray:
        """The integers :meth:`encrypt_shared` encrypts: round(x 2^fxs), int64."""
        prm = self.prm
        return encode(x, prm.fxs, prm.v, "a value to encrypt", "value_bits")

    def shared_copy(self, x: np.ndarray) -> np.ndarray:
        """x exactly as :meth:`encrypt_shared` encodes it (float64 on the 2^-fxs grid)."""
        return np.ldexp(self.shared_ints(x).astype(np.float64), -self.prm.fxs)

    def _encrypt(
        self, x: np.ndarray, ops: frozenset[str], scale: int, slot: Callable[[int, int], int]
    ) -> bytes:
        prm = self.prm
        unknown = set(ops) - set(LAYOUT_OF)
        if not ops or unknown:
            raise ValueError(f"paillier: encrypt for operations {sorted(ops)}; known: {sorted(LAYOUT_OF)}")
        layouts = sorted(LAYOUT_OF[op] for op in ops)
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or 0 in x.shape:
            raise ValueError(f"paillier: encrypt takes a non-empty matrix, got shape {x.shape}")
        xi = encode(x, scale, prm.v, "a value to encrypt", "value_bits")
        rows, cols = x.shape
        nbits = self.n.bit_length()
        secs = []
        for lay in layouts:
            s = slot(lay, cols if lay == COLS else rows)
            slots = (nbits - 1) // s
            packed = pack(arrange(xi, lay, slots), s)
            secs.append(Section(lay, scale, s, slots, rows, cols, self.encrypt_ints(packed)))
        return dump_blob(secs, self.ct_bytes)

    def decrypt_ints(self, cts: list[Any]) -> list[Any]:
        """Raw Paillier decryption (CRT) to integers in [0, n)."""
        p, q, p2, q2 = self._p, self._q, self._p2, self._q2
        t = self.prm.threads
        count(decryptions=len(cts))
        ap = powmods([c % p2 for c in cts], p - 1, p2, t)
        aq = powmods([c % q2 for c in cts], q - 1, q2, t)
        out = []
        for a, b in zip(ap, aq, strict=True):
            mp = (a - 1) // p * self._hp % p
            mq = (b - 1) // q * self._hq % q
            out.append(mq + q * ((mp - mq) * self._qinv % p))
        return out

    def decrypt_exact(self, blob: bytes, shape: tuple[int, int], scale: int) -> np.ndarray:
        """The exact integers of a result blob at 2^-scale (Python ints); a blob of
        another shape or scale raises ProtocolError."""
        sec = self._result(blob, shape)
        if sec.scale != scale:
            raise ProtocolError(f"blob to decrypt: fixed-point scale 2^-{sec.scale}, expected 2^-{scale}")
        vals = unpack_ints(self.decrypt_ints(sec.cts), self.n, sec.slots, sec.slot_bits)
        return unarrange(vals, sec.layout, sec.rows, sec.cols, sec.slots)

    def _result(self, blob: bytes, shape: tuple[int, int]) -> Section:
        secs = load_blob(blob, self.n, self.n2, "blob to decrypt")
        sec = secs[0]
        rows, cols = (int(v) for v in shape)
        if (sec.rows, sec.cols) != (rows, cols):
            raise ProtocolError(
                f"blob to decrypt: holds a {sec.rows}x{sec.cols} matrix, expected {rows}x{cols}"
            )
        prm = self.prm
        if sec.scale not in (prm.fx, prm.F, prm.fxs, prm.Fs):
            raise ProtocolError(f"blob to decrypt: unexpected fixed-point scale 2^-{sec.scale}")
        return sec

    def decrypt(self, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        sec = self._result(blob, shape)
        rows, cols = sec.rows, sec.cols
        vals = unpack(self.decrypt_ints(sec.cts), self.n, sec.slots, sec.slot_bits)
        return np.ldexp(unarrange(vals, sec.layout, rows, cols, sec.slots), -sec.scale)

    def sections(self, blob: bytes) -> list[Section]:
        """The parsed sections of a blob under this key (validated as for decryption)."""
        return load_blob(blob, self.n, self.n2, "blob")
