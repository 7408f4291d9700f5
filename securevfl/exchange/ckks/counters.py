"""Counts of CKKS primitive operations, so that a step's cost can be compared
with its floor: counts x unit costs measured on the same machine
(docs/crypto-performance.md §7). Pure bookkeeping: counting reveals
nothing beyond the shapes, which both parties know from the protocol file."""

from __future__ import annotations

from dataclasses import dataclass, fields

#: operations counted, in the order reports print them
OPS = (
    "encrypt",  # fresh symmetric encryption of one ciphertext (the key owner's inputs)
    "encrypt_public",  # public-key encryption of a mask (re-randomizes each result)
    "decrypt",  # decryption and decoding of one ciphertext
    "encode",  # one CKKS encoding of a slot vector (diagonals, masks, inputs)
    "multiply_plain",  # ciphertext x plaintext
    "add",  # ciphertext + ciphertext
    "rotate",  # rotations asked for (each costs key_switch switchings)
    "key_switch",  # Galois key switchings actually done (rotations by NAF weight, conjugations)
    "rescale",  # rescale by the last data prime
    "serialize",  # a ciphertext written to bytes
    "deserialize",  # a ciphertext read (and checked by SEAL) from bytes
)


@dataclass
class OpCounter:
    """Per-object counts (one for a key owner, one for each peer it evaluates for)."""

    encrypt: int = 0
    encrypt_public: int = 0
    decrypt: int = 0
    encode: int = 0
    multiply_plain: int = 0
    add: int = 0
    rotate: int = 0
    key_switch: int = 0
    rescale: int = 0
    serialize: int = 0
    deserialize: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)

    def __add__(self, other: OpCounter) -> OpCounter:
        return OpCounter(**{k: v + other.as_dict()[k] for k, v in self.as_dict().items()})


def floor_seconds(counts: dict[str, int], unit_s: dict[str, float]) -> float:
    """Sum of counts x unit costs; ``rotate`` is priced through ``key_switch``
    (a rotation is its key switchings), so it is skipped here."""
    return sum(n * unit_s.get(op, 0.0) for op, n in counts.items() if op != "rotate")
