"""Diffie-Hellman PSI arithmetic over Curve25519 with X25519 (pure functions).

The protocol is the classic commutative-blinding PSI (Meadows 1986; Huberman,
Franklin and Hogg 1999): with H a hash onto the curve and secret scalars a and b,
``b * (a * H(x)) == a * (b * H(x))``, so two parties can compare their sets in a
doubly blinded form while each blinded element is pseudorandom to anyone without
the scalar (DDH). :mod:`securevfl.data.alignment` runs it on the wire; this
module only holds the arithmetic.

Blinding: X25519 (RFC 7748), the Montgomery-ladder scalar multiplication on
u-coordinates, computed by OpenSSL through ``cryptography``. Its scalars are
clamped (a multiple of the cofactor 8, top bit fixed), so blinding commutes and
also clears any small-order component. This is how SecretFlow's ECDH-PSI uses
Curve25519 (``psi/cryptor/sodium_curve25519_cryptor.cc``: libsodium's
``crypto_scalarmult_curve25519`` on 32-byte points). X25519 has no scalar
inverse, so A blinds each passive party's setup with its own scalar instead of
unblinding the response (:mod:`~securevfl.data.alignment`).

Hash: SecretFlow hashes an ID with SHA-256 straight to a u-coordinate. About
half of all u-coordinates lie on the quadratic twist rather than on the curve,
and blinding keeps a point on its side, so every blinded element would tell its
receiver one bit of a public hash of the ID behind it (curve or twist): a leak
beyond what PSI promises (SECURITY.md §3). securevfl instead hashes with RFC
9380's Elligator 2 map (suite ``curve25519_XMD:SHA-512_ELL2_NU_``:
``expand_message_xmd`` over SHA-512 to one field element, then
``map_to_curve_elligator2``), so every H(x) lies on the curve itself; RFC 9380's
final ``clear_cofactor`` (times 8) is left to the clamped scalar. The random-
oracle suite (``_RO_``, two maps and a point addition) needs two square roots
and costs about 48 us per ID in Python, which would cancel X25519's gain; why
the one-map encoding is enough for this protocol is argued in SECURITY.md §3.
The field arithmetic runs on GMP through ``gmpy2``.

Measured on the 2-core development box (``benchmarks/scale.py --unit-costs``,
CPU time, same process, same load): a hash costs about 7 us and a blinding
about 33 us, against 16 us and 43 us for the ristretto255 engine used before
(libsodium through ``rbcl``); blindings are five sixths of all PSI operations.
``cryptography``'s X25519 holds the GIL (two threads blind no faster than one:
53 against 50 us an element, measured), so :class:`Blinder` spreads large
batches over worker processes of the party that owns the key instead.

Elements travel packed: ``n`` elements are one ``bytes`` of ``32 * n``, each a
little-endian u-coordinate below 2^255 - 19.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import gmpy2
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from securevfl.runtime.lifeline import die_with
from securevfl.runtime.safepath import safe_children

ELEMENT_BYTES = 32  # an X25519 u-coordinate, little-endian
#: RFC 9380 domain-separation tag: the suite id prefixed with this application.
DST = b"securevfl-psi-v2-curve25519_XMD:SHA-512_ELL2_NU_"
_SHA512_BLOCK = 128
_SHA512_OUT = 64

# Curve25519 (RFC 7748): v^2 = u^3 + A u^2 + u over GF(P); RFC 9380 §8.5 and §6.7.1
# for the Elligator 2 constants (Z = 2, L = 48).
P = gmpy2.mpz(2**255 - 19)
A = gmpy2.mpz(486662)
_Z = gmpy2.mpz(2)
_L = 48
_A24 = (A + 2) // 4


class InvalidElement(ValueError):
    """A packed element is not a canonical X25519 u-coordinate (or would blind to
    the all-zero output of a small-order point); the caller names the peer that
    sent it."""


def expand_message_xmd(msg: bytes, dst: bytes, len_in_bytes: int) -> bytes:
    """RFC 9380 §5.3.1 ``expand_message_xmd`` with SHA-512: ``len_in_bytes``
    uniform bytes from ``msg`` under domain-separation tag ``dst``."""
    if len(dst) > 255:
        raise ValueError("domain-separation tag longer than 255 bytes")
    ell = -(-len_in_bytes // _SHA512_OUT)
    if ell > 255 or len_in_bytes > 65535:
        raise ValueError(f"cannot expand to {len_in_bytes} bytes")
    dst_prime = dst + bytes([len(dst)])
    b0 = hashlib.sha512(
        bytes(_SHA512_BLOCK) + msg + len_in_bytes.to_bytes(2, "big") + b"\x00" + dst_prime
    ).digest()
    out = [hashlib.sha512(b0 + b"\x01" + dst_prime).digest()]
    for i in range(2, ell + 1):
        prev = (int.from_bytes(b0, "big") ^ int.from_bytes(out[-1], "big")).to_bytes(_SHA512_OUT, "big")
        out.append(hashlib.sha512(prev + bytes([i]) + dst_prime).digest())
    return b"".join(out)[:len_in_bytes]


def map_to_curve_elligator2_x(u: gmpy2.mpz) -> gmpy2.mpz:
    """RFC 9380 §6.7.1 Elligator 2 for Curve25519, u-coordinate only: the x of
    ``map_to_curve(u)``. No square root is needed for x (X25519 never uses y)."""
    tv1 = _Z * u * u % P
    if tv1 == P - 1:
        tv1 = gmpy2.mpz(0)
    xd = tv1 + 1  # x1 = -A / (1 + Z u^2) = x1n / xd
    x1n = P - A
    gx1 = ((x1n + A * xd) * x1n + xd * xd) * x1n % P  # g(x1) = gx1 / xd^3
    # x = x1 if g(x1) is square (0 counts as one), else x2 = -x1 - A = x1n Z u^2 / xd
    xn = x1n if gmpy2.legendre(gx1 * xd % P, P) >= 0 else x1n * tv1 % P
    return xn * gmpy2.invert(xd, P) % P


def clear_cofactor_x(x: int) -> int:
    """u-coordinate of 8 * (point with u-coordinate ``x``): three x-only doublings
    (RFC 7748's ladder formulas). RFC 9380's ``clear_cofactor``; PSI leaves it to
    the clamped X25519 scalar, a multiple of 8, and the tests use it to check this
    module against RFC 9380's vectors."""
    X, Zc = gmpy2.mpz(x), gmpy2.mpz(1)
    for _ in range(3):
        s, d = (X + Zc) ** 2 % P, (X - Zc) ** 2 % P
        e = s - d
        X, Zc = s * d % P, e * (d + _A24 * e) % P
    return int(X * gmpy2.invert(Zc, P) % P) if Zc else 0


def encode_to_curve_x(msg: bytes, dst: bytes = DST) -> int:
    """RFC 9380 ``encode_to_curve`` (curve25519_XMD:SHA-512_ELL2_NU_) up to its
    final ``clear_cofactor``: the u-coordinate of ``map_to_curve(hash_to_field(msg))``."""
    u = gmpy2.mpz(int.from_bytes(expand_message_xmd(msg, dst, _L), "big")) % P
    return int(map_to_curve_elligator2_x(u))


def default_workers() -> int:
    """Worker processes for a large batch: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def hash_to_group(ids: Sequence[str]) -> bytes:
    """Every ID hashed onto the curve, packed in input order. One thread: the
    field arithmetic holds the GIL."""
    return b"".join(encode_to_curve_x(i.encode("utf-8")).to_bytes(ELEMENT_BYTES, "little") for i in ids)


def count(packed: bytes) -> int:
    """Number of elements in a packed buffer (its length must be a multiple of 32)."""
    if len(packed) % ELEMENT_BYTES:
        raise InvalidElement(f"{len(packed)} bytes is not a whole number of {ELEMENT_BYTES}-byte elements")
    return len(packed) // ELEMENT_BYTES


def check_canonical(packed: bytes) -> None:
    """Refuse any element that is not a canonical u-coordinate: the top bit set
    (RFC 7748 would silently ignore it) or a value of p or more. Two encodings of
    one point would otherwise never match."""
    n = count(packed)
    if not n:
        return
    raw = np.frombuffer(packed, dtype=np.uint8).reshape(n, ELEMENT_BYTES)
    bad = raw[:, 31] >= 0x80
    # p = 2^255 - 19 is 0xed, 0xff * 30, 0x7f little-endian: u >= p only just below 2^255
    bad |= (raw[:, 31] == 0x7F) & (raw[:, 1:31] == 0xFF).all(axis=1) & (raw[:, 0] >= 0xED)
    if bad.any():
        raise InvalidElement(f"element {int(np.flatnonzero(bad)[0])} is not a canonical curve25519 encoding")


def unpack(packed: bytes) -> list[bytes]:
    """The elements of a packed buffer, each 32 bytes."""
    n = count(packed)
    return [packed[i * ELEMENT_BYTES : (i + 1) * ELEMENT_BYTES] for i in range(n)]


class Key:
    """A party's secret X25519 scalar. Fresh for every run (``Key.fresh()``) and
    never serialized: it stays in its owner's process. ``repr`` hides it."""

    __slots__ = ("_private",)

    def __init__(self, private: X25519PrivateKey):
        self._private = private

    @classmethod
    def fresh(cls) -> Key:
        return cls(X25519PrivateKey.generate())

    def __repr__(self) -> str:
        return "Key(<secret>)"


def _blind(private: X25519PrivateKey, packed: bytes, offset: int = 0) -> bytes:
    """Every packed element blinded with ``private``; element numbers in errors
    count from ``offset`` (the slice's place in the caller's batch)."""
    check_canonical(packed)
    exchange = private.exchange
    load = X25519PublicKey.from_public_bytes
    E = ELEMENT_BYTES
    out = []
    for i in range(count(packed)):
        try:
            out.append(exchange(load(packed[i * E : (i + 1) * E])))
        except ValueError:
            raise InvalidElement(f"element {offset + i} is a small-order point") from None
    return b"".join(out)


def multiply(key: Key, packed: bytes) -> bytes:
    """Every packed element blinded with ``key`` (X25519), packed in the same
    order. Raises :class:`InvalidElement` for a non-canonical element or a
    small-order one (its output would be all zeros)."""
    return _blind(key._private, packed)


def _blind_slice(private_raw: bytes, packed: bytes, offset: int) -> bytes:
    """:func:`_blind` in a worker process (the scalar arrives as raw bytes from
    the process that owns it)."""
    return _blind(X25519PrivateKey.from_private_bytes(private_raw), packed, offset)


@dataclass(frozen=True)
class Pending:
    """A batch being blinded: its slices, in order."""

    parts: list[Future[bytes]]

    def result(self) -> bytes:
        """The blinded batch, once every slice is done; a slice's error is raised."""
        return b"".join(p.result() for p in self.parts)


class Blinder:
    """Blinds batches with one party's key on ``workers`` processes of that party.

    X25519 holds the GIL, so a party that must blind millions of elements while
    another core idles (A blinding every passive party's setup) needs processes,
    not threads. The workers are spawned children of the key's owner: the scalar
    goes to them over a local pipe and never leaves the party's machine or its
    process tree (SECURITY.md §3); they exit with the ``with`` block, or with
    this process if it ends without leaving the block. Batches
    below ``min_parallel`` elements, or ``workers == 1``, are blinded in this
    process. :meth:`submit` returns at once, so the caller can receive messages
    while the workers blind.
    """

    def __init__(
        self,
        key: Key,
        workers: int | None = None,
        *,
        min_parallel: int = 50_000,
        slice_elements: int = 1 << 16,
    ):
        """``min_parallel``: elements below which a batch is blinded in the calling
        process (a spawned worker costs about half a second to start: imports).
        ``slice_elements``: elements per task, small enough to balance the
        workers, large enough that a task's pickling is noise (2 MiB)."""
        if slice_elements < 1:
            raise ValueError("slice_elements must be positive")
        self._key = key
        self._workers = workers or default_workers()
        self._min_parallel = min_parallel
        self._slice = slice_elements
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Blinder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # each worker ends with this process, however it ends (a rank stopped by
            # SIGTERM or SIGKILL, or one ending itself with os._exit when a peer is lost,
            # never runs close()): the workers hold the key and ~0.4 GB each; they start
            # without the working directory on their import path (SECURITY.md §4b)
            with safe_children():  # and its resource tracker, started with its queues
                self._pool = ProcessPoolExecutor(
                    self._workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=die_with,
                    initargs=(os.getpid(),),
                )
        return self._pool

    def submit(self, packed: bytes) -> Pending:
        """Start blinding ``packed``; :meth:`Pending.result` gives :func:`multiply`'s
        result (and raises what it would raise)."""
        check_canonical(packed)  # here, so that an element's number is its place in the batch
        n = count(packed)
        if self._workers == 1 or n < self._min_parallel:
            done: Future[bytes] = Future()
            try:
                done.set_result(multiply(self._key, packed))
            except InvalidElement as exc:
                done.set_exception(exc)
            return Pending([done])
        raw = self._key._private.private_bytes_raw()
        pool = self._executor()
        E = ELEMENT_BYTES
        with safe_children():  # the pool starts its workers as work is submitted
            return Pending(
                [
                    pool.submit(_blind_slice, raw, packed[lo * E : min(lo + self._slice, n) * E], lo)
                    for lo in range(0, n, self._slice)
                ]
            )

    def multiply(self, packed: bytes) -> bytes:
        """:func:`multiply` with this blinder's key, on its workers when large."""
        return self.submit(packed).result()


def sorted_elements(packed: bytes) -> bytes:
    """The packed elements in byte order: a set sent this way carries no trace of
    the order its owner holds the IDs in."""
    return b"".join(sorted(unpack(packed)))
