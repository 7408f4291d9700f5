"""``ckks``: the two-party HE interactive layer (:mod:`securevfl.exchange.he`) with CKKS.

What it protects: W_i exists only as two additive shares (A's and P_i's); every
operand that crosses to the other party is a CKKS ciphertext under the key of
the party that produced it (P_i's h'_i, A's dL/dz) or a value the receiver may
learn plus a uniform mask. A learns z_i = h'_i W_i (the declared output); P_i
learns dL/dh'_i (DESIGN §4, SECURITY.md ``ckks``). Semi-honest parties;
TenSEAL/SEAL with 128-bit parameters.

Modules, one job each:

* :mod:`~securevfl.exchange.ckks.params`: options, the 128-bit and mask checks, the context;
* :mod:`~securevfl.exchange.ckks.packing`: slot layouts and the diagonal maps (pure numpy);
* :mod:`~securevfl.exchange.ckks.wire`: blobs and the public part on the wire;
* :mod:`~securevfl.exchange.ckks.kernels`: BSGS evaluation of the maps with SEAL (chained baby
  steps, Horner giant steps);
* :mod:`~securevfl.exchange.ckks.worker`: one computation on a thread while the party waits;
* :mod:`~securevfl.exchange.ckks.key` / :mod:`~securevfl.exchange.ckks.peer`: the key owner and the evaluator;
* :mod:`~securevfl.exchange.ckks.counters`: primitive-operation counts for floors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.csprng import SecretStream
from securevfl.exchange.ckks.counters import OPS, OpCounter, floor_seconds
from securevfl.exchange.ckks.kernels import chain_cost, naf_weight, signed_units
from securevfl.exchange.ckks.key import CkksKey
from securevfl.exchange.ckks.packing import (
    Layout,
    LinearMap,
    matmul_map,
    simulate,
    standard_layout,
    tmatmul_map,
)
from securevfl.exchange.ckks.params import (
    MAX_BITS_128,
    MAX_PRIME_BITS,
    MIN_MASK_BOUND,
    CkksOptions,
    check,
    describe,
)
from securevfl.exchange.ckks.peer import CkksPeer
from securevfl.exchange.ckks.wire import HEADER, PUB_HEADER, frame, unframe
from securevfl.exchange.ckks.worker import Worker
from securevfl.exchange.he import HEScheme, he_backend


class CkksScheme(HEScheme):
    """CKKS behind the two-party HE protocol: keys, peers, masks, load-time checks."""

    options = CkksOptions

    def __init__(self, options: BaseModel):
        assert isinstance(options, CkksOptions)
        super().__init__(options)
        self.opts: CkksOptions = options

    def new_key(self) -> CkksKey:
        return CkksKey(self.opts)

    def peer(self, public: bytes, *, sender: str) -> CkksPeer:
        return CkksPeer(self.opts, public, sender)

    def mask(self, stream: SecretStream, shape: tuple[int, ...]) -> np.ndarray:
        m = self.opts.mask_bound
        return m * (2.0 * stream.uniform_np(shape) - 1.0)

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        assert isinstance(options, CkksOptions)
        check(proto, options)

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, CkksOptions)
        return describe(options)


Ckks = he_backend(
    "ckks",
    CkksScheme,
    "CKKS (TenSEAL) two-party interactive layer: batch-packed ciphertexts, shares of W_i, masked openings",
)

__all__ = [
    "HEADER",
    "MAX_BITS_128",
    "MAX_PRIME_BITS",
    "MIN_MASK_BOUND",
    "OPS",
    "PUB_HEADER",
    "Ckks",
    "CkksKey",
    "CkksOptions",
    "CkksPeer",
    "CkksScheme",
    "Layout",
    "LinearMap",
    "OpCounter",
    "Worker",
    "chain_cost",
    "floor_seconds",
    "frame",
    "matmul_map",
    "naf_weight",
    "signed_units",
    "simulate",
    "standard_layout",
    "tmatmul_map",
    "unframe",
]
