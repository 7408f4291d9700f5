"""The evaluating party's side of ``ckks``: the other party's public part, and
the two products Enc(X) W + mask and p^T Enc(Y) + mask on its ciphertexts.

Threat model (SECURITY.md, ``ckks``; semi-honest A and P_i; the whole argument is
in the package docstring). What the key owner decrypts must tell it nothing
about this party's operands beyond the value it may learn:

* re-randomization: every result gets a fresh public-key encryption of its mask
  added, which replaces its second component with an RLWE sample the key owner
  cannot relate to this party's plaintexts;
* masks: every real coordinate of every result slot carries a Gaussian mask of
  mask_std (data positions the caller's, :meth:`CkksScheme.mask`; padding, spare
  chunks and imaginary halves fresh ones from this object's stream);
* smudging: a float64 mask lies on the grid of its own ulp (2^-28 at |mask| <
  2^25), far coarser than what the key owner can decode (Delta^-1 = 2^-89); with
  the grid known, the decryption modulo the grid would reveal the masked value's
  low bits. Every result therefore also gets a fresh Gaussian of
  :func:`~securevfl.exchange.ckks.params.smudge_sigma` (two such ulps) on every
  real slot coordinate, encoded and added exactly in the ring; it is not removed
  (the value carries it as noise, 2^-27 at the defaults).

The key owner then sees v + mask + smudge + e (e: the CKKS error, which depends
on this party's operands too) and, per coordinate, that is within statistical
distance |v - v'| / (2 mask_std) + 2^-100 (the smudging against the grid) of
the view for v', plus 2^-50 per ciphertext for the encodings' rounding (below
2^-77 in l2, shifting the smudging Gaussian); over many values the Gaussian
masks compose as sqrt(sum (v - v')^2) / (2 mask_std) (KL divergences add;
uniform masks would add their distances linearly).

Guard: every column of the plaintext operand (the weight share in ``matmul``,
h'_i in ``tmatmul``) must have l2 norm <= 2^operand_norm_bits, the bound the key
owner's flooding and the exact-decryption limit are sized for; otherwise
:class:`Diverged` names the operand and the bound (the column and its norm in
its owner-only ``detail``), before anything is computed. h'_i's columns are
within it by construction (its rows are clipped to 2^value_norm_bits and the
load-time check asks sqrt(batch_size) 2^value_norm_bits <= 2^operand_norm_bits);
a weight share only passes it if W_i itself has grown to about 2^18 per column.
A public part that carries a secret key, or other parameters than the protocol's,
is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from securevfl.csprng import SecretStream
from securevfl.errors import Diverged, ProtocolError
from securevfl.exchange.ckks._tenseal import sa, ts
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.kernels import Encoded, Kernels, Ring
from securevfl.exchange.ckks.packing import Layout, LinearMap, matmul_map, standard_layout, tmatmul_map
from securevfl.exchange.ckks.params import CkksOptions, smudge_sigma
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
        self._stream = SecretStream.fresh()  # the masks of unused slots and the smudging
        self.smudge_sigma = smudge_sigma(opts)
        self.operand_bound = 2.0**opts.operand_norm_bits
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
        it; data positions get the caller's mask, all others fresh Gaussian masks of
        mask_std) and the smudging noise (module docstring), exactly in the ring."""
        ring = self.ring
        fresh = self.opts.mask_std * self._stream.normal_np((layout.n_ct, ring.slots, 2))
        data = layout.pack(mask, ring.slots)
        used = layout.used(ring.slots)
        vals = np.where(used, np.stack([data.real, data.imag], axis=-1), fresh)
        smudge = self.smudge_sigma * self._stream.normal_np((layout.n_ct, ring.slots, 2))
        blobs = []
        for j in range(layout.n_ct):
            pt = ring.encode(vals[j, :, 0] + 1j * vals[j, :, 1], ring.out_level, self.scale)
            enc = self.encrypt_plaintext(pt)
            if outs[j] is None:
                out = enc
            else:
                out = outs[j]
                self.kernels.add_inplace(out, enc)
            noise = ring.encode(smudge[j, :, 0] + 1j * smudge[j, :, 1], ring.out_level, self.scale)
            self.kernels.add_plain_inplace(out, noise)
            blobs.append(self.io.dump(out))
        return frame(layout, blobs)

    def _guard(self, op: str, operand: np.ndarray) -> None:
        """Columns of the plaintext operand within 2^operand_norm_bits (module docstring)."""
        if operand.size == 0:
            return
        norms = np.sqrt((operand * operand).sum(axis=0))
        j = int(np.argmax(norms))
        if norms[j] <= self.operand_bound:
            return
        what = (
            f"the weight share multiplied into {self.sender}'s ciphertext"
            if op == "matmul"
            else f"the embedding h'_i multiplied into {self.sender}'s dL/dz"
        )
        raise Diverged(
            f"{what} ({operand.shape[0]}x{operand.shape[1]}) has a column of l2 norm above "
            f"2^{self.opts.operand_norm_bits} = {self.operand_bound:g} "
            "(exchange.params.operand_norm_bits): beyond it a product could pass the limit under "
            "which decryption is exact and the CKKS error the key owner's flooding covers; lower "
            "interactive.lr or training.lr, or raise operand_norm_bits",
            detail=f"column {j} has l2 norm {norms[j]:.4g}",
        )

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
        self._guard("matmul", w)
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
                self._guard("tmatmul", p)
                if ahead[1] == self._key("tmatmul", ahead[1][1], p):  # same blob: same layout
                    return self._finish(outs, ahead[2].out, mask)
        lin, cts = self._input(blob, shape)
        p = self._checked("tmatmul left factor", p, (r, a))
        mask = self._checked("tmatmul mask", mask, (a, m))
        self._guard("tmatmul", p)
        lmap, enc = self._map("tmatmul", lin, p)
        return self._finish(self.kernels.apply(cts, lmap, enc), lmap.out, mask)
