"""``ckks``: the two-party HE interactive layer (:mod:`securevfl.exchange.he`) with CKKS.

What it protects: W_i exists only as two additive shares (A's and P_i's); every
operand that crosses to the other party is a CKKS ciphertext under the key of
the party that produced it (P_i's h'_i, A's dL/dz) or a value the receiver may
learn plus a uniform mask. A learns z = sum_i h'_i W_i (the declared output); P_i
learns dL/dh'_i. Semi-honest parties; TenSEAL/SEAL at 128-bit security.

Packing (never one ciphertext per sample). A real matrix X (r x c) becomes
complex columns Z_k = X[:, 2k] + i X[:, 2k+1] (both halves of every CKKS slot
carry data), and each complex column is a block of ``bp`` slots (bp = a power of
two >= r), ``nb = slots / bp`` blocks per ciphertext. At N=8192 (4096 slots), a
256 x 64 batch fills 2 ciphertexts.

* ``matmul`` (Enc(X) W): the block index changes, the row offset does not, so
  the map is a sum of plaintext diagonals times rotations by multiples of ``bp``;
  a real-linear map on complex slots is ``sum a*rot(Z) + conj(sum conj(b)*rot(Z))``
  (one conjugation per output ciphertext).
* ``tmatmul`` (p^T Enc(Y)): a sum over the rows inside a block. Its output keeps
  the input's block stride and puts the a-vector of column l at chunk (l // nb)
  of block (l % nb), so every term is a rotation by i - alpha - chunk offset,
  the same for all blocks: r + a - 1 diagonals per input ciphertext.

Both run baby-step giant-step (rotations of the inputs shared by every output,
one rescale and giant rotation per group at the lower level). The plaintext
diagonals are encoded at scale q1 (the prime dropped by the rescale), so results
come back at exactly the input scale 2^global_scale_bits. One multiplicative
level is used: ``coeff_mod_bit_sizes = [q0, q1, special]``; fresh ciphertexts
hold (q0, q1), results only q0.

Wire format: one blob = a fixed header (magic, version, layout: rows, cols, nb,
bp, chunk, count) then length-prefixed SEAL ciphertexts (SEAL's own
serialization, validated against the context on load; never pickle). Fresh
ciphertexts are symmetric (secret-key) encryptions, which SEAL stores with a
seed for the uniform half: ~116 KB for 4096 complex slots at the defaults;
results hold one 60-bit prime: ~131 KB. The public context (public key and
power-of-two Galois keys, no secret and no relinearization key) is ~18 MB and
crosses once per party pair.

Circuit privacy and masks. Every result is re-randomized by adding a fresh
public-key encryption of the mask, which replaces the result's second component
with an RLWE sample the key owner cannot relate to the evaluator's plaintexts.
Masks are uniform in [-mask_bound, mask_bound] on the real and the imaginary
part of every slot of every result ciphertext (padding included; the caller's
mask fills the data positions, fresh ones the rest). The key owner decrypts
v + e + eps where e is the CKKS error (it depends on the evaluator's operands);
since eps is uniform over a cube of side 2 M in all N real coordinates, the
decryption is a function of v + e + eps and its statistical distance from the
same message with v', e' is at most (||v - v'||_1 + ||e - e'||_1) / (2 M).
Per entry of magnitude |v|, that is |v| / (2 M): 2^-19 |v| at the default
M = 2^18; e is ~1e-9 (measured), so its share is negligible. The hiding is
statistical and degrades linearly with |v| and with the number of entries.
The bound on M: results keep only q0, and decryption is exact while
sqrt(2) (M + |v|) 2^scale < q0 / 2, i.e. M + |v| < 2^(b0 - scale - 1.5)
(2^18.5 at the defaults; the default leaves room for |v| up to ~1e5); float64
decoding then adds an error ~M 2^-47.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import tenseal as ts
import tenseal.sealapi as sa
from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import Protocol
from securevfl.errors import CryptoParameterError, ProtocolError
from securevfl.exchange.he import HEKey, HEPeer, HEScheme, he_backend

# SEAL's HomomorphicEncryption.org table (native/src/seal/util/hestdparms.h):
# the largest total coefficient-modulus size that still gives 128-bit security.
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MAX_PRIME_BITS = 60
MIN_MASK_BOUND = 2.0**12

_MAGIC = b"SVCK"
_VERSION = 1
_HEADER = struct.Struct("<4sBIIIIII")  # magic, version, rows, cols, nb, bp, chunk, count
_LEN = struct.Struct("<I")


class CkksOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [60, 40, 60])
    global_scale_bits: int = Field(default=40, ge=20, le=MAX_PRIME_BITS)
    mask_bound: float = Field(default=2.0**18, gt=0)
    weight_init: Literal["private", "seeded"] = "private"


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _mask_limit(opts: CkksOptions) -> float:
    """Largest |value| a result slot (real or imaginary part) may hold so that
    decryption with the last prime q0 alone is exact (see the module docstring)."""
    return 2.0 ** (sum(opts.coeff_mod_bit_sizes[:-2]) - 1 - opts.global_scale_bits - 0.5)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Layout:
    """Where X[i, 2l] + i X[i, 2l+1] lives: block p = l % nb, group v = l // nb,
    ciphertext v // (bp // chunk), slot p*bp + (v % (bp // chunk))*chunk + i."""

    rows: int
    cols: int
    nb: int
    bp: int
    chunk: int

    @property
    def ncc(self) -> int:
        return (self.cols + 1) // 2

    @property
    def per_block(self) -> int:
        return self.bp // self.chunk

    @property
    def n_ct(self) -> int:
        groups = -(-self.ncc // self.nb)
        return -(-groups // self.per_block)

    def valid(self, slots: int) -> bool:
        def p2(x: int) -> bool:
            return x > 0 and x & (x - 1) == 0

        return (
            self.rows >= 1
            and self.cols >= 1
            and p2(self.nb)
            and p2(self.bp)
            and p2(self.chunk)
            and self.nb * self.bp == slots
            and self.chunk <= self.bp
            and self.rows <= self.chunk
        )

    def bases(self) -> tuple[np.ndarray, np.ndarray]:
        """Per complex column: ciphertext index and the slot of row 0."""
        lc = np.arange(self.ncc)
        v = lc // self.nb
        return v // self.per_block, (lc % self.nb) * self.bp + (v % self.per_block) * self.chunk

    def pack(self, x: np.ndarray, slots: int) -> np.ndarray:
        z = np.zeros((self.rows, 2 * self.ncc))
        z[:, : self.cols] = x
        ct, base = self.bases()
        out = np.zeros((self.n_ct, slots), dtype=np.complex128)
        out[ct[None, :], base[None, :] + np.arange(self.rows)[:, None]] = z[:, 0::2] + 1j * z[:, 1::2]
        return out

    def unpack(self, arr: np.ndarray) -> np.ndarray:
        ct, base = self.bases()
        z = arr[ct[None, :], base[None, :] + np.arange(self.rows)[:, None]]
        x = np.empty((self.rows, 2 * self.ncc))
        x[:, 0::2], x[:, 1::2] = z.real, z.imag
        return x[:, : self.cols]

    def used(self, slots: int) -> np.ndarray:
        """Boolean (n_ct, slots x 2): which real coordinates hold data."""
        m = np.zeros((self.n_ct, slots, 2), dtype=bool)
        ct, base = self.bases()
        idx = (ct[None, :], base[None, :] + np.arange(self.rows)[:, None])
        m[idx + (0,)] = True
        odd = np.arange(self.ncc) < self.cols // 2
        m[(idx[0][:, odd], idx[1][:, odd], 1)] = True
        return m


def _standard(rows: int, cols: int, slots: int) -> _Layout:
    """Blocks of the smallest power of two >= rows, spread so the columns fill
    each ciphertext evenly (fewer distinct rotations)."""
    if not 1 <= rows <= slots or cols < 1:
        raise ValueError(f"ckks: a {rows}x{cols} matrix does not fit blocks of {slots} slots")
    ncc = (cols + 1) // 2
    cap = slots // _pow2(rows)
    n_ct = -(-ncc // cap)
    nb = _pow2(-(-ncc // n_ct))
    bp = slots // nb
    return _Layout(rows, cols, nb, bp, bp)


# --------------------------------------------------------------------------- SEAL I/O


class _Seal:
    """SEAL objects <-> bytes. The SEAL bindings only (de)serialize through a
    path, so this goes through one file in a private temporary directory."""

    def __init__(self, sc: Any):
        self.sc = sc
        self.encoder = sa.CKKSEncoder(sc)
        self.slots = self.encoder.slot_count()
        self._dir = tempfile.TemporaryDirectory(prefix="securevfl-ckks-")
        self._path = os.path.join(self._dir.name, "obj")
        self._lock = threading.Lock()
        data = sc.first_context_data()
        levels = []
        while data is not None:
            levels.append(data)
            data = data.next_context_data()
        # levels[0]: every data prime (fresh ciphertexts); levels[1]: after the rescale (results)
        self.in_level = levels[0].parms_id()
        self.out_level = levels[1].parms_id()
        self.q1 = float(levels[0].parms().coeff_modulus()[-1].value())
        n_mod = len(levels[0].parms().coeff_modulus())
        self.max_ct_bytes = 2 * n_mod * self.slots * 2 * 8 + 4096

    def dump(self, obj: Any) -> bytes:
        with self._lock:
            obj.save(self._path)
            with open(self._path, "rb") as f:
                return f.read()

    def load(self, data: bytes) -> Any:
        with self._lock:
            with open(self._path, "wb") as f:
                f.write(data)
            ct = sa.Ciphertext()
            ct.load(self.sc, self._path)
            return ct

    def encode(self, values: np.ndarray, parms_id: Any, scale: float) -> Any:
        pt = sa.Plaintext()
        if np.iscomplexobj(values):
            self.encoder.encode(values.tolist(), parms_id, scale, pt)
        else:
            self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), parms_id, scale, pt)
        return pt


def _frame(layout: _Layout, cts: list[bytes]) -> bytes:
    head = _HEADER.pack(_MAGIC, _VERSION, layout.rows, layout.cols, layout.nb, layout.bp, layout.chunk, len(cts))
    return b"".join([head, *(_LEN.pack(len(c)) + c for c in cts)])


def _unframe(blob: bytes, seal: _Seal, what: str) -> tuple[_Layout, list[Any]]:
    """Parse and validate a blob; raises ValueError with the reason."""
    if not isinstance(blob, bytes | bytearray) or len(blob) < _HEADER.size:
        raise ValueError(f"{what}: too short for a ckks blob")
    magic, version, rows, cols, nb, bp, chunk, count = _HEADER.unpack_from(blob, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"{what}: not a ckks blob (bad magic or version)")
    layout = _Layout(rows, cols, nb, bp, chunk)
    if not layout.valid(seal.slots) or count != layout.n_ct:
        raise ValueError(f"{what}: inconsistent layout {layout} with {count} ciphertexts")
    off, raw = _HEADER.size, []
    for _ in range(count):
        if off + _LEN.size > len(blob):
            raise ValueError(f"{what}: truncated")
        (n,) = _LEN.unpack_from(blob, off)
        off += _LEN.size
        if n > seal.max_ct_bytes or off + n > len(blob):
            raise ValueError(f"{what}: ciphertext length {n} out of range")
        raw.append(bytes(blob[off : off + n]))
        off += n
    if off != len(blob):
        raise ValueError(f"{what}: {len(blob) - off} trailing bytes")
    cts = []
    for r in raw:
        try:
            cts.append(seal.load(r))
        except Exception as exc:  # SEAL raises std exceptions (ValueError/RuntimeError/...)
            raise ValueError(f"{what}: invalid SEAL ciphertext ({exc})") from None
    return layout, cts


def _check_level(cts: list[Any], parms_id: Any, scale: float, what: str) -> None:
    for c in cts:
        if c.size() != 2 or list(c.parms_id()) != list(parms_id) or c.scale != scale:
            raise ValueError(f"{what}: ciphertext at an unexpected level, size or scale")


# --------------------------------------------------------------------------- key owner


def _context(opts: CkksOptions) -> ts.Context:
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=opts.poly_modulus_degree,
        coeff_mod_bit_sizes=list(opts.coeff_mod_bit_sizes),
        n_threads=1,
    )
    ctx.global_scale = 2.0**opts.global_scale_bits
    return ctx


class CkksKey(HEKey):
    def __init__(self, opts: CkksOptions):
        self.opts = opts
        self.ctx = _context(opts)
        self.ctx.generate_galois_keys()
        self.seal = _Seal(self.ctx.seal_context().data)
        sc = self.seal.sc
        self.scale = 2.0**opts.global_scale_bits
        self._encryptor = sa.Encryptor(sc, self.ctx.public_key().data, self.ctx.secret_key().data)
        self._decryptor = sa.Decryptor(sc, self.ctx.secret_key().data)

    def public(self) -> bytes:
        pub = self.ctx.copy()
        pub.make_context_public()
        return pub.serialize(
            save_public_key=True, save_secret_key=False, save_galois_keys=True, save_relin_keys=False
        )

    def encrypt(self, x: np.ndarray) -> bytes:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise ValueError("ckks encrypt: expects a finite 2-D matrix")
        layout = _standard(x.shape[0], x.shape[1], self.seal.slots)
        cts = []
        for row in layout.pack(x, self.seal.slots):
            pt = self.seal.encode(row, self.seal.in_level, self.scale)
            cts.append(self.seal.dump(self._encryptor.encrypt_symmetric(pt)))  # seeded: half size
        return _frame(layout, cts)

    def decrypt(self, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        what = "ckks result from the peer"
        try:
            layout, cts = _unframe(blob, self.seal, what)
            if (layout.rows, layout.cols) != tuple(shape):
                raise ValueError(f"{what}: holds a {layout.rows}x{layout.cols} matrix, expected {shape}")
            _check_level(cts, self.seal.out_level, self.scale, what)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        arr = np.empty((len(cts), self.seal.slots), dtype=np.complex128)
        pt = sa.Plaintext()
        for j, c in enumerate(cts):
            self._decryptor.decrypt(c, pt)
            arr[j] = np.asarray(self.seal.encoder.decode_complex(pt))
        return layout.unpack(arr)


# --------------------------------------------------------------------------- evaluator

# Rough relative costs (ms at N=8192) to pick the baby-step size.
_C_ROT_TOP, _C_ROT_LOW, _C_RESCALE = 2.7, 1.0, 0.65


def _signed(k: int, slots: int) -> int:
    k %= slots
    return k - slots if k > slots // 2 else k


def _naf_weight(k: int) -> int:
    """Key switchings SEAL needs for a rotation by k with power-of-two keys."""
    k, w = abs(k), 0
    while k:
        if k & 1:
            digit = 2 - (k & 3)  # +1 or -1 (non-adjacent form)
            k -= digit
            w += 1
        k >>= 1
    return w


@dataclass
class _Groups:
    """A linear map from input ciphertexts to output ciphertexts as groups
    (t, s, delta): out_s += diag * rot(in_t, delta) (+ conj part)."""

    t: np.ndarray
    s: np.ndarray
    delta: np.ndarray  # mod slots
    diag: Callable[[int], tuple[np.ndarray, np.ndarray | None]]  # group -> (a, b or None)
    conj: bool


@functools.lru_cache(maxsize=16)
def _naf_table(slots: int, step: int) -> np.ndarray:
    return np.array([_naf_weight(_signed(k * step, slots)) for k in range(slots // step)])


def _plan(g: _Groups, slots: int) -> tuple[int, int]:
    """Common step and baby-step count minimising the estimated rotation cost."""
    step = math.gcd(slots, *np.unique(g.delta).tolist())
    d = g.delta // step
    naf = _naf_table(slots, step)
    k = 2 if g.conj else 1
    best: tuple[float, int] | None = None
    for n1 in range(1, min(int(d.max()) + 1, 128) + 1):
        d1, d2 = d % n1, d // n1
        baby = np.unique(g.t * slots + d1) % slots
        giant = np.unique(g.s * slots + d2) % slots
        cost = _C_ROT_TOP * naf[baby].sum() + k * (
            _C_RESCALE * len(giant) + _C_ROT_LOW * naf[(giant * n1) % (slots // step)].sum()
        )
        if best is None or cost < best[0]:
            best = (cost, n1)
    assert best is not None
    return step, best[1]


class CkksPeer(HEPeer):
    def __init__(self, opts: CkksOptions, public: bytes, sender: str):
        self.opts, self.sender = opts, sender
        try:
            ctx = ts.context_from(bytes(public), n_threads=1)
        except Exception as exc:
            raise ProtocolError(f"{sender}: malformed CKKS public context ({exc})") from None
        if ctx.has_secret_key() or ctx.is_private():
            raise ProtocolError(f"{sender}: its CKKS public context carries a secret key; refused")
        if not ctx.has_public_key() or not ctx.has_galois_keys():
            raise ProtocolError(f"{sender}: CKKS public context without public or Galois keys")
        sc = ctx.seal_context().data
        parms = sc.key_context_data().parms()
        bits = [m.bit_count() for m in parms.coeff_modulus()]
        if parms.poly_modulus_degree() != opts.poly_modulus_degree or bits != list(opts.coeff_mod_bit_sizes):
            raise ProtocolError(
                f"{sender}: CKKS context with N={parms.poly_modulus_degree()}, primes {bits}; "
                f"the protocol says N={opts.poly_modulus_degree}, {list(opts.coeff_mod_bit_sizes)}"
            )
        self._ctx = ctx  # keeps the SEAL objects alive
        self.seal = _Seal(sc)
        self.scale = 2.0**opts.global_scale_bits
        self._ev = sa.Evaluator(sc)
        self._gk = ctx.galois_keys().data
        self._encryptor = sa.Encryptor(sc, ctx.public_key().data)

    # -- helpers
    def _input(self, blob: bytes, shape: tuple[int, int]) -> tuple[_Layout, list[Any]]:
        what = f"{self.sender}: ckks ciphertext"
        try:
            layout, cts = _unframe(blob, self.seal, what)
            if layout != _standard(shape[0], shape[1], self.seal.slots):
                raise ValueError(f"{what}: layout {layout} does not match a {shape[0]}x{shape[1]} matrix")
            _check_level(cts, self.seal.in_level, self.scale, what)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        return layout, cts

    def _rot(self, ct: Any, k: int) -> Any:
        k = _signed(k, self.seal.slots)
        if k == 0:
            return ct
        out = sa.Ciphertext()
        self._ev.rotate_vector(ct, k, self._gk, out)
        return out

    def _apply(self, cts: list[Any], g: _Groups, n_out: int) -> list[Any]:
        """out_s = sum over groups of diag_a * rot(in_t, delta), plus
        conj(sum conj(diag_b) * rot(in_t, delta)), by baby-step giant-step."""
        seal, ev, slots = self.seal, self._ev, self.seal.slots
        step, n1 = _plan(g, slots)
        d = g.delta // step
        d1, d2 = d % n1, d // n1
        baby: dict[tuple[int, int], Any] = {}
        for t, a in sorted({(int(t), int(a)) for t, a in zip(g.t, d1, strict=True)}):
            baby[(t, a)] = self._rot(cts[t], a * step)
        outs: list[list[Any]] = [[] for _ in range(n_out)]
        conj_outs: list[list[Any]] = [[] for _ in range(n_out)]
        order = np.lexsort((d2, g.s))
        keys = np.stack([g.s[order], d2[order]], axis=1)
        starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
        ends = np.r_[starts[1:], len(order)]
        for lo, hi in zip(starts, ends, strict=True):
            s, b = int(keys[lo, 0]), int(keys[lo, 1])
            shift = b * n1 * step
            acc: list[Any | None] = [None, None]
            for gi in order[lo:hi]:
                src = baby[(int(g.t[gi]), int(d1[gi]))]
                diags = g.diag(int(gi))
                for j, dg in enumerate(diags):
                    if dg is None:
                        continue
                    dg = np.roll(dg if j == 0 else np.conj(dg), shift)
                    if not dg.any():
                        continue
                    pt = seal.encode(dg if np.iscomplexobj(dg) and dg.imag.any() else dg.real, seal.in_level, seal.q1)
                    prod = sa.Ciphertext()
                    ev.multiply_plain(src, pt, prod)
                    if acc[j] is None:
                        acc[j] = prod
                    else:
                        ev.add_inplace(acc[j], prod)
            for j, a in enumerate(acc):
                if a is None:
                    continue
                ev.rescale_to_next_inplace(a)
                a.scale = self.scale
                (outs if j == 0 else conj_outs)[s].append(self._rot(a, shift))
        result = []
        for s in range(n_out):
            parts = outs[s]
            if conj_outs[s]:
                c = self._sum(conj_outs[s])
                ev.complex_conjugate_inplace(c, self._gk)
                parts = [*parts, c]
            result.append(self._sum(parts) if parts else None)
        return result

    def _sum(self, parts: list[Any]) -> Any:
        acc = parts[0]
        for p in parts[1:]:
            self._ev.add_inplace(acc, p)
        return acc

    def _finish(self, outs: list[Any], layout: _Layout, mask: np.ndarray) -> bytes:
        """Add a fresh public-key encryption of the mask to every result (re-randomizes
        it); data positions get the caller's mask, all others fresh uniform masks."""
        seal, m = self.seal, self.opts.mask_bound
        rng = np.random.default_rng(secrets.randbits(128))
        fresh = rng.uniform(-m, m, size=(layout.n_ct, seal.slots, 2))
        data = layout.pack(mask, seal.slots)
        used = layout.used(seal.slots)
        vals = np.where(used, np.stack([data.real, data.imag], axis=-1), fresh)
        blobs = []
        for j in range(layout.n_ct):
            pt = seal.encode(vals[j, :, 0] + 1j * vals[j, :, 1], seal.out_level, self.scale)
            enc = sa.Ciphertext()
            self._encryptor.encrypt(pt, enc)
            if outs[j] is None:
                out = enc
            else:
                out = outs[j]
                self._ev.add_inplace(out, enc)
            blobs.append(seal.dump(out))
        return _frame(layout, blobs)

    def _checked(self, name: str, a: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        if a.shape != shape or not np.isfinite(a).all():
            raise ValueError(f"ckks {name}: expected a finite {shape} matrix, got {a.shape}")
        return a

    # -- the two operations
    def matmul(self, blob: bytes, shape: tuple[int, int], w: np.ndarray, mask: np.ndarray) -> bytes:
        r, c = shape
        lin, cts = self._input(blob, shape)
        m = np.asarray(w).shape[1] if np.ndim(w) == 2 else -1
        w = self._checked("matmul weight", w, (c, m))
        mask = self._checked("matmul mask", mask, (r, m))
        lout = _standard(r, m, self.seal.slots)
        wp = np.zeros((2 * lin.ncc, 2 * lout.ncc))
        wp[:c, :m] = w
        u, v, u2, v2 = wp[0::2, 0::2], wp[1::2, 0::2], wp[0::2, 1::2], wp[1::2, 1::2]
        coef_a = (u + v2 + 1j * (u2 - v)) / 2
        coef_b = (u - v2 + 1j * (u2 + v)) / 2
        t_in, b_in = lin.bases()
        s_out, b_out = lout.bases()
        k_idx, l_idx = np.meshgrid(np.arange(lin.ncc), np.arange(lout.ncc), indexing="ij")
        k_idx, l_idx = k_idx.ravel(), l_idx.ravel()
        slots = self.seal.slots
        delta = (b_in[k_idx] - b_out[l_idx]) % slots
        key = (t_in[k_idx] * lout.n_ct + s_out[l_idx]) * slots + delta
        uniq, inv = np.unique(key, return_inverse=True)
        members = [np.flatnonzero(inv == gi) for gi in range(len(uniq))]
        rows = np.arange(r)

        def diag(gi: int) -> tuple[np.ndarray, np.ndarray]:
            ks, ls = k_idx[members[gi]], l_idx[members[gi]]
            pos = (b_out[ls][:, None] + rows[None, :]).ravel()
            da = np.zeros(slots, dtype=np.complex128)
            db = np.zeros(slots, dtype=np.complex128)
            da[pos] = np.repeat(coef_a[ks, ls], r)
            db[pos] = np.repeat(coef_b[ks, ls], r)
            return da, db

        groups = _Groups(
            t=uniq // slots // lout.n_ct, s=uniq // slots % lout.n_ct, delta=uniq % slots, diag=diag, conj=True
        )
        return self._finish(self._apply(cts, groups, lout.n_ct), lout, mask)

    def tmatmul(self, p: np.ndarray, blob: bytes, shape: tuple[int, int], mask: np.ndarray) -> bytes:
        r, m = shape
        lin, cts = self._input(blob, shape)
        a = np.asarray(p).shape[1] if np.ndim(p) == 2 else -1
        p = self._checked("tmatmul left factor", p, (r, a))
        mask = self._checked("tmatmul mask", mask, (a, m))
        slots = self.seal.slots
        big_a, t2 = _pow2(a), _pow2(lin.n_ct)
        n_part, stride, length = 1, 0, r
        if big_a <= lin.bp:
            # keep the input's block stride, a-vectors of column group t in chunk t: the
            # shift of term (i, alpha) is i - alpha - t*A, the same in every block
            lout = _Layout(a, m, lin.nb, lin.bp, big_a)
            if t2 * big_a <= lin.bp:
                # spare chunks: split the rows into n_part slices summed into chunks
                # t + h*t2 and folded at the end; the slices share their diagonals
                stride = t2 * big_a
                n_part = _pow2(-(-r // stride))
                length = stride if n_part > 1 else r
        else:
            lout = _standard(a, m, slots)
        t_in, b_in = lin.bases()
        s_out, b_out = lout.bases()
        # columns with the same (t, s, base offset) share every diagonal
        cls_key = np.stack([t_in, s_out, (b_in - b_out) % slots], axis=1)
        cls, cls_inv = np.unique(cls_key, axis=0, return_inverse=True)
        cls_inv = cls_inv.ravel()
        offs = np.arange(-(a - 1), length)  # e = i - alpha within a slice
        gt = np.repeat(cls[:, 0], len(offs))
        gs = np.repeat(cls[:, 1], len(offs))
        gd = (np.repeat(cls[:, 2], len(offs)) + np.tile(offs, len(cls))) % slots
        cols_of = [np.flatnonzero(cls_inv == ci) for ci in range(len(cls))]

        def diag(gi: int) -> tuple[np.ndarray, None]:
            ci, k = divmod(gi, len(offs))
            e = int(offs[k])
            dg = np.zeros(slots)
            for h in range(n_part):
                top = min(a, length - e, r - h * length - e)
                alpha = np.arange(max(0, -e), top)
                if len(alpha) == 0:
                    continue
                vals = p[h * length + alpha + e, alpha]
                pos = (b_out[cols_of[ci]][:, None] + h * stride + alpha[None, :]).ravel()
                dg[pos] = np.tile(vals, len(cols_of[ci]))
            return dg, None

        groups = _Groups(t=gt, s=gs, delta=gd, diag=diag, conj=False)
        outs = self._apply(cts, groups, lout.n_ct)
        if n_part > 1 and outs[0] is not None:
            h = n_part // 2
            while h >= 1:  # chunk t += chunk t + h*t2; garbage lands only in spare chunks
                self._ev.add_inplace(outs[0], self._rot(outs[0], h * stride))
                h //= 2
        return self._finish(outs, lout, mask)


# --------------------------------------------------------------------------- scheme


class CkksScheme(HEScheme):
    options = CkksOptions

    def __init__(self, options: BaseModel):
        assert isinstance(options, CkksOptions)
        super().__init__(options)
        self.opts: CkksOptions = options

    def new_key(self) -> CkksKey:
        return CkksKey(self.opts)

    def peer(self, public: bytes, *, sender: str) -> CkksPeer:
        return CkksPeer(self.opts, public, sender)

    def mask(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        m = self.opts.mask_bound
        return rng.uniform(-m, m, size=shape)

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, CkksOptions)
        n, bits = options.poly_modulus_degree, list(options.coeff_mod_bit_sizes)

        def refuse(msg: str, field: str) -> CryptoParameterError:
            return CryptoParameterError(msg, path=f"exchange.params.{field}")

        if n not in MAX_BITS_128:
            raise refuse(
                f"poly_modulus_degree {n} is not one of {sorted(MAX_BITS_128)} "
                "(powers of two with a 128-bit security bound)",
                "poly_modulus_degree",
            )
        if len(bits) < 3:
            raise refuse(
                f"coeff_mod_bit_sizes {bits}: need [q0, q1, special] (one rescale level plus the "
                "key-switching prime)",
                "coeff_mod_bit_sizes",
            )
        if any(b > MAX_PRIME_BITS or b < 1 for b in bits):
            bad = [b for b in bits if b > MAX_PRIME_BITS or b < 1]
            raise refuse(
                f"coeff_mod_bit_sizes {bits}: primes of {bad} bits; each prime must have 1 to "
                f"{MAX_PRIME_BITS} bits",
                "coeff_mod_bit_sizes",
            )
        if sum(bits) > MAX_BITS_128[n]:
            raise refuse(
                f"sum of coefficient moduli {sum(bits)} bits exceeds {MAX_BITS_128[n]}, the "
                f"128-bit security limit for N={n}",
                "coeff_mod_bit_sizes",
            )
        limit = _mask_limit(options)
        if options.mask_bound > limit / 2:
            raise refuse(
                f"mask_bound {options.mask_bound:g} overflows the last prime: with a {bits[0]}-bit q0 "
                f"and scale 2^{options.global_scale_bits}, masked values must stay below {limit:g} "
                f"(half of it for the mask); use at most {limit / 2:g} or a smaller global_scale_bits",
                "mask_bound",
            )
        if options.mask_bound < MIN_MASK_BOUND:
            raise refuse(
                f"mask_bound {options.mask_bound:g} is below {MIN_MASK_BOUND:g}: a uniform mask of "
                "bound M hides a value v only up to statistical distance |v|/(2M) per entry",
                "mask_bound",
            )
        slots = n // 2
        if proto.training.batch_size > slots:
            raise CryptoParameterError(
                f"batch_size {proto.training.batch_size} exceeds the {slots} CKKS slots of "
                f"N={n} (a batch is packed along the slots); use a larger poly_modulus_degree "
                "or a smaller batch",
                path="training.batch_size",
            )

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, CkksOptions)
        return {
            "slots": options.poly_modulus_degree // 2,
            "security_bits": 128,
            "coeff_modulus_bits": sum(options.coeff_mod_bit_sizes),
            "max_coeff_modulus_bits": MAX_BITS_128.get(options.poly_modulus_degree),
            "mask_statistical_distance_per_unit_entry": 1.0 / (2.0 * options.mask_bound),
        }


Ckks = he_backend(
    "ckks",
    CkksScheme,
    "CKKS (TenSEAL) two-party interactive layer: batch-packed ciphertexts, shares of W_i, masked openings",
)
