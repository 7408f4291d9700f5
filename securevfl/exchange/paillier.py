"""``paillier``: the two-party HE interactive layer of :mod:`securevfl.exchange.he`
with packed Paillier encryption (g = n + 1), arithmetic in gmpy2.

What it protects is that protocol's (A never sees h'_i, P_i never sees dL/dz,
nobody holds W_i); this module is the scheme: encoding, packing, masks, keys.

Fixed point, one public scale per role, never a per-value exponent
    Every encrypted value x (an embedding h'_i or a gradient dL/dz) is the integer
    round(x 2^precision_bits) with |x| < 2^value_bits; every plaintext operand
    (a weight share, or h'_i in ``tmatmul``) is round(w 2^scalar_precision_bits)
    with |w| < 2^scalar_bits; results carry the sum of the two. phe's default
    encoding picks an exponent per value, sends it in the clear (it leaks the
    magnitude) and makes every mixed addition a modexp; here a blob's header has
    one scale field and the values have none. Why two scales: in ``he.py`` the
    party that owns an encrypted operand also multiplies its own float copy by
    its weight share, and the weight shares absorb the masks R of every step
    (dW^P = R), so they grow to ~2^(mask_bits+4). The rounding error of the
    encrypted operand is multiplied by that share, hence the 48 fractional bits
    (error ~2^(mask_bits+6-precision_bits) on z); the plaintext operand's
    rounding error only meets values below 2^value_bits, and 20 bits keep it
    near 1e-6 while the exponents of the scalar multiplications stay short.

Packing (FATE-style; only additions and one scalar per ciphertext are possible)
    A plaintext holds L = (|n| - 1) // S signed slots of S bits: sum_s y_s 2^(sS),
    negative totals wrap mod n and slots are read back with a bias of 2^(S-1) per
    slot (two's-complement-like, no per-slot offset under encryption). S is sized
    so that no slot can overflow: S >= F + max(value_bits + scalar_bits +
    ceil(log2 terms), mask_bits) + 3, with F the result scale and ``terms`` the
    length of the sums (the encryptor knows it from the shape; the peer
    re-checks it; ``slot_bits`` may fix S, which ``check`` then verifies against
    the batch size and the embedding sizes). With the defaults S is 123..127 bits
    and L = 16 at 2048-bit keys.

    Layouts: ``cols`` packs L consecutive rows of one column into a ciphertext,
    so ``Enc(X) @ w`` multiplies every slot of column k by the same w[k, j] and
    the result comes out in the same layout (one multi-exponentiation per output
    ciphertext over the c ciphertexts of its row block). ``tmatmul`` sums over
    the rows, which need a different scalar per row, so it needs ``rows``: L
    consecutive columns of one row per ciphertext (the ``cols`` layout of X^T);
    p^T @ Y is then the same kernel with p as the scalars. Slots cannot be
    unpacked without the key, so :meth:`PaillierKey.encrypt` writes the layouts
    the peer's operations need (``ops``; each a fresh encryption): the blob of
    dL/dz both, the blob of h'_i only ``cols``.

Masks and hiding
    :meth:`PaillierScheme.mask` draws uniform values on the grid 2^(mask_bits-52)
    in [-2^mask_bits, 2^mask_bits) (exact in float64); the peer adds them under
    encryption. The hiding is statistical: a masked value y + eps has statistical
    distance at most |y - y'| / 2^(mask_bits+1) <= |y| 2^-mask_bits from y' + eps,
    per value (the part of y the decryptor already knows, e.g. its own mask
    contributions to the weight shares, does not count). With the default
    mask_bits = 24 and values of magnitude <= 16 that is 2^-20 per value. Larger
    masks hide better but cost precision in he.py's float64 weight shares
    (absolute error on z ~2^(mask_bits-45) after a long run); ``check`` refuses
    mask_bits < 20. Unused slots of a partial block get fresh masks as well.

Keys and randomness
    2048-bit moduli at least (about 112-bit security; 3072 for 128). The public
    part is n only, in a small fixed binary format. Every ciphertext that leaves
    a party carries its own fresh obfuscator r^n mod n^2 with r uniform: the key
    owner computes it by CRT as (r_p^p mod p^2, r_q^q mod q^2), which has exactly
    the distribution of r^n and is ~8x cheaper; the peer, without the factors,
    pays a full 2048-bit exponent mod n^2 per output ciphertext, which dominates
    its time. Obfuscators are never reused. gmpy2's list powmod releases the
    GIL, so ``threads`` workers split every batch of modexps; with ``precompute``
    a daemon thread also makes the next obfuscators while the party waits on the
    network, which pays off when the parties have cores of their own (on one
    shared 2-core host it measured no faster, so it is off by default).

Wire formats (no pickle; every field is validated, a bad one is a ProtocolError)
    public key: b"SVPK", version, u16 byte length, n big-endian, nothing else.
    blob: b"SVPB", version, section count; per section a u32 length, a header
    (layout, scale, slot bits, slots, rows, cols, ciphertext bytes, count) and
    ``count`` fixed-width big-endian ciphertexts of 2|n| bits.
"""

from __future__ import annotations

import collections
import os
import secrets
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import gmpy2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from securevfl.config import ModelSpec, Protocol
from securevfl.errors import ConfigError, CryptoParameterError, ProtocolError
from securevfl.exchange.he import BOTH_OPS, MATMUL, TMATMUL, HEKey, HEPeer, HEScheme, he_backend

MIN_KEY_BITS = 2048
MAX_KEY_BITS = 16384
MASK_FLOOR_BITS = 20

PUB_MAGIC = b"SVPK"
BLOB_MAGIC = b"SVPB"
VERSION = 1
COLS, ROWS = 0, 1
LAYOUTS = {"cols": COLS, "rows": ROWS}
_LAYOUT_OF = {MATMUL: COLS, TMATMUL: ROWS}  # which packing each peer operation needs
_PUB_HEAD = struct.Struct(">4sBH")  # magic, version, byte length of n
_BLOB_HEAD = struct.Struct(">4sBB")  # magic, version, number of sections
_SEC_LEN = struct.Struct(">I")
_SEC_HEAD = struct.Struct(">BBHHIIHI")  # layout, scale, slot bits, slots, rows, cols, ct bytes, count
MAX_DIM = 1 << 24

_ONE = gmpy2.mpz(1)


class PaillierOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    key_bits: int = Field(default=2048, gt=0, le=MAX_KEY_BITS, description="bits of the modulus n")
    precision_bits: int = Field(
        default=48, ge=8, le=60, description="fractional bits of every encrypted value (one scale)"
    )
    scalar_precision_bits: int = Field(
        default=20, ge=4, le=60, description="fractional bits of the plaintext operands"
    )
    value_bits: int = Field(default=8, ge=1, le=56, description="|encrypted value| < 2^value_bits")
    scalar_bits: int = Field(default=40, ge=1, le=58, description="|plaintext operand| < 2^scalar_bits")
    mask_bits: int = Field(default=24, ge=1, le=52, description="masks uniform in [-2^m, 2^m)")
    slot_bits: int | None = Field(
        default=None, ge=16, description="packing slot width; none: the smallest safe one per blob"
    )
    threads: int = Field(default=0, ge=0, le=256, description="workers for batched modexps; 0: all CPUs")
    precompute: bool = Field(
        default=False, description="make obfuscators while waiting on the network (parties on own hosts)"
    )
    weight_init: Literal["private", "seeded"] = "private"


# -- parameters derived from the options ----------------------------------------


def _ceil_log2(k: int) -> int:
    return max(0, (int(k) - 1).bit_length())


@dataclass(frozen=True)
class _Params:
    fx: int  # scale of encrypted values
    fw: int  # scale of plaintext operands
    v: int
    sb: int
    m: int
    slot_bits: int | None
    threads: int
    precompute: bool

    @classmethod
    def of(cls, o: PaillierOptions) -> _Params:
        threads = o.threads or min(os.cpu_count() or 1, 32)
        return cls(
            o.precision_bits,
            o.scalar_precision_bits,
            o.value_bits,
            o.scalar_bits,
            o.mask_bits,
            o.slot_bits,
            threads,
            o.precompute,
        )

    @property
    def F(self) -> int:  # the result scale
        return self.fx + self.fw

    @property
    def grid(self) -> int:
        """Masks are k 2^-grid with |k| <= 2^52: exact in float64."""
        return 52 - self.m

    def slot_need(self, terms: int) -> int:
        """Smallest slot width that holds a sum of ``terms`` products plus a mask."""
        return self.F + max(self.v + self.sb + _ceil_log2(terms), self.m) + 3

    def slot_for(self, terms: int, n_bits: int) -> int:
        s = self.slot_bits if self.slot_bits is not None else self.slot_need(terms)
        if s < self.slot_need(terms) or s > n_bits - 1:
            raise ConfigError(
                f"a slot of {s} bits cannot hold sums of {terms} products (needs "
                f"{self.slot_need(terms)} bits) within a {n_bits}-bit modulus",
                path="exchange.params.slot_bits",
            )
        return s


# -- fixed-point encoding ----------------------------------------------------------


def _encode(x: np.ndarray, frac: int, bound_bits: int, what: str, field: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"paillier: {what} is not finite")
    big = float(np.max(np.abs(x))) if x.size else 0.0
    if big >= 2.0**bound_bits:
        raise ConfigError(
            f"{what} of magnitude {big:.4g} does not fit the fixed-point range 2^{bound_bits}; "
            f"raise {field} (it widens the packing slots)",
            path=f"exchange.params.{field}",
        )
    return np.rint(np.ldexp(x, frac)).astype(np.int64)


def _arrange(a: np.ndarray, layout: int, slots: int) -> np.ndarray:
    """(rows x cols) -> (ciphertexts x slots) in the given layout, zero-padded."""
    if layout == ROWS:
        a = a.T
    c, r = a.shape[1], a.shape[0]
    nb = -(-r // slots)
    pad = np.zeros((nb * slots, c), dtype=a.dtype)
    pad[:r] = a
    return pad.T.reshape(c * nb, slots)


def _unarrange(vals: np.ndarray, layout: int, rows: int, cols: int, slots: int) -> np.ndarray:
    if layout == ROWS:
        rows, cols = cols, rows
    nb = -(-rows // slots)
    out = vals.reshape(cols, nb * slots).T[:rows]
    return out.T if layout == ROWS else out


def _bias(slots: int, s: int) -> int:
    return sum(1 << (i * s + s - 1) for i in range(slots))


def _pack(y: np.ndarray, s: int) -> list[int]:
    """Signed int64 slots (ciphertexts x slots) -> packed integers sum_i y_i 2^(i s)."""
    nct, slots = y.shape
    raw8 = np.ascontiguousarray(y, dtype="<i8").view(np.uint8).reshape(nct, slots, 8)
    bits = np.unpackbits(raw8, axis=2, bitorder="little")
    if s >= 64:
        sign = bits[:, :, 63:64]
        bits = np.concatenate([bits, np.repeat(sign, s - 64, axis=2)], axis=2)
    else:
        bits = bits[:, :, :s].copy()
    bits[:, :, s - 1] ^= 1  # two's complement -> y + 2^(s-1)
    flat = bits.reshape(nct, slots * s)
    raw = np.packbits(flat, axis=1, bitorder="little")
    bias = _bias(slots, s)
    return [int.from_bytes(row.tobytes(), "little") - bias for row in raw]


def _unpack(ms: list[Any], n: Any, slots: int, s: int) -> np.ndarray:
    """Plaintexts mod n -> float64 slot values (ciphertexts x slots), unscaled."""
    half = n >> 1
    bias = _bias(slots, s)
    nbytes = (slots * s + 7) // 8
    buf = b"".join(
        int((m - n if m > half else m) + bias).to_bytes(nbytes, "little") for m in ms
    )  # negative totals wrap mod n
    raw = np.frombuffer(buf, dtype=np.uint8).reshape(len(ms), nbytes)
    bits = np.unpackbits(raw, axis=1, bitorder="little")[:, : slots * s].reshape(len(ms), slots, s)
    bits[:, :, s - 1] ^= 1  # back to two's complement
    k = -(-s // 32)
    if k * 32 > s:
        sign = np.repeat(bits[:, :, s - 1 : s], k * 32 - s, axis=2)
        bits = np.concatenate([bits, sign], axis=2)
    words = np.packbits(bits, axis=2, bitorder="little").view("<u4").reshape(len(ms), slots, k)
    out = np.ldexp(words[:, :, k - 1].view(np.int32).astype(np.float64), 32 * (k - 1))
    for i in range(k - 2, -1, -1):
        out += np.ldexp(words[:, :, i].astype(np.float64), 32 * i)
    return out


# -- big-integer kernels ---------------------------------------------------------------

_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
_EXEC_LOCK = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    with _EXEC_LOCK:
        ex = _EXECUTORS.get(threads)
        if ex is None:
            ex = _EXECUTORS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="paillier")
        return ex


def _powmods(bases: list[Any], e: Any, mod: Any, threads: int) -> list[Any]:
    """[b^e mod m]; gmpy2's list powmod releases the GIL, so chunks run in parallel."""
    if threads <= 1 or len(bases) < 2 * threads:
        return gmpy2.powmod_base_list(bases, e, mod)
    step = -(-len(bases) // threads)
    parts = [bases[i : i + step] for i in range(0, len(bases), step)]
    out: list[Any] = []
    for part in _executor(threads).map(lambda b: gmpy2.powmod_base_list(b, e, mod), parts):
        out.extend(part)
    return out


def _window(bits: int, k: int, j: int) -> int:
    best, best_w = None, 1
    for w in range(1, 9):
        nwin = -(-bits // w)
        cost = k * ((1 << w) - 2) + j * nwin * (k * (1 - 2.0**-w) + 2 * w)
        if best is None or cost < best:
            best, best_w = cost, w
    return best_w


def _multiexp(bases: list[Any], e: np.ndarray, n2: Any) -> list[Any]:
    """out[j] = prod_k bases[k]^e[k, j] mod n2 for signed int64 e (k x j).

    Straus-style: a table of bases[k]^1..2^w-1 per base, shared by every output;
    per output one Horner pass over w-bit windows, positive and negative
    exponents in separate accumulators, one inversion at the end."""
    k, j = e.shape
    a = np.abs(e)
    top = int(a.max()) if a.size else 0
    if top == 0:
        return [_ONE] * j
    bits = top.bit_length()
    w = _window(bits, k, j)
    nwin = -(-bits // w)
    wmask = (1 << w) - 1
    tables = []
    for c in bases:
        t = [_ONE, c]
        for _ in range((1 << w) - 2):
            t.append(t[-1] * c % n2)
        tables.append(t)
    shifts = (w * np.arange(nwin - 1, -1, -1)).reshape(nwin, 1, 1)
    digits = ((a[None, :, :] >> shifts) & wmask).transpose(2, 0, 1).tolist()  # j, window, k
    neg = (e < 0).T.tolist()
    sq = gmpy2.mpz(1 << w)
    out = []
    for jj in range(j):
        pos_acc, neg_acc = _ONE, _ONE
        negj = neg[jj]
        for win in digits[jj]:
            if pos_acc != 1:
                pos_acc = gmpy2.powmod(pos_acc, sq, n2)
            if neg_acc != 1:
                neg_acc = gmpy2.powmod(neg_acc, sq, n2)
            for kk, dg in enumerate(win):
                if dg:
                    if negj[kk]:
                        neg_acc = neg_acc * tables[kk][dg] % n2
                    else:
                        pos_acc = pos_acc * tables[kk][dg] % n2
        out.append(pos_acc if neg_acc == 1 else pos_acc * gmpy2.invert(neg_acc, n2) % n2)
    return out


class _Fresh:
    """Fresh obfuscators, each handed out once. With ``precompute`` a daemon thread
    keeps a stock as large as the largest request so far, made while the party is
    idle (waiting on the network); each one is still used exactly once."""

    CAP = 4096

    def __init__(self, make: Callable[[int, int], list[Any]], threads: int, precompute: bool):
        self._make = make
        self._threads = threads
        self._precompute = precompute
        self._stock: collections.deque[Any] = collections.deque()
        self._target = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, k: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < k:
            try:
                out.append(self._stock.popleft())
            except IndexError:
                break
        if len(out) < k:
            out.extend(self._make(k - len(out), self._threads))
        if self._precompute:
            self._target = min(self.CAP, max(self._target, k))
            if self._thread is None:
                self._thread = threading.Thread(target=self._fill, name="paillier-fresh", daemon=True)
                self._thread.start()
            self._wake.set()
        return out

    def _fill(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while len(self._stock) < self._target:
                self._stock.extend(self._make(4, 1))


def _randoms(bound: Any, k: int) -> list[Any]:
    """k uniform values in [1, bound) from the OS CSPRNG."""
    b = int(bound) - 1
    return [gmpy2.mpz(secrets.randbelow(b) + 1) for _ in range(k)]


# -- serialization ---------------------------------------------------------------------


@dataclass
class _Section:
    layout: int
    scale: int
    slot_bits: int
    slots: int
    rows: int
    cols: int
    cts: list[Any]

    def count(self) -> int:
        r, c = (self.rows, self.cols) if self.layout == COLS else (self.cols, self.rows)
        return c * -(-r // self.slots)


def _dump(sections: list[_Section], ct_bytes: int) -> bytes:
    out = [_BLOB_HEAD.pack(BLOB_MAGIC, VERSION, len(sections))]
    for sec in sections:
        body = b"".join(
            [
                _SEC_HEAD.pack(
                    sec.layout,
                    sec.scale,
                    sec.slot_bits,
                    sec.slots,
                    sec.rows,
                    sec.cols,
                    ct_bytes,
                    len(sec.cts),
                ),
                *(c.to_bytes(ct_bytes, "big") for c in sec.cts),
            ]
        )
        out += [_SEC_LEN.pack(len(body)), body]
    return b"".join(out)


def _load(blob: bytes, n: Any, n2: Any, who: str) -> list[_Section]:
    """Parse and validate a blob; anything malformed is a ProtocolError naming ``who``."""

    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"{who}: malformed Paillier ciphertext blob: {why}")

    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise bad("not bytes")
    blob = bytes(blob)
    if len(blob) < _BLOB_HEAD.size:
        raise bad(f"{len(blob)} bytes is shorter than the header")
    magic, version, nsec = _BLOB_HEAD.unpack_from(blob, 0)
    if magic != BLOB_MAGIC or version != VERSION:
        raise bad("wrong magic or version")
    if not 1 <= nsec <= 2:
        raise bad(f"{nsec} sections")
    ct_bytes = (n2.bit_length() + 7) // 8
    n_bits = n.bit_length()
    pos = _BLOB_HEAD.size
    secs: list[_Section] = []
    for _ in range(nsec):
        if pos + _SEC_LEN.size > len(blob):
            raise bad("truncated section length")
        (length,) = _SEC_LEN.unpack_from(blob, pos)
        pos += _SEC_LEN.size
        if length < _SEC_HEAD.size or pos + length > len(blob):
            raise bad("section length out of range")
        layout, scale, sbits, slots, rows, cols, cb, count = _SEC_HEAD.unpack_from(blob, pos)
        if layout not in (COLS, ROWS) or any(s.layout == layout for s in secs):
            raise bad(f"layout {layout}")
        if not (1 <= rows <= MAX_DIM and 1 <= cols <= MAX_DIM):
            raise bad(f"shape {rows}x{cols}")
        if not (16 <= sbits <= n_bits - 1 and slots >= 1 and slots * sbits <= n_bits - 1):
            raise bad(f"{slots} slots of {sbits} bits do not fit a {n_bits}-bit modulus")
        if cb != ct_bytes:
            raise bad(f"ciphertexts of {cb} bytes, expected {ct_bytes}")
        sec = _Section(layout, scale, sbits, slots, rows, cols, [])
        if count != sec.count() or length != _SEC_HEAD.size + count * cb:
            raise bad(f"{count} ciphertexts in {length} bytes for a {rows}x{cols} matrix")
        body = pos + _SEC_HEAD.size
        from_bytes = gmpy2.mpz.from_bytes
        cts = [from_bytes(blob[body + i * cb : body + (i + 1) * cb], "big") for i in range(count)]
        for c in cts:
            if not 0 < c < n2:
                raise bad("ciphertext out of range")
        sec.cts = cts
        secs.append(sec)
        pos += length
    if pos != len(blob):
        raise bad(f"{len(blob) - pos} trailing bytes")
    return secs


def _dump_public(n: Any) -> bytes:
    nb = (n.bit_length() + 7) // 8
    return _PUB_HEAD.pack(PUB_MAGIC, VERSION, nb) + n.to_bytes(nb, "big")


def _load_public(data: bytes, who: str, min_bits: int) -> Any:
    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"{who}: malformed Paillier public key: {why}")

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise bad("not bytes")
    data = bytes(data)
    if len(data) < _PUB_HEAD.size:
        raise bad("too short")
    magic, version, nb = _PUB_HEAD.unpack_from(data, 0)
    if magic != PUB_MAGIC or version != VERSION:
        raise bad("wrong magic or version")
    if len(data) != _PUB_HEAD.size + nb:
        raise bad(f"{len(data)} bytes for a {nb}-byte modulus (only n is accepted)")
    if nb == 0 or data[_PUB_HEAD.size] == 0:
        raise bad("non-canonical encoding")
    n = gmpy2.mpz.from_bytes(data[_PUB_HEAD.size :], "big")
    if n.bit_length() > MAX_KEY_BITS or n % 2 == 0 or gmpy2.is_square(n):
        raise bad("not a plausible RSA modulus")
    if n.bit_length() < min_bits:
        raise ProtocolError(
            f"{who}: Paillier public key of {n.bit_length()} bits is below key_bits={min_bits}; refused"
        )
    return n


# -- the scheme ----------------------------------------------------------------------------


class PaillierKey(HEKey):
    """A Paillier key pair (secret p, q) held by its owner; encrypts with CRT."""

    def __init__(self, params: _Params, key_bits: int):
        from phe import paillier as phe_paillier

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
        self.ct_bytes = (self.n2.bit_length() + 7) // 8
        self._fresh = _Fresh(self._make_obfuscators, params.threads, params.precompute)

    def public(self) -> bytes:
        return _dump_public(self.n)

    def _make_obfuscators(self, k: int, threads: int) -> list[Any]:
        """r^n mod n^2 for uniform r, via CRT: r^n mod p^2 is uniform on the order
        p-1 subgroup, as is r_p^p for uniform r_p; 8x cheaper than the full power."""
        ap = _powmods(_randoms(self._p2, k), self._p, self._p2, threads)
        aq = _powmods(_randoms(self._q2, k), self._q, self._q2, threads)
        p2, q2, q2inv = self._p2, self._q2, self._q2inv
        return [b + q2 * ((a - b) * q2inv % p2) for a, b in zip(ap, aq, strict=True)]

    def _encrypt_ints(self, ms: list[int]) -> list[Any]:
        n, n2 = self.n, self.n2
        obf = self._fresh.take(len(ms))
        return [(1 + (m % n) * n) * r % n2 for m, r in zip(ms, obf, strict=True)]

    def encrypt(self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS) -> bytes:
        prm = self.prm
        unknown = set(ops) - set(_LAYOUT_OF)
        if not ops or unknown:
            raise ValueError(f"paillier: encrypt for operations {sorted(ops)}; known: {sorted(_LAYOUT_OF)}")
        layouts = sorted(_LAYOUT_OF[op] for op in ops)
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or 0 in x.shape:
            raise ValueError(f"paillier: encrypt takes a non-empty matrix, got shape {x.shape}")
        xi = _encode(x, prm.fx, prm.v, "a value to encrypt", "value_bits")
        rows, cols = x.shape
        nbits = self.n.bit_length()
        secs = []
        for lay in layouts:
            s = prm.slot_for(cols if lay == COLS else rows, nbits)
            slots = (nbits - 1) // s
            packed = _pack(_arrange(xi, lay, slots), s)
            secs.append(_Section(lay, prm.fx, s, slots, rows, cols, self._encrypt_ints(packed)))
        return _dump(secs, self.ct_bytes)

    def _decrypt_ints(self, cts: list[Any]) -> list[Any]:
        p, q, p2, q2 = self._p, self._q, self._p2, self._q2
        t = self.prm.threads
        ap = _powmods([c % p2 for c in cts], p - 1, p2, t)
        aq = _powmods([c % q2 for c in cts], q - 1, q2, t)
        out = []
        for a, b in zip(ap, aq, strict=True):
            mp = (a - 1) // p * self._hp % p
            mq = (b - 1) // q * self._hq % q
            out.append(mq + q * ((mp - mq) * self._qinv % p))
        return out

    def decrypt(self, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        secs = _load(blob, self.n, self.n2, "blob to decrypt")
        sec = secs[0]
        rows, cols = (int(v) for v in shape)
        if (sec.rows, sec.cols) != (rows, cols):
            raise ProtocolError(
                f"blob to decrypt: holds a {sec.rows}x{sec.cols} matrix, expected {rows}x{cols}"
            )
        if sec.scale not in (self.prm.fx, self.prm.F):
            raise ProtocolError(f"blob to decrypt: unexpected fixed-point scale 2^-{sec.scale}")
        vals = _unpack(self._decrypt_ints(sec.cts), self.n, sec.slots, sec.slot_bits)
        return np.ldexp(_unarrange(vals, sec.layout, rows, cols, sec.slots), -sec.scale)


class PaillierPeer(HEPeer):
    """The other party's public key: homomorphic products, masks, re-randomization."""

    def __init__(self, params: _Params, n: Any, sender: str):
        self.prm = params
        self.n = n
        self.n2 = n * n
        self.sender = sender
        self.ct_bytes = (self.n2.bit_length() + 7) // 8
        self._fresh = _Fresh(self._make_obfuscators, params.threads, params.precompute)

    def _make_obfuscators(self, k: int, threads: int) -> list[Any]:
        return _powmods(_randoms(self.n, k), self.n, self.n2, threads)

    def _section(self, blob: bytes, layout: int, shape: tuple[int, int], terms: int) -> _Section:
        who = f"ciphertexts from {self.sender}"
        for sec in _load(blob, self.n, self.n2, who):
            if sec.layout != layout:
                continue
            if (sec.rows, sec.cols) != tuple(shape):
                raise ProtocolError(f"{who}: a {sec.rows}x{sec.cols} matrix, expected {shape[0]}x{shape[1]}")
            if sec.scale != self.prm.fx:
                raise ProtocolError(f"{who}: fixed-point scale 2^-{sec.scale}, expected 2^-{self.prm.fx}")
            if sec.slot_bits < self.prm.slot_need(terms):
                raise ProtocolError(
                    f"{who}: {sec.slot_bits}-bit slots could overflow in sums of {terms} products "
                    f"(need {self.prm.slot_need(terms)})"
                )
            return sec
        name = "cols" if layout == COLS else "rows"
        raise ProtocolError(f"{who}: the blob has no '{name}' layout")

    def _finish(self, outs: list[Any], mask: np.ndarray, sec: _Section, rows: int, cols: int) -> bytes:
        """Add the packed mask and a fresh obfuscator to every output ciphertext."""
        prm = self.prm
        mask = np.asarray(mask, dtype=np.float64)
        if not np.all(np.isfinite(mask)) or float(np.max(np.abs(mask))) > 2.0**prm.m:
            raise ValueError(f"paillier: masks must be finite and within [-2^{prm.m}, 2^{prm.m}]")
        mk = np.rint(np.ldexp(mask, prm.grid)).astype(np.int64)  # the mask grid: exact for mask()
        shift = prm.F - prm.grid
        slots = _arrange(mk, sec.layout, sec.slots)
        pad = ~_arrange(np.ones(mk.shape, dtype=bool), sec.layout, sec.slots)
        if pad.any():  # padding slots hold zeros from an honest sender; mask them too
            slots[pad] = np.frombuffer(os.urandom(8 * int(pad.sum())), dtype="<i8") >> 11
        packed = _pack(slots, sec.slot_bits)
        n, n2 = self.n, self.n2
        obf = self._fresh.take(len(outs))
        res = [
            c * (1 + ((mv << shift) % n) * n) % n2 * r % n2
            for c, mv, r in zip(outs, packed, obf, strict=True)
        ]
        out = _Section(sec.layout, prm.F, sec.slot_bits, sec.slots, rows, cols, res)
        return _dump([out], self.ct_bytes)

    def _scalars(self, w: np.ndarray) -> np.ndarray:
        return _encode(w, self.prm.fw, self.prm.sb, "a plaintext operand", "scalar_bits")

    def matmul(self, blob: bytes, shape: tuple[int, int], w: np.ndarray, mask: np.ndarray) -> bytes:
        r, c = (int(v) for v in shape)
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != c or np.shape(mask) != (r, w.shape[1]):
            raise ValueError(f"paillier matmul: shapes {shape} @ {w.shape} + {np.shape(mask)}")
        sec = self._section(blob, COLS, (r, c), terms=c)
        e = self._scalars(w)
        nb = -(-r // sec.slots)
        outs: list[Any] = [None] * (w.shape[1] * nb)
        try:
            for t in range(nb):
                for j, ct in enumerate(_multiexp(sec.cts[t::nb], e, self.n2)):
                    outs[j * nb + t] = ct
        except ZeroDivisionError:
            raise ProtocolError(f"ciphertexts from {self.sender}: a ciphertext is not invertible") from None
        return self._finish(outs, mask, sec, r, w.shape[1])

    def tmatmul(self, p: np.ndarray, blob: bytes, shape: tuple[int, int], mask: np.ndarray) -> bytes:
        r, m = (int(v) for v in shape)
        p = np.asarray(p, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != r or np.shape(mask) != (p.shape[1], m):
            raise ValueError(f"paillier tmatmul: shapes {p.shape}^T @ {shape} + {np.shape(mask)}")
        sec = self._section(blob, ROWS, (r, m), terms=r)
        e = self._scalars(p)
        nb = -(-m // sec.slots)
        outs: list[Any] = [None] * (p.shape[1] * nb)
        try:
            for u in range(nb):
                for a, ct in enumerate(_multiexp(sec.cts[u::nb], e, self.n2)):
                    outs[a * nb + u] = ct
        except ZeroDivisionError:
            raise ProtocolError(f"ciphertexts from {self.sender}: a ciphertext is not invertible") from None
        return self._finish(outs, mask, sec, p.shape[1], m)


def _embed_dims(proto: Protocol) -> list[int]:
    return [(p.model or ModelSpec()).out for p in proto.parties.passive]


class PaillierScheme(HEScheme):
    options = PaillierOptions

    def __init__(self, options: BaseModel):
        super().__init__(options)
        assert isinstance(options, PaillierOptions)
        self.prm = _Params.of(options)

    def new_key(self) -> PaillierKey:
        return PaillierKey(self.prm, self.opts.key_bits)  # type: ignore[attr-defined]

    def peer(self, public: bytes, *, sender: str) -> PaillierPeer:
        n = _load_public(public, sender, self.opts.key_bits)  # type: ignore[attr-defined]
        return PaillierPeer(self.prm, n, sender)

    def mask(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        lim = 1 << 52
        k = rng.integers(-lim, lim, size=shape, dtype=np.int64)
        return np.ldexp(k.astype(np.float64), -self.prm.grid)

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, PaillierOptions)
        o = options
        prm = _Params.of(o)

        def bad(field: str, why: str, crypto: bool = False) -> ConfigError:
            kind = CryptoParameterError if crypto else ConfigError
            return kind(why, path=f"exchange.params.{field}")

        if o.key_bits < MIN_KEY_BITS:
            raise bad(
                "key_bits",
                f"key_bits={o.key_bits} is below the {MIN_KEY_BITS}-bit floor: a Paillier modulus "
                "is broken by factoring it, and moduli under 2048 bits give less than 112-bit "
                "security (NIST SP 800-57; 3072 bits for 128-bit)",
                crypto=True,
            )
        if o.mask_bits < MASK_FLOOR_BITS:
            raise bad(
                "mask_bits",
                f"mask_bits={o.mask_bits} is below {MASK_FLOOR_BITS}: masks hide a value y only up to "
                f"a statistical distance of |y| 2^-mask_bits per value",
                crypto=True,
            )
        if o.scalar_bits < o.mask_bits + 8:
            raise bad(
                "scalar_bits",
                f"scalar_bits={o.scalar_bits} must be at least mask_bits + 8 = {o.mask_bits + 8}: the "
                "weight shares absorb a mask every step and grow beyond 2^mask_bits",
            )
        if o.value_bits + o.precision_bits > 62:
            raise bad("precision_bits", "value_bits + precision_bits must be at most 62 (int64 encoding)")
        if o.scalar_bits + o.scalar_precision_bits > 62:
            raise bad(
                "scalar_precision_bits", "scalar_bits + scalar_precision_bits must be at most 62 (int64)"
            )
        if prm.grid > prm.F:
            raise bad("precision_bits", f"precision_bits + scalar_precision_bits must be >= {prm.grid}")
        terms = max(proto.training.batch_size, proto.interactive.out, *_embed_dims(proto))
        need = prm.slot_need(terms)
        if o.slot_bits is not None and o.slot_bits < need:
            raise bad(
                "slot_bits",
                f"slot_bits={o.slot_bits} could overflow: a slot must hold a sum of up to {terms} "
                f"products (batch_size {proto.training.batch_size}, embedding and interactive sizes) "
                f"of values below 2^{o.value_bits} and 2^{o.scalar_bits} at 2^-{prm.F}, plus a mask "
                f"below 2^{o.mask_bits}: at least {need} bits",
            )
        slot = o.slot_bits or need
        if slot > o.key_bits - 1:
            raise bad(
                "slot_bits" if o.slot_bits else "key_bits",
                f"a {slot}-bit slot does not fit a {o.key_bits}-bit plaintext",
            )

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, PaillierOptions)
        return {
            "security_bits": 128 if options.key_bits >= 3072 else 112,
            "statistical_mask_bits": options.mask_bits,
        }


he_backend(
    "paillier",
    PaillierScheme,
    "packed Paillier (phe keys, gmpy2); W_i shared between A and P_i; z_i revealed to A only",
)
