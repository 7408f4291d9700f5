"""Wire formats of ``paillier``: the public key and ciphertext blobs.

No pickle; every field is validated and anything malformed is a ProtocolError
naming the sender (docs/design.md §2). Public key: b"SVPK", version, u16 byte length,
n big-endian, nothing else (a key with extra bytes is refused: only n is public).
Blob: b"SVPB", version, section count; per section a u32 length, a header (layout,
scale, slot bits, slots, rows, cols, ciphertext bytes, count) and ``count``
fixed-width big-endian ciphertexts of 2|n| bits. One scale per section, no
per-value exponent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import gmpy2

from securevfl.errors import ProtocolError
from securevfl.exchange.paillier.encoding import COLS, ROWS, block_count
from securevfl.exchange.paillier.options import MAX_KEY_BITS

PUB_MAGIC = b"SVPK"
BLOB_MAGIC = b"SVPB"
VERSION = 1
PUB_HEAD = struct.Struct(">4sBH")  # magic, version, byte length of n
BLOB_HEAD = struct.Struct(">4sBB")  # magic, version, number of sections
SEC_LEN = struct.Struct(">I")
SEC_HEAD = struct.Struct(">BBHHIIHI")  # layout, scale, slot bits, slots, rows, cols, ct bytes, count
MAX_DIM = 1 << 24


@dataclass
class Section:
    """One packed matrix: its layout and scale, and its ciphertexts."""

    layout: int
    scale: int
    slot_bits: int
    slots: int
    rows: int
    cols: int
    cts: list[Any]

    def count(self) -> int:
        r, c = (self.rows, self.cols) if self.layout == COLS else (self.cols, self.rows)
        return c * block_count(r, self.slots)


def ciphertext_bytes(n2: Any) -> int:
    return (int(n2).bit_length() + 7) // 8


def dump_blob(sections: list[Section], ct_bytes: int) -> bytes:
    out = [BLOB_HEAD.pack(BLOB_MAGIC, VERSION, len(sections))]
    for sec in sections:
        head = SEC_HEAD.pack(
            sec.layout, sec.scale, sec.slot_bits, sec.slots, sec.rows, sec.cols, ct_bytes, len(sec.cts)
        )
        body = b"".join([head, *(c.to_bytes(ct_bytes, "big") for c in sec.cts)])
        out += [SEC_LEN.pack(len(body)), body]
    return b"".join(out)


def load_blob(blob: bytes, n: Any, n2: Any, who: str) -> list[Section]:
    """Parse and validate a blob; anything malformed is a ProtocolError naming ``who``."""

    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"{who}: malformed Paillier ciphertext blob: {why}")

    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise bad("not bytes")
    blob = bytes(blob)
    if len(blob) < BLOB_HEAD.size:
        raise bad(f"{len(blob)} bytes is shorter than the header")
    magic, version, nsec = BLOB_HEAD.unpack_from(blob, 0)
    if magic != BLOB_MAGIC or version != VERSION:
        raise bad("wrong magic or version")
    if not 1 <= nsec <= 2:
        raise bad(f"{nsec} sections")
    ct_bytes = ciphertext_bytes(n2)
    n_bits = n.bit_length()
    pos = BLOB_HEAD.size
    secs: list[Section] = []
    for _ in range(nsec):
        if pos + SEC_LEN.size > len(blob):
            raise bad("truncated section length")
        (length,) = SEC_LEN.unpack_from(blob, pos)
        pos += SEC_LEN.size
        if length < SEC_HEAD.size or pos + length > len(blob):
            raise bad("section length out of range")
        layout, scale, sbits, slots, rows, cols, cb, count = SEC_HEAD.unpack_from(blob, pos)
        if layout not in (COLS, ROWS) or any(s.layout == layout for s in secs):
            raise bad(f"layout {layout}")
        if not (1 <= rows <= MAX_DIM and 1 <= cols <= MAX_DIM):
            raise bad(f"shape {rows}x{cols}")
        if not (16 <= sbits <= n_bits - 1 and slots >= 1 and slots * sbits <= n_bits - 1):
            raise bad(f"{slots} slots of {sbits} bits do not fit a {n_bits}-bit modulus")
        if cb != ct_bytes:
            raise bad(f"ciphertexts of {cb} bytes, expected {ct_bytes}")
        sec = Section(layout, scale, sbits, slots, rows, cols, [])
        if count != sec.count() or length != SEC_HEAD.size + count * cb:
            raise bad(f"{count} ciphertexts in {length} bytes for a {rows}x{cols} matrix")
        body = pos + SEC_HEAD.size
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


def dump_public(n: Any) -> bytes:
    nb = (n.bit_length() + 7) // 8
    return PUB_HEAD.pack(PUB_MAGIC, VERSION, nb) + n.to_bytes(nb, "big")


def load_public(data: bytes, who: str, min_bits: int) -> Any:
    """n from a public key; malformed data or a modulus below ``min_bits`` is refused."""

    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"{who}: malformed Paillier public key: {why}")

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise bad("not bytes")
    data = bytes(data)
    if len(data) < PUB_HEAD.size:
        raise bad("too short")
    magic, version, nb = PUB_HEAD.unpack_from(data, 0)
    if magic != PUB_MAGIC or version != VERSION:
        raise bad("wrong magic or version")
    if len(data) != PUB_HEAD.size + nb:
        raise bad(f"{len(data)} bytes for a {nb}-byte modulus (only n is accepted)")
    if nb == 0 or data[PUB_HEAD.size] == 0:
        raise bad("non-canonical encoding")
    n = gmpy2.mpz.from_bytes(data[PUB_HEAD.size :], "big")
    if n.bit_length() > MAX_KEY_BITS or n % 2 == 0 or gmpy2.is_square(n):
        raise bad("not a plausible RSA modulus")
    if n.bit_length() < min_bits:
        raise ProtocolError(
            f"{who}: Paillier public key of {n.bit_length()} bits is below key_bits={min_bits}; refused"
        )
    return n


__all__ = [
    "BLOB_HEAD",
    "BLOB_MAGIC",
    "PUB_HEAD",
    "PUB_MAGIC",
    "ROWS",
    "SEC_HEAD",
    "SEC_LEN",
    "Section",
    "ciphertext_bytes",
    "dump_blob",
    "dump_public",
    "load_blob",
    "load_public",
]
