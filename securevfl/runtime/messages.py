"""Message tags and control-message schemas.

Every message on the wire carries a tag from this table; a receiver states the tag
it expects, and anything else aborts the run naming sender and tag. Control
messages are UTF-8 JSON validated by a strict pydantic model: nothing from a peer
is ever unpickled. Backends and defenses add their own tags with
:func:`register_tag`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.int64,
    4: torch.uint8,
    5: torch.int32,
    6: torch.int8,
    7: torch.float16,
    8: torch.bool,
}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Tag:
    name: str
    dtypes: frozenset[torch.dtype]
    description: str

    @property
    def code(self) -> int:
        return zlib.crc32(self.name.encode()) & 0x7FFFFFFF


TAGS: dict[int, Tag] = {}


def register_tag(name: str, dtypes: set[torch.dtype], description: str) -> Tag:
    tag = Tag(name, frozenset(dtypes), description)
    existing = TAGS.get(tag.code)
    if existing is not None and existing.name != name:
        raise ValueError(f"tag code collision: {name} vs {existing.name}")
    TAGS[tag.code] = tag
    return tag


def tag_by_code(code: int) -> Tag | None:
    return TAGS.get(code)


FLOATS = {torch.float32, torch.float64}
BYTES = {torch.uint8}

# core tags (plain exchange, PSI, control)
EMBEDDING = register_tag(
    "embedding", FLOATS | BYTES, "passive -> active: h'_i for one batch (plain; +-1 codes as packed bits)"
)
EMB_GRAD = register_tag("embedding_grad", FLOATS, "active -> passive: dL/dh'_i (plain)")
PSI_HELLO = register_tag("psi_hello", BYTES, "active -> passive: client set size (JSON)")
PSI_SETUP = register_tag(
    "psi_setup", BYTES, "passive -> active: own IDs hashed, blinded, sorted (32-byte elements)"
)
PSI_REQUEST = register_tag(
    "psi_request", BYTES, "active -> passive: A's IDs hashed and blinded (32-byte elements)"
)
PSI_RESPONSE = register_tag("psi_response", BYTES, "passive -> active: the request blinded again, in order")
PSI_RESULT = register_tag("psi_result", BYTES, "active -> passive: agreed intersection (JSON)")
CONTROL = register_tag("control", BYTES, "small JSON control message")
