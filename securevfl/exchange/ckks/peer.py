"""The evaluating party's side of ``ckks``: the other party's public part, and
the two products Enc(X) W + mask and p^T Enc(Y) + mask on its ciphertexts.

Threat model (SECURITY.md, ``ckks``; semi-honest A and P_i). Circuit privacy and
masks: every result is re-randomized by adding a fresh public-key encryption
of the mask, which replaces the result's second component with an RLWE sample
the key owner cannot relate to the evaluator's plaintexts. Masks are uniform
in [-mask_bound, mask_bound] on the real and the imaginary part of every slot
of every result ciphertext (padding and spare chunks included; the caller's
mask fills the data positions, fresh ones the rest). The key owner decrypts
v + e + eps where e is the CKKS error (it depends on the evaluator's operands);
eps is uniform on a cube of side 2 M in all N real coordinates, so the
decryption, a function of v + e + eps, is within statistical distance
(||v - v'||_1 + ||e - e'||_1) / (2 M) of the one for v', e'. Per entry:
|v| / (2 M) = 2^-23 |v| at the default M = 2^22; e ~ 1e-9 adds nothing
visible. M is bounded by exact decryption on the output primes (checked at
load, :func:`securevfl.exchange.ckks.params.check`) and by float64 decoding,
whose error ~M 2^-50 should stay below float32's resolution of the values
trained. A public part that carries a secret key, or other parameters than the
protocol's, is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.ckks._tenseal import sa, ts
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.kernels import Encoded, Kernels, Ring
from securevfl.exchange.ckks.packing import Layout, LinearMap, matmul_map, standard_layout, tmatmul_map
from securevfl.exchange.ckks.params import CkksOptions
from securevfl.exchange.ckks.wire import SealIO, check_level, frame, unframe, unpack_public
from securevfl.exchange.ckks.worker import Worker
from securevfl.exchange.he import HEPeer


class CkksPeer(HEPeer):
    """The other party's public key, Galois keys and the products under them."""

    background_prepare = True  # prepare_operands() encodes on a worker thread

    def __init__(self, opts: CkksOptions, public: bytes, sender: str):
        self.opts, self.sender = opts, sender
        self.ops = OpCounter()
        try:
            ctx_bytes, gk_bytes = unpack_public(bytes(public))
        except ValueError as exc:
            raise ProtocolError(f"{sender}: malformed CKKS public context ({exc})") from None
        try:
            ctx = ts.context_from(ctx_bytes, n_threads=1)
        except Exception as exc:  # TenSEAL raises std exceptions on malformed input
            raise ProtocolError(f"{sender}: malformed CKKS public context ({exc})") from None
        if ctx.has_secret_key() or ctx.is_private():
            raise ProtocolError(f"{sender}: its CKKS public context carries a secret key; refused")
        if not ctx.has_public_key():
            raise ProtocolError(f"{sender}: CKKS public context without a public key")
        sc = ctx.seal_context().data
        parms = sc.key_context_data().parms()
        bits = [m.bit_count() for m in parms.coeff_modulus()]
        if parms.poly_modulus_degree() != opts.poly_modulus_degree or bits != list(opts.coeff_mod_bit_sizes):
            raise ProtocolError(
                f"{sender}: CKKS context with N={parms.poly_modulus_degree()}, primes {bits}; "
                f"the protocol says N={opts.poly_modulus_degree}, {list(opts.coeff_mod_bit_sizes)}"
            )
        self._ctx = ctx  # keeps the SEAL objects alive
        self.io = SealIO(sc, self.ops)
        self.ring = Ring(sc, self.ops)
        try:
            gk = self.io.load(gk_bytes, sa.GaloisKeys())
            missing = [e for e in sc.key_context_data().galois_tool().get_elts_all() if not gk.has_key(e)]
        except Exception as exc:  # SEAL raises std exceptions on malformed keys
            raise ProtocolError(f"{sender}: malformed CKKS Galois keys ({exc})") from None
        if missing:
            raise ProtocolError(f"{sender}: CKKS Galois keys miss {len(missing)} power-of-two rotations")
        self.scale = 2.0**opts.global_scale_bits
        self.kernels = Kernels(self.ring, gk, self.scale)
        self._encryptor = sa.Encryptor(sc, ctx.public_key().data)
        self._stream = SecretStream.fresh()  # the masks of unused slots
        self._prepared: dict[tuple[Any, ...], tuple[LinearMap, Encoded]] = {}
        # prepare_operands() encodes on a worker thread with its own encoder; those
        # encodings are counted in ``prep_ops``, not ``ops`` (they are off the critical path)
        self.prep_ops = OpCounter()
        self._prep_ring = Ring(sc, self.prep_ops)
        self._prep: Worker | None = None
        # the prepared tmatmul started by matmul() on the same input: (blob, key, map, worker)
        self._ahead: tuple[bytes, tuple[Any, ...], LinearMap, Worker] | None = None

    # -- helpers
    def _input(self, blob: bytes, shape: tuple[int, int]) -> tuple[Layout, list[Any]]:
        what = f"{self.sender}: ckks ciphertext"
        try:
            layout, cts = unframe(blob, self.io, what)
            # either standard layout of the shape (for matmul only, or for both products)
            known = {standard_layout(shape[0], shape[1], self.ring.slots, tmatmul=t) for t in (False, True)}
            if layout not in known:
                raise ValueError(f"{what}: layout {layout} does not match a {shape[0]}x{shape[1]} matrix")
            check_level(cts, [self.ring.in_level], self.scale, what)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        return layout, cts

    def _finish(self, outs: list[Any], layout: Layout, mask: np.ndarray) -> bytes:
        """Add a fresh public-key encryption of the mask to every result (re-randomizes
        it); data positions get the caller's mask, all others fresh uniform masks."""
        ring, m = self.ring, self.opts.mask_bound
        fresh = m * (2.0 * self._stream.uniform_np((layout.n_ct, ring.slots, 2)) - 1.0)
        data = layout.pack(mask, ring.slots)
        used = layout.used(ring.slots)
        vals = np.where(used, np.stack([data.real, data.imag], axis=-1), fresh)
        blobs = []
        for j in range(layout.n_ct):
            pt = ring.encode(vals[j, :, 0] + 1j * vals[j, :, 1], ring.out_level, self.scale)
            enc = self.encrypt_plaintext(pt)
            if outs[j] is None:
                out = enc
            else:
                out = outs[j]
                self.kernels.add_inplace(out, enc)
            blobs.append(self.io.dump(out))
        return frame(layout, blobs)

    def encrypt_plaintext(self, pt: Any) -> Any:
        """A fresh public-key encryption (the re-randomizing mask of a result)."""
        enc = sa.Ciphertext()
        self._encryptor.encrypt(pt, enc)
        self.ops.encrypt_public += 1
        return enc

    @staticmethod
    def _checked(name: str, a: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        if a.shape != shape or not np.isfinite(a).all():
            raise ValueError(f"ckks {name}: expected a finite {shape} matrix, got {a.shape}")
        return a

    def _map(self, op: str, lin: Layout, operand: np.ndarray) -> tuple[LinearMap, Encoded | None]:
        """The linear map of a product on an input laid out as ``lin``, and its encoded
        diagonals when :meth:`prepare_operands` made them for exactly this operand and
        layout (taken: each is used once)."""
        self._collect()
        hit = self._prepared.pop(self._key(op, lin, operand), None)
        return hit if hit is not None else (self._build(op, lin, operand), None)

    @staticmethod
    def _key(op: str, lin: Layout, x: np.ndarray) -> tuple[Any, ...]:
        return (op, lin, x.shape, x.tobytes())

    def _build(self, op: str, lin: Layout, x: np.ndarray) -> LinearMap:
        return matmul_map(lin, x, self.ring.slots) if op == "matmul" else tmatmul_map(x, lin, self.ring.slots)

    def _collect(self) -> None:
        """Wait for a running preparation and take its encodings (re-raising its error)."""
        if self._prep is not None:
            prep, self._prep = self._prep, None
            self._prepared.update(prep.result())

    def _settle(self) -> None:
        """Wait for every background computation (before a new step's work starts)."""
        self._collect()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            ahead[3].result()

    def prepare_operands(
        self, shape: tuple[int, int], *, w: np.ndarray | None = None, p: np.ndarray | None = None
    ) -> None:
        """Start encoding the diagonals of the coming ``matmul(., shape, w, .)`` and
        ``tmatmul(p, ., shape, .)`` (they need no ciphertext) on a worker thread and
        return at once: the caller goes on to wait for the other party's reply and
        the encoding runs meanwhile (:mod:`~securevfl.exchange.ckks.worker`). The
        products wait for the worker before they use its encodings. Only this
        party's own operands are touched; nothing is sent. The input is expected in
        the standard layout of an operand of both products when ``p`` is given (the
        backward pass's Enc(dL/dz)), of ``matmul`` only otherwise; a product on
        another layout encodes its own diagonals."""
        self._settle()
        self._prepared.clear()
        jobs = []
        for op, x in (("matmul", w), ("tmatmul", p)):
            if x is None:
                continue
            x = np.array(x, dtype=np.float64)  # a copy: the caller may change its array meanwhile
            if x.ndim != 2 or not np.isfinite(x).all():
                continue  # left to the product's own checks
            jobs.append((op, x))
        if jobs:
            lin = standard_layout(shape[0], shape[1], self.ring.slots, tmatmul=p is not None)
            self._prep = Worker(self._encode_jobs, lin, jobs, name="ckks-prepare")

    def _encode_jobs(
        self, lin: Layout, jobs: list[tuple[str, np.ndarray]]
    ) -> dict[tuple[Any, ...], tuple[LinearMap, Encoded]]:
        out = {}
        for op, x in jobs:
            lmap = self._build(op, lin, x)
            out[self._key(op, lin, x)] = (lmap, self.kernels.encode_map(lmap, self._prep_ring))
        return out

    # -- the two operations
    def matmul(self, blob: bytes, shape: tuple[int, int], w: np.ndarray, mask: np.ndarray) -> bytes:
        """Enc(X) w + mask. When a prepared ``tmatmul`` on an input of the same shape
        waits (the backward pass: both products take Enc(dL/dz)), its evaluation
        starts on a worker before this returns, so it runs while the caller sends
        this result; :meth:`tmatmul` uses it only for the very same input blob and
        left factor, and adds its own mask then. Nothing leaves this party early."""
        self._settle()
        r, c = shape
        lin, cts = self._input(blob, shape)
        m = np.asarray(w).shape[1] if np.ndim(w) == 2 else -1
        w = self._checked("matmul weight", w, (c, m))
        mask = self._checked("matmul mask", mask, (r, m))
        lmap, enc = self._map("matmul", lin, w)
        out = self._finish(self.kernels.apply(cts, lmap, enc), lmap.out, mask)
        ahead = next((k for k in self._prepared if k[0] == "tmatmul" and k[1] == lin), None)
        if ahead is not None:
            lmap_t, enc_t = self._prepared.pop(ahead)
            worker = Worker(self.kernels.apply, cts, lmap_t, enc_t, name="ckks-tmatmul")
            self._ahead = (bytes(blob), ahead, lmap_t, worker)
        return out

    def tmatmul(self, p: np.ndarray, blob: bytes, shape: tuple[int, int], mask: np.ndarray) -> bytes:
        r, m = shape
        a = np.asarray(p).shape[1] if np.ndim(p) == 2 else -1
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            outs = ahead[3].result()
            if ahead[0] == blob:  # the input matmul() validated and started this product on
                p = self._checked("tmatmul left factor", p, (r, a))
                mask = self._checked("tmatmul mask", mask, (a, m))
                if ahead[1] == self._key("tmatmul", ahead[1][1], p):  # same blob: same layout
                    return self._finish(outs, ahead[2].out, mask)
        lin, cts = self._input(blob, shape)
        p = self._checked("tmatmul left factor", p, (r, a))
        mask = self._checked("tmatmul mask", mask, (a, m))
        lmap, enc = self._map("tmatmul", lin, p)
        return self._finish(self.kernels.apply(cts, lmap, enc), lmap.out, mask)
