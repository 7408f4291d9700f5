"""CKKS behind the two-party HE protocol (:mod:`securevfl.exchange.he.protocol`):
keys, peers, masks and the bounds the parameters are sized for (the argument:
:mod:`securevfl.exchange.ckks`)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from securevfl.csprng import SecretStream
from securevfl.exchange.ckks.key import CkksKey
from securevfl.exchange.ckks.params import CkksOptions
from securevfl.exchange.ckks.peer import CkksPeer
from securevfl.exchange.he.scheme import HEScheme


class CkksScheme(HEScheme):
    """CKKS behind the two-party HE protocol: keys, peers, masks (its load-time checks:
    :func:`securevfl.exchange.ckks.params.check`)."""

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
        """Gaussian masks of standard deviation mask_std (package docstring: why
        Gaussian; |mask| <= 8.58 mask_std)."""
        return self.opts.mask_std * stream.normal_np(shape)

    def share_bits(self) -> int:
        """P_i re-draws its weight share uniform in [-2^share_bits, 2^share_bits) every
        step (:mod:`securevfl.exchange.he.protocol`), so the shares the evaluator multiplies stay
        within the operand bound the guards and the flooding assume."""
        return self.opts.share_bits

    def value_bound(self) -> float:
        """2^value_norm_bits: the l2 bound of an encrypted operand's rows (and dL/dz's
        columns) that the exact decryption and the flooding are sized for; P_i clips
        h'_i's rows and A scales dL/dz to it before encrypting (:mod:`securevfl.exchange.he.bounds`)."""
        return 2.0**self.opts.value_norm_bits
