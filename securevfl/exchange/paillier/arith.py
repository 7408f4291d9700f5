"""``paillier``'s share arithmetic for :mod:`securevfl.exchange.he.protocol`: exact integers.

Every weight share, momentum buffer, mask and masked result of the protocol is
an integer at the result scale 2^-Fs (Fs = shared_precision_bits +
scalar_precision_bits, 44 at the defaults), held as Python ints
(:mod:`.exact`), so that a mask covers every bit of the slot it hides: masks are
uniform integers over the slot's whole resolution, and nothing passes through
float64 on the way (package docstring, "Masks"). Only the protocol outputs
(z_i at A, dL/dh'_i at P_i) and the parties' reports (``state``) become float64.

On the wire the plaintext matrices (P_i's z share, A's masked dL/dh, P_i's
re-draw delta) are int64 limbs, little-endian, shape (rows, cols, limbs), as
many limbs as the largest value needs (:data:`MAX_LIMBS` at most); their sizes are
a function of the masked values, so they tell nothing the values do not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import securevfl.exchange.paillier.exact as exact
from securevfl.csprng import SecretStream
from securevfl.errors import CheckpointError, ConfigError, ProtocolError
from securevfl.exchange.he.scheme import HEKey, ShareArith
from securevfl.exchange.paillier.options import Params
from securevfl.runtime.channel import Channel

#: the most int64 limbs a plaintext matrix may use on the wire (1,024 bits)
MAX_LIMBS = 16


class PaillierArith(ShareArith):
    """Exact integer shares and masks at 2^-Fs (module docstring)."""

    def __init__(self, scheme: Any, prm: Params):
        super().__init__(scheme)
        self.prm = prm
        self.frac = prm.Fs

    # -- values -----------------------------------------------------------------------
    def from_float(self, w: np.ndarray) -> np.ndarray:
        return exact.from_float(w, self.frac)

    def to_float(self, v: Any) -> np.ndarray:
        return exact.to_float(v, self.frac)

    def operand(self, w: Any) -> np.ndarray:
        """The share rounded to the operand scale 2^-fw (each side rounds its own;
        the two roundings meet W_i, below 2^-fw per weight)."""
        return exact.shift_round(w, self.frac - self.prm.fw)

    def copy_of(self, key: HEKey, x: np.ndarray) -> np.ndarray:
        """The integers :meth:`PaillierKey.encrypt_shared` encrypted (int64 at 2^-fxs)."""
        return key.shared_ints(x)  # type: ignore[attr-defined]

    def product(self, x: Any, w: Any) -> np.ndarray:
        """x @ w at 2^-Fs for x at 2^-fxs (below 2^(value_bits + fxs)) and the owner's
        share w at 2^-Fs, rounded once: the owner's half is as precise as its share, so
        only the evaluator's rounding of its operand to 2^-fw meets the result."""
        return exact.shift_round(exact.matmul(x, w, self.prm.v + self.prm.fxs), self.prm.fxs)

    def decrypt(self, key: HEKey, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        return key.decrypt_exact(blob, shape, self.frac)  # type: ignore[attr-defined]

    # -- randomness -------------------------------------------------------------------
    def mask(self, stream: SecretStream, shape: tuple[int, int], *, terms: int, share: bool) -> np.ndarray:
        """Uniform on the 2^m integers [-2^(m-1), 2^(m-1)) at 2^-Fs, m from
        :meth:`Params.mask_bits`: every bit of the slot is covered, and the masked
        sum is within 2^-sigma of the mask alone (package docstring, "Masks")."""
        prm = self.prm
        m = prm.mask_bits(terms, prm.hidden_bits(share), prm.fxs)
        return exact.uniform(stream, shape, m)

    def redraw(self, stream: SecretStream, w: Any) -> tuple[Any, Any]:
        """U uniform on the integers [-2^(k+Fs), 2^(k+Fs)), i.e. on [-2^k, 2^k) at the
        shares' full resolution; delta = W^P - U exactly, and P_i keeps U."""
        u = exact.uniform(stream, np.shape(w), self.prm.share + self.frac + 1)
        return w - u, u

    def scaled(self, c: float, v: Any) -> Any:
        return exact.scaled(c, v)

    def check_pass(self, passes: int) -> None:
        if passes > self.prm.run_steps:
            raise ConfigError(
                f"this run has reached {passes} passes through the interactive layer (training steps, "
                f"evaluation and prediction batches), more than run_steps={self.prm.run_steps}: the "
                "masks and obfuscators were sized for that many, and their statistical distance "
                "bound would no longer hold. Raise exchange.params.run_steps (each doubling costs "
                "one bit of mask width) and run again",
                path="exchange.params.run_steps",
            )

    # -- wire and checkpoints -----------------------------------------------------------
    def send(self, ch: Channel, dst: int, tag: Any, v: Any) -> None:
        ch.send(dst, tag, torch.from_numpy(exact.to_limbs(v, exact.limbs_for(v))))

    def recv(self, ch: Channel, src: int, tag: Any, shape: tuple[int, int]) -> np.ndarray:
        t = ch.recv(src, tag, shape=(*shape, None), dtype=torch.int64)
        if not 1 <= t.shape[-1] <= MAX_LIMBS:
            raise ProtocolError(
                f"rank {src} sent '{tag.name}' with {t.shape[-1]} limbs per value (1..{MAX_LIMBS} expected)"
            )
        return exact.from_limbs(t.numpy())

    def save(self, v: Any) -> torch.Tensor:
        return torch.from_numpy(exact.to_limbs(v, exact.limbs_for(v)))

    def load(self, t: torch.Tensor) -> np.ndarray:
        """A share saved by :meth:`save` (int64 limbs), or as float64 by a version
        that kept float shares (converted exactly)."""
        if t.dtype == torch.int64 and t.dim() == 3:
            return exact.from_limbs(t.numpy())
        if t.is_floating_point() and t.dim() == 2:
            return self.from_float(t.double().numpy())
        raise CheckpointError(f"paillier: a saved weight share of dtype {t.dtype} and shape {tuple(t.shape)}")
