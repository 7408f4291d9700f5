"""Fixed-point encoding and FATE-style slot packing for ``paillier`` (pure functions).

Fixed point: one public scale per blob, never a per-value exponent (phe's default
encoding sends an exponent per value in the clear, which leaks its magnitude;
docs/crypto-performance.md §4). Packing: a plaintext holds ``slots`` signed slots
of ``s`` bits, sum_i y_i 2^(i s); negative totals wrap mod n and are read back with
a bias of 2^(s-1) per slot (FATE ``cipher_compressor``; only additions and one
scalar per ciphertext work on packed plaintexts). Layouts: ``COLS`` packs
consecutive rows of one column into a ciphertext, ``ROWS`` consecutive columns of
one row (the ``COLS`` layout of the transpose).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from securevfl.errors import ConfigError

COLS, ROWS = 0, 1
LAYOUTS = {"cols": COLS, "rows": ROWS}


def encode(x: np.ndarray, frac: int, bound_bits: int, what: str, field: str) -> np.ndarray:
    """round(x 2^frac) as int64; refuses non-finite values and |x| >= 2^bound_bits
    (a ConfigError naming the option ``field`` that widens the range; the message
    names the bound, not the value, since it reaches every peer)."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"paillier: {what} is not finite")
    big = float(np.max(np.abs(x))) if x.size else 0.0
    if big >= 2.0**bound_bits:
        raise ConfigError(
            f"{what} does not fit the fixed-point range |x| < 2^{bound_bits}; "
            f"raise {field} (it widens the packing slots)",
            path=f"exchange.params.{field}",
        )
    return np.rint(np.ldexp(x, frac)).astype(np.int64)


def block_count(rows: int, slots: int) -> int:
    """Ciphertexts per packed column: ceil(rows / slots)."""
    return -(-rows // slots)


def arrange(a: np.ndarray, layout: int, slots: int) -> np.ndarray:
    """(rows x cols) -> (ciphertexts x slots) in the given layout, zero-padded."""
    if layout == ROWS:
        a = a.T
    c, r = a.shape[1], a.shape[0]
    nb = block_count(r, slots)
    pad = np.zeros((nb * slots, c), dtype=a.dtype)
    pad[:r] = a
    return pad.T.reshape(c * nb, slots)


def unarrange(vals: np.ndarray, layout: int, rows: int, cols: int, slots: int) -> np.ndarray:
    """Inverse of :func:`arrange`: (ciphertexts x slots) -> (rows x cols)."""
    if layout == ROWS:
        rows, cols = cols, rows
    nb = block_count(rows, slots)
    out = vals.reshape(cols, nb * slots).T[:rows]
    return out.T if layout == ROWS else out


def slot_bias(slots: int, s: int) -> int:
    """sum_i 2^(i s + s - 1): the offset that makes every signed slot non-negative."""
    return sum(1 << (i * s + s - 1) for i in range(slots))


def pack(y: np.ndarray, s: int) -> list[int]:
    """Signed slots (ciphertexts x slots; int64, or Python ints of any size) ->
    packed integers sum_i y_i 2^(i s)."""
    if y.dtype == object:
        return [sum(int(v) << (i * s) for i, v in enumerate(row)) for row in y.tolist()]
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
    bias = slot_bias(slots, s)
    return [int.from_bytes(row.tobytes(), "little") - bias for row in raw]


def unpack_ints(ms: list[Any], n: Any, slots: int, s: int) -> np.ndarray:
    """Plaintexts mod n -> the exact signed slot values (ciphertexts x slots, Python
    ints): negative totals wrap mod n and are read back centred."""
    half = n >> 1
    bias = slot_bias(slots, s)
    low = (1 << s) - 1
    top = 1 << (s - 1)
    out = np.empty((len(ms), slots), dtype=object)
    for r, m in enumerate(ms):
        t = int((m - n if m > half else m) + bias)
        out[r] = [((t >> (i * s)) & low) - top for i in range(slots)]
    return out


def unpack(ms: list[Any], n: Any, slots: int, s: int) -> np.ndarray:
    """Plaintexts mod n -> float64 slot values (ciphertexts x slots), unscaled."""
    half = n >> 1
    bias = slot_bias(slots, s)
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
