"""What a homomorphic scheme supplies to the two-party protocol
(:mod:`securevfl.exchange.he.protocol`): a key pair (:class:`HEKey`), the peer's
public view of a key (:class:`HEPeer`), the scheme with its options (:class:`HEScheme`)
and the arithmetic of what the protocol handles in the clear (:class:`ShareArith`:
shares, masks, masked results; float64 by default, a scheme's own where it needs
exact integers)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from securevfl.csprng import SecretStream
from securevfl.exchange.base import ExchangeContext
from securevfl.runtime.channel import Channel

MATMUL, TMATMUL = "matmul", "tmatmul"
BOTH_OPS = frozenset({MATMUL, TMATMUL})


class HEKey(ABC):
    """A key pair, held by its owner only."""

    @abstractmethod
    def public(self) -> bytes:
        """Serialized public part (what the peer needs to compute); no secret key."""

    @abstractmethod
    def encrypt(self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS) -> bytes:
        """Encrypt a float64 matrix (rows x cols) into one serialized blob that
        the peer can use as the encrypted operand of the ``ops`` it names
        (``"matmul"``, ``"tmatmul"``); a scheme whose packing depends on the
        operation writes only what those need."""

    @abstractmethod
    def decrypt(self, blob: bytes, shape: tuple[int, int]) -> np.ndarray:
        """Decrypt a blob produced by the peer's ``matmul``/``tmatmul``."""

    def encrypt_shared(
        self, x: np.ndarray, *, ops: frozenset[str] = BOTH_OPS, share_bits: int | None = None
    ) -> bytes:
        """Encrypt as this module's protocol does: the peer's ``matmul`` operand is a
        weight share below 2^share_bits (None: no bound), its ``tmatmul`` operand its
        own embedding; the owner multiplies :meth:`shared_copy` of x itself. A scheme
        whose packing depends on operand sizes can pack tighter; the default is
        :meth:`encrypt`."""
        return self.encrypt(x, ops=ops)

    def shared_copy(self, x: np.ndarray) -> np.ndarray:
        """x as :meth:`encrypt_shared` encodes it, for the owner's own product; the
        default (no rounding of its own) is x."""
        return x

    def prepare_encryption(
        self, shape: tuple[int, int], *, ops: frozenset[str] = BOTH_OPS, share_bits: int | None = None
    ) -> None:
        """Optional: precompute, while waiting, what a coming :meth:`encrypt_shared`
        of a matrix of ``shape`` needs (a scheme's randomness); local work only. The
        default does nothing."""
        return None


class HEPeer(ABC):
    """The other party's view of a key: public operations only."""

    #: whether :meth:`prepare_operands` returns at once and works in the background
    #: (then P_i asks for it before its blocking send of Enc(h'_i), else after it)
    background_prepare: ClassVar[bool] = False

    @abstractmethod
    def matmul(self, blob: bytes, shape: tuple[int, int], w: np.ndarray, mask: np.ndarray) -> bytes:
        """Enc(X) with X of ``shape`` (r x c) -> Enc(X @ w + mask), w plain (c x m)."""

    @abstractmethod
    def tmatmul(self, p: np.ndarray, blob: bytes, shape: tuple[int, int], mask: np.ndarray) -> bytes:
        """p plain (r x a), Enc(Y) with Y of ``shape`` (r x m) -> Enc(p^T @ Y + mask)."""

    def prepare_operands(
        self, shape: tuple[int, int], *, w: np.ndarray | None = None, p: np.ndarray | None = None
    ) -> None:
        """Optional: precompute, while waiting, what the coming ``matmul(., shape, w, .)``
        and ``tmatmul(p, ., shape, .)`` need from these plaintext operands (a scheme's
        encodings); local work only. The default does nothing."""
        return None


class ShareArith:
    """How a scheme computes on what the protocol handles in the clear: the weight shares
    and their momentum, the masks, the decrypted (masked) results, the owner's copy
    of what it encrypted, and their wire form. This default is float64 (``ckks``):
    masks are :meth:`HEScheme.mask`, the re-draw uses :meth:`HEScheme.share_bits`.
    A scheme whose masks must be exact integers (``paillier``: no bit of a slot
    outside the mask's range) supplies its own (:meth:`HEScheme.arith`)."""

    def __init__(self, scheme: HEScheme):
        self.scheme = scheme

    def from_float(self, w: np.ndarray) -> Any:
        """A share (initialisation, or a checkpoint saved as float64) in this arithmetic."""
        return np.asarray(w, dtype=np.float64)

    def to_float(self, v: Any) -> np.ndarray:
        """A protocol output (z_i, dL/dh'_i) or a share, as float64."""
        return np.asarray(v, dtype=np.float64)

    def operand(self, w: Any) -> Any:
        """A weight share as the peer's ``matmul`` and the owner's own product take it."""
        return w

    def copy_of(self, key: HEKey, x: np.ndarray) -> Any:
        """The owner's copy of a matrix it encrypted, exactly as encrypted."""
        return key.shared_copy(x)

    def product(self, x: Any, w: Any) -> Any:
        """x @ w for the owner's copy x and its own weight share w (the owner's half of
        a product, at the share's full precision)."""
        return x @ w

    def decrypt(self, key: HEKey, blob: bytes, shape: tuple[int, int]) -> Any:
        return key.decrypt(blob, shape)

    def mask(self, stream: SecretStream, shape: tuple[int, int], *, terms: int, share: bool) -> Any:
        """A fresh mask for a product of ``terms`` terms whose plaintext operand is a
        weight share (``share``) or the evaluator's embedding (a ``tmatmul``)."""
        return self.scheme.mask(stream, shape)

    def redraw(self, stream: SecretStream, w: Any) -> tuple[Any, Any] | None:
        """P_i's re-draw (module docstring): (delta sent to A, P_i's new share U), or
        None when the scheme does not re-draw."""
        k = self.scheme.share_bits()
        if k is None:
            return None
        u = 2.0**k * (2.0 * stream.uniform_np(np.shape(w)) - 1.0)
        return redraw_share(w, u)

    def scaled(self, c: float, v: Any) -> Any:
        """c v for the SGD update (learning rate, momentum)."""
        return c * v

    def check_pass(self, passes: int) -> None:
        """Called before each pass through the layer with the passes so far, this one
        included; a scheme whose statistical bound covers a limited run refuses more."""
        return None

    def send(self, ch: Channel, dst: int, tag: Any, v: Any) -> None:
        ch.send(dst, tag, torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)))

    def recv(self, ch: Channel, src: int, tag: Any, shape: tuple[int, int]) -> Any:
        return ch.recv(src, tag, shape=shape, dtype=torch.float64).numpy()

    def save(self, v: Any) -> torch.Tensor:
        """A share or momentum buffer for a checkpoint, exactly."""
        return torch.from_numpy(np.array(v, dtype=np.float64, copy=True))

    def load(self, t: torch.Tensor) -> Any:
        return t.double().numpy().copy()


class HEScheme(ABC):
    """A homomorphic scheme with its (validated) options."""

    options: ClassVar[type[BaseModel]]

    def __init__(self, options: BaseModel):
        self.opts = options

    @classmethod
    def for_run(cls, ctx: ExchangeContext) -> HEScheme:
        """The scheme for one run's role object; a scheme whose parameters depend on
        the protocol's shape (batch, embedding sizes) reads them here."""
        return cls(ctx.options)

    def arith(self) -> ShareArith:
        """The arithmetic of shares, masks and masked results (default: float64)."""
        return ShareArith(self)

    @abstractmethod
    def new_key(self) -> HEKey: ...

    @abstractmethod
    def peer(self, public: bytes, *, sender: str) -> HEPeer:
        """Load a peer's public part; a malformed one raises ProtocolError naming
        ``sender``; one that carries a secret key is refused."""

    def mask(self, stream: SecretStream, shape: tuple[int, ...]) -> np.ndarray:
        """Fresh random mask values (float64) within the scheme's safe range, drawn
        from ``stream`` (the party's secret stream, :mod:`securevfl.csprng`), for the
        default float64 :class:`ShareArith`."""
        raise NotImplementedError(f"{type(self).__name__} draws its masks in its own ShareArith")

    def share_bits(self) -> int | None:
        """k: P_i re-draws its weight share uniform in [-2^k, 2^k) every step (module
        docstring); None (the default): shares are never re-drawn."""
        return None

    def value_bound(self) -> float | None:
        """C: the l2 norm every row of an encrypted operand (and every column of dL/dz)
        is brought within before encryption (:mod:`securevfl.exchange.he.bounds`): the
        bound the scheme's parameters are sized for. None (the default): no bound."""
        return None


def redraw_share(w: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P_i's re-draw (module docstring): with U = u its fresh share, returns (delta,
    new share) with delta = W^P - U sent to A, who adds it to W^A, and new share
    W^P - delta (= U up to one float64 rounding), so the sum W_i is unchanged."""
    delta = w - u
    return delta, w - delta
