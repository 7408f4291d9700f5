"""The evaluator's side of ``paillier``: homomorphic products under the peer's key.

Holds the other party's public n only (no decryption is possible here). For
``matmul``/``tmatmul`` of :mod:`securevfl.exchange.he` it parses the peer's blob,
runs the multi-exponentiation kernels, adds the packed mask and multiplies every
output by a fresh obfuscator, statistically uniform on the n-th residues, so that
the key owner learns the masked plaintext and nothing about the plaintext
operands (:mod:`.obfuscation` states the bound and why short exponents are not used).

Operands and masks: the protocol passes both as integers (:mod:`.arith`): the
operand at 2^-scalar_precision_bits, the mask at the result's scale, every bit of
it drawn (package docstring, "Masks"). The generic API may pass float64 instead,
encoded at those scales. Unused slots of a partial block get masks as wide as the
slot allows, from this party's own secret stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import securevfl.exchange.paillier.exact as exact
from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.he import HEPeer
from securevfl.exchange.paillier.counters import count
from securevfl.exchange.paillier.encoding import COLS, ROWS, arrange, block_count, encode, pack
from securevfl.exchange.paillier.kernels import Exponents, multiexp, powmods
from securevfl.exchange.paillier.obfuscation import FixedBaseSampler, Fresh, randoms
from securevfl.exchange.paillier.options import Params
from securevfl.exchange.paillier.wire import Section, ciphertext_bytes, dump_blob, load_blob


class PaillierPeer(HEPeer):
    """The other party's public key: homomorphic products, masks, re-randomization."""

    def __init__(self, params: Params, n: Any, sender: str):
        self.prm = params
        self.n = n
        self.n2 = n * n
        self.sender = sender
        self.ct_bytes = ciphertext_bytes(self.n2)
        n2 = self.n2
        self._sampler = FixedBaseSampler(
            lambda t: powmods(randoms(n, t), n, n2, params.threads), n2, n.bit_length(), params.obf_sigma
        )
        self._fresh = Fresh(self._make_obfuscators, params.precompute)
        self._pad = SecretStream.fresh()  # masks of unused slots

    def prepare(self) -> None:
        """Build the obfuscator tables now (otherwise at the first product)."""
        self._sampler.tables()

    def obfuscators(self, k: int) -> list[Any]:
        """k fresh obfuscators, never handed out before (for timing and tests)."""
        return self._fresh.take(k)

    def prepare_operands(
        self, shape: tuple[int, int], *, w: np.ndarray | None = None, p: np.ndarray | None = None
    ) -> None:
        """Called by he.py's P_i while A evaluates its forward product (P_i would
        otherwise wait): make the obfuscators of the coming ``matmul(., shape, w, .)``
        and ``tmatmul(p, ., shape, .)``, one per output ciphertext, counted for the
        packing of :meth:`PaillierKey.encrypt_shared` (a wrong guess costs nothing:
        :meth:`take` makes what is missing and keeps the rest for the next product,
        each handed out once). Needs no operand values, only their shapes."""
        prm = self.prm
        rows, cols = (int(v) for v in shape)
        nbits = self.n.bit_length()
        need = 0
        if w is not None:  # Enc(Y) @ w: w.shape[1] columns of row blocks
            s = prm.protocol_slot(True, cols, prm.share, nbits)
            need += int(np.shape(w)[1]) * block_count(rows, (nbits - 1) // s)
        if p is not None:  # p^T @ Y: p.shape[1] rows of column blocks
            s = prm.protocol_slot(False, rows, prm.v, nbits)
            need += int(np.shape(p)[1]) * block_count(cols, (nbits - 1) // s)
        self._fresh.stock(need - self._fresh.stocked())

    def _make_obfuscators(self, k: int) -> list[Any]:
        count(obfuscations=k)
        return self._sampler.sample(k)

    def _section(self, blob: bytes, layout: int, shape: tuple[int, int]) -> Section:
        """The blob's section of ``layout`` (a ProtocolError naming the sender if it has none)."""
        who = f"ciphertexts from {self.sender}"
        prm = self.prm
        for sec in load_blob(blob, self.n, self.n2, who):
            if sec.layout != layout:
                continue
            if (sec.rows, sec.cols) != tuple(shape):
                raise ProtocolError(f"{who}: a {sec.rows}x{sec.cols} matrix, expected {shape[0]}x{shape[1]}")
            if sec.scale not in (prm.fx, prm.fxs):
                raise ProtocolError(
                    f"{who}: fixed-point scale 2^-{sec.scale}, expected 2^-{prm.fx} or 2^-{prm.fxs}"
                )
            return sec
        name = "cols" if layout == COLS else "rows"
        raise ProtocolError(f"{who}: the blob has no '{name}' layout")

    def _check(self, sec: Section, terms: int, e: np.ndarray, mask_bits: int) -> None:
        """Whatever slot width the sender chose, a sum of ``terms`` products with these
        operands ``e`` (encoded integers) plus this mask must not overflow it."""
        prm = self.prm
        op_bits = max(0, exact.bit_length(e) - prm.fw)  # |operand| < 2^op_bits
        need = prm.slot_need(terms, op_bits, sec.scale, mask_bits)
        if sec.slot_bits < need:  # the message names no bound of this party's own operand
            raise ProtocolError(
                f"ciphertexts from {self.sender}: {sec.slot_bits}-bit slots could overflow in sums of "
                f"{terms} products with this party's operands plus a {mask_bits}-bit mask"
            )

    def _mask_ints(self, mask: np.ndarray, shape: tuple[int, int], scale: int) -> tuple[np.ndarray, int]:
        """The mask as integers at the result's 2^-scale, and its width m (it lies in
        [-2^(m-1), 2^(m-1))). Integers are taken as they are; float64 (generic API) is
        encoded at that scale."""
        mask = np.asarray(mask)
        if mask.shape != shape:
            raise ValueError(f"paillier: a mask of shape {mask.shape} for a {shape[0]}x{shape[1]} result")
        if mask.dtype.kind == "f":
            if not np.all(np.isfinite(mask)):
                raise ValueError("paillier: masks must be finite")
            mask = exact.from_float(mask, scale)
        elif mask.dtype != object:
            mask = exact.ints(mask)
        return mask, exact.signed_bits(mask)

    def _finish(self, outs: list[Any], mk: np.ndarray, sec: Section, rows: int, cols: int) -> bytes:
        """Add the packed mask and a fresh obfuscator to every output ciphertext."""
        prm = self.prm
        scale = sec.scale + prm.fw
        slots = arrange(mk, sec.layout, sec.slots)
        pad = ~arrange(np.ones(mk.shape, dtype=bool), sec.layout, sec.slots)
        if pad.any():  # padding slots hold zeros from an honest sender; mask them as widely as they hold
            slots[pad] = exact.uniform(self._pad, (int(pad.sum()),), sec.slot_bits - 2)
        packed = pack(slots, sec.slot_bits)
        n, n2 = self.n, self.n2
        obf = self._fresh.take(len(outs))
        count(ct_add=len(outs), mulmods=2 * len(outs))
        res = [c * (1 + (mv % n) * n) % n2 * r % n2 for c, mv, r in zip(outs, packed, obf, strict=True)]
        out = Section(sec.layout, scale, sec.slot_bits, sec.slots, rows, cols, res)
        return dump_blob([out], self.ct_bytes)

    def _scalars(self, w: np.ndarray) -> np.ndarray:
        """Plaintext operands at 2^-fw: float64 is encoded (below 2^scalar_bits);
        integers (the protocol's shares, any size) are taken as they are."""
        w = np.asarray(w)
        if w.dtype.kind == "f":
            return encode(w, self.prm.fw, self.prm.sb, "a plaintext operand", "scalar_bits")
        if w.dtype == object and exact.bit_length(w) <= 62:
            return w.astype(np.int64)
        return w if w.dtype == object else w.astype(np.int64)

    def _products(self, cts: list[Any], e: np.ndarray, nb: int) -> list[Any]:
        """Enc(X) @ e for X packed in ``nb`` blocks per column: outputs in the same layout."""
        ex = Exponents(e)  # digits once, for every block
        outs: list[Any] = [None] * (e.shape[1] * nb)
        try:
            for t in range(nb):
                for j, ct in enumerate(multiexp(cts[t::nb], ex, self.n2)):
                    outs[j * nb + t] = ct
        except ZeroDivisionError:
            raise ProtocolError(f"ciphertexts from {self.sender}: a ciphertext is not invertible") from None
        return outs

    def matmul(self, blob: bytes, shape: tuple[int, int], w: np.ndarray, mask: np.ndarray) -> bytes:
        r, c = (int(v) for v in shape)
        w = np.asarray(w)
        if w.ndim != 2 or w.shape[0] != c or np.shape(mask) != (r, w.shape[1]):
            raise ValueError(f"paillier matmul: shapes {shape} @ {w.shape} + {np.shape(mask)}")
        e = self._scalars(w)
        sec = self._section(blob, COLS, (r, c))
        mk, mbits = self._mask_ints(mask, (r, w.shape[1]), sec.scale + self.prm.fw)
        self._check(sec, c, e, mbits)
        outs = self._products(sec.cts, e, block_count(r, sec.slots))
        return self._finish(outs, mk, sec, r, w.shape[1])

    def tmatmul(self, p: np.ndarray, blob: bytes, shape: tuple[int, int], mask: np.ndarray) -> bytes:
        r, m = (int(v) for v in shape)
        p = np.asarray(p)
        if p.ndim != 2 or p.shape[0] != r or np.shape(mask) != (p.shape[1], m):
            raise ValueError(f"paillier tmatmul: shapes {p.shape}^T @ {shape} + {np.shape(mask)}")
        e = self._scalars(p)
        sec = self._section(blob, ROWS, (r, m))  # p^T @ Y: Y^T's matmul by p
        mk, mbits = self._mask_ints(mask, (p.shape[1], m), sec.scale + self.prm.fw)
        self._check(sec, r, e, mbits)
        outs = self._products(sec.cts, e, block_count(m, sec.slots))
        return self._finish(outs, mk, sec, p.shape[1], m)
