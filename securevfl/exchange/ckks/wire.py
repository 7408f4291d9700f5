"""What crosses the wire under ``ckks``: ciphertext blobs and the public part.

Nothing is pickled (docs/design.md §2). A blob is a fixed header (magic, version,
layout: rows, cols, nb, bp, chunk, count) then length-prefixed SEAL
ciphertexts in SEAL's own serialization, which SEAL checks against the context
on load. The public part is a header (magic, version, two lengths), the TenSEAL
context made public (parameters and public key; no secret or relinearization
key) and the Galois keys.

Threat model: the receiver of a blob or of a public part is the other,
semi-honest, party; a malformed or unexpected one raises (ProtocolError at the
caller, naming the sender) rather than being used. A public part that carries
a secret key is refused by the peer (:mod:`securevfl.exchange.ckks.peer`).
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from typing import Any

from securevfl.exchange.ckks._tenseal import sa
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.packing import SlotLayout

MAGIC = b"SVCK"
PUB_MAGIC = b"SVCP"
VERSION = 1
HEADER = struct.Struct("<4sBIIIIII")  # magic, version, rows, cols, nb, bp, chunk, count
PUB_HEADER = struct.Struct("<4sBQQ")  # magic, version, context length, Galois keys length
LEN = struct.Struct("<I")


def scratch_root() -> str | None:
    """Where SealIO keeps its one file: shared memory (tmpfs) where the host has
    it, the default temporary directory otherwise. (De)serializing through a disk
    file cost 4-5 ms per ciphertext on the development box, through /dev/shm 1-2 ms.
    Only public material passes through it (ciphertexts, public keys); the
    directory is private to this process's user (mode 0700) either way."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


class SealIO:
    """SEAL objects <-> bytes. The SEAL bindings only (de)serialize through a
    path, so this goes through one file in a private temporary directory."""

    def __init__(self, sc: Any, counter: OpCounter):
        self.sc = sc
        self.ops = counter
        self.slots = sa.CKKSEncoder(sc).slot_count()  # (also loads the SEAL bindings' types)
        n_mod = len(sc.first_context_data().parms().coeff_modulus())
        self.max_ct_bytes = 2 * n_mod * self.slots * 2 * 8 + 4096
        self._dir = tempfile.TemporaryDirectory(prefix="securevfl-ckks-", dir=scratch_root())
        self._path = os.path.join(self._dir.name, "obj")
        self._lock = threading.Lock()

    def dump(self, obj: Any) -> bytes:
        with self._lock:
            obj.save(self._path)
            with open(self._path, "rb") as f:
                data = f.read()
        self.ops.serialize += 1
        return data

    def load(self, data: bytes, obj: Any = None) -> Any:
        """Load a SEAL object (a ciphertext unless ``obj`` is given); SEAL checks
        it against the context and raises on anything malformed."""
        obj = sa.Ciphertext() if obj is None else obj
        with self._lock:
            with open(self._path, "wb") as f:
                f.write(data)
            obj.load(self.sc, self._path)
        self.ops.deserialize += 1
        return obj


def frame(layout: SlotLayout, cts: list[bytes]) -> bytes:
    """One blob: the header, then each serialized ciphertext with its length."""
    head = HEADER.pack(MAGIC, VERSION, layout.rows, layout.cols, layout.nb, layout.bp, layout.chunk, len(cts))
    return b"".join([head, *(LEN.pack(len(c)) + c for c in cts)])


def unframe(blob: bytes, io: SealIO, what: str) -> tuple[SlotLayout, list[Any]]:
    """Parse and validate a blob; raises ValueError with the reason."""
    if not isinstance(blob, bytes | bytearray) or len(blob) < HEADER.size:
        raise ValueError(f"{what}: too short for a ckks blob")
    magic, version, rows, cols, nb, bp, chunk, count = HEADER.unpack_from(blob, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"{what}: not a ckks blob (bad magic or version)")
    layout = SlotLayout(rows, cols, nb, bp, chunk)
    if not layout.valid(io.slots) or count != layout.n_ct:
        raise ValueError(f"{what}: inconsistent layout {layout} with {count} ciphertexts")
    off, raw = HEADER.size, []
    for _ in range(count):
        if off + LEN.size > len(blob):
            raise ValueError(f"{what}: truncated")
        (n,) = LEN.unpack_from(blob, off)
        off += LEN.size
        if n > io.max_ct_bytes or off + n > len(blob):
            raise ValueError(f"{what}: ciphertext length {n} out of range")
        raw.append(bytes(blob[off : off + n]))
        off += n
    if off != len(blob):
        raise ValueError(f"{what}: {len(blob) - off} trailing bytes")
    cts = []
    for r in raw:
        try:
            cts.append(io.load(r))
        except Exception as exc:  # SEAL raises std exceptions (ValueError/RuntimeError/...)
            raise ValueError(f"{what}: invalid SEAL ciphertext ({exc})") from None
    return layout, cts


def check_level(cts: list[Any], levels: list[Any], scale: float, what: str) -> None:
    """Every ciphertext is fresh-sized (2 polynomials), in NTT form, at one of
    ``levels`` and at exactly ``scale``; raises ValueError otherwise."""
    allowed = [list(p) for p in levels]
    for c in cts:
        if c.size() != 2 or not c.is_ntt_form() or list(c.parms_id()) not in allowed or c.scale != scale:
            raise ValueError(f"{what}: ciphertext at an unexpected level, size or scale")


def pack_public(ctx_bytes: bytes, galois: bytes) -> bytes:
    """The public part: header, public TenSEAL context, Galois keys."""
    return PUB_HEADER.pack(PUB_MAGIC, VERSION, len(ctx_bytes), len(galois)) + ctx_bytes + galois


def unpack_public(public: bytes) -> tuple[bytes, bytes]:
    """(context bytes, Galois-key bytes); raises ValueError on a bad header or length."""
    if len(public) < PUB_HEADER.size:
        raise ValueError("too short")
    magic, version, n_ctx, n_gk = PUB_HEADER.unpack_from(public, 0)
    if magic != PUB_MAGIC or version != VERSION or PUB_HEADER.size + n_ctx + n_gk != len(public):
        raise ValueError("bad header or length")
    return public[PUB_HEADER.size : PUB_HEADER.size + n_ctx], public[PUB_HEADER.size + n_ctx :]
