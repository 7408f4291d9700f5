"""CrypTen's control objects as JSON of a closed set of types: nothing a peer
sends is ever unpickled (:meth:`.communicator.FramedCommunicator.send_obj`, the
dealer's requests in :mod:`.runtime`)."""

from __future__ import annotations

import json
from typing import Any

import torch


def encode_obj(obj: Any) -> bytes:
    """Encode a CrypTen control object (str/int/float/bool/None, lists, tuples,
    dicts with str keys, torch.Size) as JSON; anything else is refused."""

    def enc(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, torch.Size):
            return {"__t": "size", "v": [int(x) for x in o]}
        if isinstance(o, tuple):
            return {"__t": "tuple", "v": [enc(x) for x in o]}
        if isinstance(o, list):
            return [enc(x) for x in o]
        if isinstance(o, dict) and all(isinstance(k, str) for k in o):
            return {"__t": "dict", "v": {k: enc(v) for k, v in o.items()}}
        raise TypeError(f"securevfl does not send objects of type {type(o).__name__} between parties")

    return json.dumps(enc(obj)).encode()


def decode_obj(raw: bytes) -> Any:
    """Inverse of :func:`encode_obj`; malformed input raises ValueError."""

    def dec(o: Any) -> Any:
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, list):
            return [dec(x) for x in o]
        if isinstance(o, dict):
            kind = o.get("__t")
            if kind == "size" and all(isinstance(x, int) and x >= 0 for x in o["v"]):
                return torch.Size(o["v"])
            if kind == "tuple":
                return tuple(dec(x) for x in o["v"])
            if kind == "dict" and isinstance(o.get("v"), dict):
                return {str(k): dec(v) for k, v in o["v"].items()}
        raise ValueError("malformed object")

    return dec(json.loads(raw.decode()))
