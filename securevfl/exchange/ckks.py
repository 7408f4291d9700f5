"""``ckks``: the two-party HE interactive layer (:mod:`securevfl.exchange.he`) with CKKS.

What it protects: W_i exists only as two additive shares (A's and P_i's); every
operand that crosses to the other party is a CKKS ciphertext under the key of
the party that produced it (P_i's h'_i, A's dL/dz) or a value the receiver may
learn plus a uniform mask. A learns z = sum_i h'_i W_i (the declared output); P_i
learns dL/dh'_i. Semi-honest parties; TenSEAL/SEAL with 128-bit parameters.

Packing: across the batch, never one ciphertext per sample. A real matrix X
(r x c) becomes complex columns Z_l = X[:, 2l] + i X[:, 2l+1] (both halves of a
CKKS slot carry data); each complex column is a block of ``bp`` slots (bp a
power of two >= r, spread so the columns fill the ciphertexts evenly). At
N=8192 (4096 complex slots) a 256 x 64 batch is 2 ciphertexts, 64 x 64 is one.

* ``matmul`` (Enc(X) W): the block index changes, the row offset does not, so the
  map is a sum of plaintext diagonals times rotations by multiples of ``bp``; a
  real-linear map on complex slots is ``sum a rot(Z) + conj(sum conj(b) rot(Z))``
  (one conjugation per output ciphertext).
* ``tmatmul`` (p^T Enc(Y)): sums over the rows inside a block. The output keeps
  the input's block stride and puts the a-vector of column group t in chunk t of
  every block, so a term (i, alpha) is a rotation by i - alpha - t*A, the same
  in all blocks; spare chunks take row slices that share their diagonals and
  are folded at the end (B=256, d=o=64: 2 x 191 diagonals, one output ciphertext).

Both run baby-step giant-step (baby rotations of each input shared by every
output; one rescale, then the giant rotation, per group at the lower level).
The diagonals are encoded at scale q1, the prime the rescale drops, so results
come back at exactly the input scale 2^global_scale_bits. One multiplicative
level: ``coeff_mod_bit_sizes = [output primes..., q1, special]``. Fresh
ciphertexts hold every data prime, results the output primes only.

Defaults [47, 47, 40, 60], scale 2^60 (194 of the 218 bits allowed at N=8192).
Data primes well below the 60-bit special prime keep key-switching noise small
(with a 60-bit data prime it alone costs ~1e-6); scale 2^60 makes the CKKS
error, which grows with the plaintext operand (the weight shares), smaller than
float64's own rounding of the values involved: the measured error is ~4e-9 at
unit scale, ~|v + mask| 2^-50 beyond.

Wire format: one blob = a fixed header (magic, version, layout: rows, cols, nb,
bp, chunk, count) then length-prefixed SEAL ciphertexts (SEAL's serialization,
checked against the context on load; never pickle). Fresh ciphertexts are
symmetric (secret-key) encryptions, stored with a seed for their uniform half:
~160 KB per ciphertext; results (two 47-bit primes) ~222 KB. The public part
(TenSEAL context made public: parameters and public key, no secret or
relinearization key; plus power-of-two rotation and conjugation keys, seeded)
is ~17 MB and crosses once per party pair.

Circuit privacy and masks. Every result is re-randomized by adding a fresh
public-key encryption of the mask, which replaces the result's second component
with an RLWE sample the key owner cannot relate to the evaluator's plaintexts.
Masks are uniform in [-mask_bound, mask_bound] on the real and the imaginary
part of every slot of every result ciphertext (padding and spare chunks
included; the caller's mask fills the data positions, fresh ones the rest). The
key owner decrypts v + e + eps where e is the CKKS error (it depends on the
evaluator's operands); eps is uniform on a cube of side 2 M in all N real
coordinates, so the decryption, a function of v + e + eps, is within
statistical distance (||v - v'||_1 + ||e - e'||_1) / (2 M) of the one for
v', e'. Per entry: |v| / (2 M) = 2^-23 |v| at the default M = 2^22; e ~ 1e-9
adds nothing visible. The hiding is statistical and degrades linearly with |v|
and the number of entries. M is bounded by exact decryption on the output
primes, sqrt(2) (M + |v|) 2^scale < q_out / 2 (check() keeps M below half of
that: 2^31.5 at the defaults), and by float64 decoding, whose error ~M 2^-50
(4e-9 at 2^22) should stay below float32's resolution of the values trained.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
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
from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import Protocol
from securevfl.errors import ConfigError, CryptoParameterError, ProtocolError
from securevfl.exchange.he import BOTH_OPS, HEKey, HEPeer, HEScheme, he_backend


class _Lazy:
    """TenSEAL is an optional dependency (the ``crypto`` extra): import it on first use."""

    def __init__(self, name: str):
        self._name = name
        self._mod: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._mod is None:
            self._mod = importlib.import_module(self._name)
        return getattr(self._mod, attr)


ts: Any = _Lazy("tenseal")
sa: Any = _Lazy("tenseal.sealapi")

# SEAL's HomomorphicEncryption.org table (native/src/seal/util/hestdparms.h):
# the largest total coefficient-modulus size that still gives 128-bit security.
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MAX_PRIME_BITS = 60
MIN_MASK_BOUND = 2.0**12

_MAGIC = b"SVCK"
_PUB_MAGIC = b"SVCP"
_VERSION = 1
_HEADER = struct.Struct("<4sBIIIIII")  # magic, version, rows, cols, nb, bp, chunk, count
_PUB_HEADER = struct.Struct("<4sBQQ")  # magic, version, context length, Galois keys length
_LEN = struct.Struct("<I")


class CkksOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [47, 47, 40, 60])
    global_scale_bits: int = Field(default=60, ge=20, le=MAX_PRIME_BITS)
    mask_bound: float = Field(default=2.0**22, gt=0)
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
    """Where the complex entry X[i, 2l] + i X[i, 2l+1] lives. Rows are cut in row
    chunks of ``chunk`` (c = i // chunk); complex columns in groups of ``nb``
    (block p = l % nb, group v = l // nb); unit u = c * groups + v goes to
    ciphertext u // (bp // chunk), slot p*bp + (u % (bp // chunk))*chunk + i % chunk.
    With chunk = bp >= rows this is one column per block, groups in ciphertexts."""

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
    def groups(self) -> int:
        return -(-self.ncc // self.nb)

    @property
    def row_chunks(self) -> int:
        return -(-self.rows // self.chunk)

    @property
    def n_ct(self) -> int:
        return -(-(self.row_chunks * self.groups) // self.per_block)

    def valid(self, slots: int) -> bool:
        def p2(x: int) -> bool:
            return x > 0 and x & (x - 1) == 0

        return (
            1 <= self.rows <= 1 << 24
            and 1 <= self.cols <= 1 << 24
            and p2(self.nb)
            and p2(self.bp)
            and p2(self.chunk)
            and self.nb * self.bp == slots
            and self.chunk <= self.bp
            and self.n_ct <= 1 << 16
        )

    def bases(self) -> tuple[np.ndarray, np.ndarray]:
        """(row chunk, complex column) -> ciphertext index and slot of its first row."""
        lc = np.arange(self.ncc)[None, :]
        u = np.arange(self.row_chunks)[:, None] * self.groups + lc // self.nb
        return u // self.per_block, (lc % self.nb) * self.bp + (u % self.per_block) * self.chunk

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, ncc) arrays: ciphertext and slot of every complex entry."""
        ct, base = self.bases()
        i = np.arange(self.rows)
        return ct[i // self.chunk], base[i // self.chunk] + (i % self.chunk)[:, None]

    def pack(self, x: np.ndarray, slots: int) -> np.ndarray:
        z = np.zeros((self.rows, 2 * self.ncc))
        z[:, : self.cols] = x
        out = np.zeros((self.n_ct, slots), dtype=np.complex128)
        out[self._index()] = z[:, 0::2] + 1j * z[:, 1::2]
        return out

    def unpack(self, arr: np.ndarray) -> np.ndarray:
        z = arr[self._index()]
        x = np.empty((self.rows, 2 * self.ncc))
        x[:, 0::2], x[:, 1::2] = z.real, z.imag
        return x[:, : self.cols]

    def used(self, slots: int) -> np.ndarray:
        """Boolean (n_ct, slots, 2): which real coordinates hold data."""
        m = np.zeros((self.n_ct, slots, 2), dtype=bool)
        ct, slot = self._index()
        m[ct, slot, 0] = True
        odd = np.arange(self.ncc) < self.cols // 2
        m[ct[:, odd], slot[:, odd], 1] = True
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
        self.costs = _costs(n_mod, len(levels[1].parms().coeff_modulus()))
        self.max_ct_bytes = 2 * n_mod * self.slots * 2 * 8 + 4096

    def dump(self, obj: Any) -> bytes:
        with self._lock:
            obj.save(self._path)
            with open(self._path, "rb") as f:
                return f.read()

    def load(self, data: bytes, obj: Any = None) -> Any:
        """Load a SEAL object (a ciphertext unless ``obj`` is given); SEAL checks
        it against the context and raises on anything malformed."""
        obj = sa.Ciphertext() if obj is None else obj
        with self._lock:
            with open(self._path, "wb") as f:
                f.write(data)
            obj.load(self.sc, self._path)
            return obj

    def encode(self, values: np.ndarray, parms_id: Any, scale: float) -> Any:
        pt = sa.Plaintext()
        if np.iscomplexobj(values):
            self.encoder.encode(values.tolist(), parms_id, scale, pt)
        else:
            self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), parms_id, scale, pt)
        return pt


def _frame(layout: _Layout, cts: list[bytes]) -> bytes:
    head = _HEADER.pack(
        _MAGIC, _VERSION, layout.rows, layout.cols, layout.nb, layout.bp, layout.chunk, len(cts)
    )
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


def _check_level(cts: list[Any], levels: list[Any], scale: float, what: str) -> None:
    allowed = [list(p) for p in levels]
    for c in cts:
        if c.size() != 2 or not c.is_ntt_form() or list(c.parms_id()) not in allowed or c.scale != scale:
            raise ValueError(f"{what}: ciphertext at an unexpected level, size or scale")


# --------------------------------------------------------------------------- key owner


def _context(opts: CkksOptions) -> Any:
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
        self.seal = _Seal(self.ctx.seal_context().data)
        self._public: bytes | None = None
        sc = self.seal.sc
        self.scale = 2.0**opts.global_scale_bits
        self._encryptor = sa.Encryptor(sc, self.ctx.public_key().data, self.ctx.secret_key().data)
        self._decryptor = sa.Decryptor(sc, self.ctx.secret_key().data)

    def public(self) -> bytes:
        """The TenSEAL context made public (parameters and public key; no secret or
        relinearization key) and power-of-two rotation plus conjugation keys, which
        SEAL serializes with a seed for their uniform halves (half the size of
        TenSEAL's own Galois-key serialization)."""
        if self._public is None:
            pub = self.ctx.copy()
            pub.make_context_public()
            ctx_bytes = pub.serialize(
                save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
            )
            keygen = sa.KeyGenerator(self.seal.sc, self.ctx.secret_key().data)
            gk = self.seal.dump(keygen.create_galois_keys())
            self._public = _PUB_HEADER.pack(_PUB_MAGIC, _VERSION, len(ctx_bytes), len(gk)) + ctx_bytes + gk
        return self._public

    def encrypt(self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS) -> bytes:
        # one packing serves both operations
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
            _check_level(cts, [self.seal.out_level, self.seal.in_level], self.scale, what)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        arr = np.empty((len(cts), self.seal.slots), dtype=np.complex128)
        pt = sa.Plaintext()
        for j, c in enumerate(cts):
            self._decryptor.decrypt(c, pt)
            arr[j] = np.asarray(self.seal.encoder.decode_complex(pt))
        return layout.unpack(arr)


# --------------------------------------------------------------------------- evaluator


# Relative costs used to pick the baby-step size: one key switching at a level of
# L primes ~ L (L + 1), a rescale ~ L (measured ratios at N=8192).
def _costs(n_in: int, n_out: int) -> tuple[float, float, float]:
    return n_in * (n_in + 1), n_out * (n_out + 1), 0.7 * n_in


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


def _plan(g: _Groups, slots: int, costs: tuple[float, float, float]) -> tuple[int, int]:
    """Common step and baby-step count minimising the estimated rotation cost."""
    c_top, c_low, c_rescale = costs
    step = math.gcd(slots, *np.unique(g.delta).tolist())
    d = g.delta // step
    naf = _naf_table(slots, step)
    k = 2 if g.conj else 1
    best: tuple[float, int] | None = None
    for n1 in range(1, min(int(d.max()) + 1, 128) + 1):
        d1, d2 = d % n1, d // n1
        baby = np.unique(g.t * slots + d1) % slots
        giant = np.unique(g.s * slots + d2) % slots
        cost = c_top * naf[baby].sum() + k * (
            c_rescale * len(giant) + c_low * naf[(giant * n1) % (slots // step)].sum()
        )
        if best is None or cost < best[0]:
            best = (cost, n1)
    assert best is not None
    return step, best[1]


class CkksPeer(HEPeer):
    def __init__(self, opts: CkksOptions, public: bytes, sender: str):
        self.opts, self.sender = opts, sender
        public = bytes(public)
        if len(public) < _PUB_HEADER.size:
            raise ProtocolError(f"{sender}: malformed CKKS public context (too short)")
        magic, version, n_ctx, n_gk = _PUB_HEADER.unpack_from(public, 0)
        if magic != _PUB_MAGIC or version != _VERSION or _PUB_HEADER.size + n_ctx + n_gk != len(public):
            raise ProtocolError(f"{sender}: malformed CKKS public context (bad header or length)")
        try:
            ctx = ts.context_from(public[_PUB_HEADER.size : _PUB_HEADER.size + n_ctx], n_threads=1)
        except Exception as exc:
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
        self.seal = _Seal(sc)
        try:
            self._gk = self.seal.load(public[_PUB_HEADER.size + n_ctx :], sa.GaloisKeys())
            missing = [
                e for e in sc.key_context_data().galois_tool().get_elts_all() if not self._gk.has_key(e)
            ]
        except Exception as exc:
            raise ProtocolError(f"{sender}: malformed CKKS Galois keys ({exc})") from None
        if missing:
            raise ProtocolError(f"{sender}: CKKS Galois keys miss {len(missing)} power-of-two rotations")
        self.scale = 2.0**opts.global_scale_bits
        self._ev = sa.Evaluator(sc)
        self._encryptor = sa.Encryptor(sc, ctx.public_key().data)
        self._plans: dict[tuple[Any, ...], tuple[int, int]] = {}

    # -- helpers
    def _input(self, blob: bytes, shape: tuple[int, int]) -> tuple[_Layout, list[Any]]:
        what = f"{self.sender}: ckks ciphertext"
        try:
            layout, cts = _unframe(blob, self.seal, what)
            if layout != _standard(shape[0], shape[1], self.seal.slots):
                raise ValueError(f"{what}: layout {layout} does not match a {shape[0]}x{shape[1]} matrix")
            _check_level(cts, [self.seal.in_level], self.scale, what)
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
        key = (g.t.tobytes(), g.s.tobytes(), g.delta.tobytes(), g.conj)
        if key not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[key] = _plan(g, slots, self.seal.costs)
        step, n1 = self._plans[key]
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
                    if np.iscomplexobj(dg) and not dg.imag.any():
                        dg = dg.real
                    pt = seal.encode(dg, seal.in_level, seal.q1)
                    if pt.is_zero():  # every entry rounds to 0 at scale q1; SEAL refuses the product
                        continue
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
                if a.scale != self.scale:  # exact: diagonals are encoded at scale q1
                    raise RuntimeError(f"ckks: scale {a.scale} after rescale, expected {self.scale}")
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
        t_in, b_in = (x[0] for x in lin.bases())
        s_out, b_out = (x[0] for x in lout.bases())
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
            t=uniq // slots // lout.n_ct,
            s=uniq // slots % lout.n_ct,
            delta=uniq % slots,
            diag=diag,
            conj=True,
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
        # Keep the input's block stride and put the a-vector of column group t in
        # chunk t (or, when a > bp, row chunk c of it in ciphertext c*T + t): the
        # shift of the term (i, alpha) is then i - alpha - t*A, the same in every block.
        lout = _Layout(a, m, lin.nb, lin.bp, min(big_a, lin.bp))
        if t2 * big_a <= lin.bp:
            # spare chunks: split the rows into n_part slices summed into chunks
            # t + h*t2 and folded at the end; the slices share their diagonals
            stride = t2 * big_a
            n_part = _pow2(-(-r // stride))
            length = stride if n_part > 1 else r
        t_in, b_in = lin.bases()
        s_out, b_out = lout.bases()  # (row chunks, ncc)
        ch = lout.chunk
        # (row chunk, column) pairs with the same (t, s, base offset) share every diagonal
        rc, lc = np.meshgrid(np.arange(lout.row_chunks), np.arange(lin.ncc), indexing="ij")
        rc, lc = rc.ravel(), lc.ravel()
        cls_key = np.stack([t_in[0, lc], s_out[rc, lc], (b_in[0, lc] - b_out[rc, lc]) % slots, rc], axis=1)
        cls, cls_inv = np.unique(cls_key, axis=0, return_inverse=True)
        cls_inv = cls_inv.ravel()
        offs = np.arange(-(ch - 1), length)  # e = i - alpha' within a slice (alpha' < chunk)
        gt = np.repeat(cls[:, 0], len(offs))
        gs = np.repeat(cls[:, 1], len(offs))
        gd = (np.repeat(cls[:, 2], len(offs)) + np.tile(offs, len(cls))) % slots
        members = [np.flatnonzero(cls_inv == ci) for ci in range(len(cls))]

        def diag(gi: int) -> tuple[np.ndarray, None]:
            ci, k = divmod(gi, len(offs))
            e, c = int(offs[k]), int(cls[ci, 3])
            base = b_out[rc[members[ci]], lc[members[ci]]]
            rows_c = min(ch, a - c * ch)
            dg = np.zeros(slots)
            for h in range(n_part):
                top = min(rows_c, length - e, r - h * length - e)
                al = np.arange(max(0, -e), top)
                if len(al) == 0:
                    continue
                vals = p[h * length + al + e, c * ch + al]
                dg[(base[:, None] + h * stride + al[None, :]).ravel()] = np.tile(vals, len(base))
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
        if importlib.util.find_spec("tenseal") is None:
            raise ConfigError(
                "the ckks backend needs TenSEAL (install the 'crypto' extra)", path="exchange.backend"
            )
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
        try:
            sa.CoeffModulus.Create(n, bits)
        except Exception as exc:
            raise refuse(
                f"coeff_mod_bit_sizes {bits}: SEAL cannot build these primes for N={n} ({exc})",
                "coeff_mod_bit_sizes",
            ) from None
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
