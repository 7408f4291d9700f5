"""Counts of the primitive operations ``paillier`` performs in this process.

Each party is its own OS process, so a counter counts one party's work. What is
counted (docs/crypto-performance.md §7: count primitives, multiply by unit costs
measured in the same run, and the product is the protocol's floor):

- ``encryptions``: plaintexts encrypted by the key owner (one obfuscator each);
- ``decryptions``: ciphertexts decrypted by the key owner (two half-size
  exponentiations each, by CRT);
- ``obfuscations``: fresh randomizers the evaluator multiplies into its outputs;
- ``ct_scalar``: ciphertext x plaintext-scalar products (non-zero exponents) in
  the multi-exponentiations of ``matmul``/``tmatmul``;
- ``ct_add``: ciphertext + ciphertext additions (the sums of those products, and
  the mask added to every output);
- ``modexps``: calls of gmpy2 ``powmod`` with an exponent of at least |p| bits
  (decryption, table set-up); the window squarings of the multi-exponentiation are
  counted as ``mulmods``;
- ``mulmods``: modular multiplications (multi-exponentiation tables and
  accumulations, fixed-base obfuscators, window squarings as w each).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields


@dataclass
class OpCounts:
    encryptions: int = 0
    decryptions: int = 0
    obfuscations: int = 0
    ct_scalar: int = 0
    ct_add: int = 0
    modexps: int = 0
    mulmods: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def minus(self, other: OpCounts) -> OpCounts:
        return OpCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


_COUNTS = OpCounts()
_LOCK = threading.Lock()


def count(**deltas: int) -> None:
    """Add to this process's counters (names as in :class:`OpCounts`)."""
    with _LOCK:
        for name, k in deltas.items():
            setattr(_COUNTS, name, getattr(_COUNTS, name) + int(k))


def snapshot() -> OpCounts:
    with _LOCK:
        return OpCounts(**_COUNTS.as_dict())


@contextmanager
def counting() -> Iterator[OpCounts]:
    """``with counting() as c:`` fills ``c`` with the operations done inside the block."""
    before = snapshot()
    out = OpCounts()
    try:
        yield out
    finally:
        for name, v in snapshot().minus(before).as_dict().items():
            setattr(out, name, v)
