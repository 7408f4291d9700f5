"""Two-party homomorphic interactive layer, shared by ``ckks`` and ``paillier``.

Per passive party P_i, between A (rank 0) and P_i, with two key pairs: P_i's (it
encrypts its embedding) and A's (it encrypts dL/dz). W_i never exists anywhere:
A holds a share W^A, P_i holds W^P, W_i = W^A + W^P (DESIGN §4).

Forward, batch of B rows (h = h'_i, B x d; W shares d x o)::

    P_i -> A   Enc_P(h)
    A   -> P_i Enc_P(h W^A + eps)                 eps: A's random mask (B x o)
    P_i -> A   s = (h W^A + eps) + h W^P          plaintext
    A:         z_i = s - eps = h W_i

Backward, g = dL/dz at A (B x o)::

    A   -> P_i Enc_A(g)
    P_i -> A   Enc_A(g W^P^T + mu), Enc_A(h^T g - R)   mu (B x d), R (d x o): P_i's masks
    A:         u = g W^P^T + mu;  dW^A = h^T g - R
    A   -> P_i u + g W^A^T = g W_i^T + mu          plaintext
    P_i:       dL/dh = that - mu;  dW^P = R
    both:      v <- momentum v + dW;  W <- W - lr v      (SGD with momentum, on shares)

Re-drawn share, when the scheme asks for it (:meth:`HEScheme.share_bits` = k; ``paillier``)::

    P_i:       U uniform in [-2^k, 2^k)  (d x o, fresh every step)
    P_i -> A   delta = W^P - U                        plaintext
    A:         W^A <- W^A + delta;   P_i: W^P <- W^P - delta (= U)

The sum is unchanged and A's share is W_i - U: it hides W_i within statistical
distance |W_i - W'_i| / 2^(k+1) per weight, as a mask hides a value; the
momentum buffers are not re-drawn (they never meet a ciphertext). The shares
then stay below 2^k and 2^k + |W_i|, so a scheme that packs values into slots
can size them for short operands (:meth:`HEKey.encrypt_shared`). Without it
P_i's share is a random walk of its masks R and grows like sqrt(steps).

Rounding: the owner of an encrypted operand also multiplies its own plain copy
(h W^P at P_i, g W^A^T at A); it multiplies :meth:`HEKey.shared_copy`, the values
exactly as encrypted, so the two halves share one rounding and its error meets
W_i = W^A + W^P rather than a (large) share.

So A learns z_i = h W_i (the declared output) and masked values; P_i learns
dL/dh and masked values; ciphertexts cross only towards the party without the
key. Masks are real values drawn by the scheme (:meth:`HEScheme.mask`), so the
hiding of a masked value is statistical, with the bound the scheme documents.
Secret keys never leave their owner: only :meth:`HEKey.public` is sent.

A scheme (CKKS, Paillier) implements :class:`HEScheme`; the packing of values
into ciphertexts is the scheme's own business, behind ``encrypt``/``matmul``/
``tmatmul``. Backends are one small class each, made by :func:`he_backend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.csprng import SecretStream
from securevfl.exchange.base import (
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    PassiveExchange,
)
from securevfl.models import build_interactive
from securevfl.runtime.channel import Channel
from securevfl.runtime.messages import BYTES, FLOATS, register_tag
from securevfl.snapshot import ComponentState

HE_PUBLIC = register_tag("he_public", BYTES, "public HE context/key of the sender (no secret key)")
HE_ENC_H = register_tag("he_enc_h", BYTES, "P_i -> A: Enc_P(h'_i)")
HE_ENC_ZMASK = register_tag("he_enc_zmask", BYTES, "A -> P_i: Enc_P(h'_i W^A + eps)")
HE_ZSHARE = register_tag("he_zshare", FLOATS, "P_i -> A: h'_i W_i + eps (masked)")
HE_ENC_G = register_tag("he_enc_g", BYTES, "A -> P_i: Enc_A(dL/dz)")
HE_ENC_GH = register_tag("he_enc_gh", BYTES, "P_i -> A: Enc_A(g W^P^T + mu)")
HE_ENC_GW = register_tag("he_enc_gw", BYTES, "P_i -> A: Enc_A(h^T g - R)")
HE_GH_MASKED = register_tag("he_gh_masked", FLOATS, "A -> P_i: g W_i^T + mu (masked)")
HE_RESHARE = register_tag("he_reshare", FLOATS, "P_i -> A: W^P - U, U P_i's fresh share (re-drawn share)")

MAX_PUBLIC_BYTES = 512 << 20
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


class HEScheme(ABC):
    """A homomorphic scheme with its (validated) options."""

    options: ClassVar[type[BaseModel]]

    def __init__(self, options: BaseModel):
        self.opts = options

    @abstractmethod
    def new_key(self) -> HEKey: ...

    @abstractmethod
    def peer(self, public: bytes, *, sender: str) -> HEPeer:
        """Load a peer's public part; a malformed one raises ProtocolError naming
        ``sender``; one that carries a secret key is refused."""

    @abstractmethod
    def mask(self, stream: SecretStream, shape: tuple[int, ...]) -> np.ndarray:
        """Fresh random mask values (float64) within the scheme's safe range, drawn
        from ``stream`` (the party's secret stream, :mod:`securevfl.csprng`)."""

    def share_bits(self) -> int | None:
        """k: P_i re-draws its weight share uniform in [-2^k, 2^k) every step (module
        docstring); None (the default): shares are never re-drawn."""
        return None

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        """Refuse insecure parameters at load (CryptoParameterError)."""
        return None

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        return {}


def _init_shares(
    ctx: ExchangeContext, i: int, side: str, weight_init: str, stream: SecretStream
) -> np.ndarray:
    """This side's share of W_i (d x o). ``private``: two independent Gaussian
    halves (nobody knows W_i); ``seeded``: A starts from plain's W_i^0, P_i from 0."""
    d, o = ctx.embed_dims[i], ctx.proto.interactive.out
    if weight_init == "seeded":
        if side == "active":
            role = ctx.layout.passive[i]
            blk = build_interactive(d, o, seed=ctx.proto.training.seed, party=role.party)
            return blk.weight.detach().double().T.numpy().copy()
        return np.zeros((d, o))
    return stream.normal_np((d, o)) * (1.0 / (3.0 * d * 2)) ** 0.5


class _Shares:
    """A weight share with its momentum buffer; SGD with momentum is linear, so
    the two sides' updates add up to the update of W_i."""

    def __init__(self, w: np.ndarray, lr: float, momentum: float):
        self.w = w
        self.v: np.ndarray | None = None
        self.lr, self.momentum = lr, momentum

    def step(self, grad: np.ndarray) -> None:
        self.v = grad if self.v is None else self.momentum * self.v + grad
        self.w = self.w - self.lr * self.v

    def saved(self) -> dict[str, torch.Tensor]:
        """The share and its momentum, exactly (float64), for a checkpoint."""
        out = {"w": torch.from_numpy(self.w.copy())}
        if self.v is not None:
            out["v"] = torch.from_numpy(self.v.copy())
        return out

    def load(self, saved: dict[str, torch.Tensor]) -> None:
        self.w = saved["w"].double().numpy().copy()
        self.v = saved["v"].double().numpy().copy() if "v" in saved else None


def redraw_share(w: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P_i's re-draw (module docstring): with U = u its fresh share, returns (delta,
    new share) with delta = W^P - U sent to A, who adds it to W^A, and new share
    W^P - delta (= U up to one float64 rounding), so the sum W_i is unchanged."""
    delta = w - u
    return delta, w - delta


def _recv_public(scheme: HEScheme, ch: Channel, src: int, who: str) -> HEPeer:
    return scheme.peer(ch.recv_bytes(src, HE_PUBLIC, max_len=MAX_PUBLIC_BYTES), sender=who)


class HEActive(ActiveExchange):
    def __init__(self, ctx: ExchangeContext, scheme: HEScheme, weight_init: str):
        self.ctx, self.scheme = ctx, scheme
        ch = ctx.channel
        self.peers_rank = [r.rank for r in ctx.layout.passive]
        self.key = scheme.new_key()
        self.stream = SecretStream.fresh()  # masks and this side's share initialisation
        pub = self.key.public()
        self.peer: list[HEPeer] = []
        for r in ctx.layout.passive:
            ch.send_bytes(r.rank, HE_PUBLIC, pub)
            self.peer.append(_recv_public(scheme, ch, r.rank, f"rank {r.rank} ({r.label})"))
        ip = ctx.proto.interactive
        self.w = [
            _Shares(_init_shares(ctx, i, "active", weight_init, self.stream), ip.lr, ip.momentum)
            for i in range(len(self.peers_rank))
        ]
        self.o = ip.out
        self.share_bits = scheme.share_bits()

    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor:
        ch = self.ctx.channel
        z = np.zeros((batch_size, self.o))
        # Each pair runs the same messages in the same order; the pairs overlap: P_i
        # decrypts its reply while A evaluates the next party's product.
        eps: list[np.ndarray] = []
        for i, r in enumerate(self.peers_rank):
            d = self.ctx.embed_dims[i]
            blob = ch.recv_bytes(r, HE_ENC_H)
            eps.append(self.scheme.mask(self.stream, (batch_size, self.o)))
            ch.send_bytes(r, HE_ENC_ZMASK, self.peer[i].matmul(blob, (batch_size, d), self.w[i].w, eps[i]))
        for i, r in enumerate(self.peers_rank):
            s = ch.recv(r, HE_ZSHARE, shape=(batch_size, self.o), dtype=torch.float64).numpy()
            z += s - eps[i]
        return torch.from_numpy(z).float().to(self.ctx.device)

    def backward(self, grad_z: torch.Tensor) -> None:
        ch = self.ctx.channel
        g = grad_z.detach().double().cpu().numpy()
        blob_g = self.key.encrypt_shared(g, share_bits=self.share_bits)  # P_i multiplies by its share
        g = self.key.shared_copy(g)
        b = g.shape[0]
        for r in self.peers_rank:  # every P_i starts its products at once (they run in parallel)
            ch.send_bytes(r, HE_ENC_G, blob_g)
        for i, r in enumerate(self.peers_rank):
            d = self.ctx.embed_dims[i]
            u = self.key.decrypt(ch.recv_bytes(r, HE_ENC_GH), (b, d))
            dw = self.key.decrypt(ch.recv_bytes(r, HE_ENC_GW), (d, self.o))
            ch.send(r, HE_GH_MASKED, torch.from_numpy(u + g @ self.w[i].w.T))
            self.w[i].step(dw)
        if self.share_bits is not None:
            for i, r in enumerate(self.peers_rank):
                shape = (self.ctx.embed_dims[i], self.o)
                self.w[i].w = self.w[i].w + ch.recv(r, HE_RESHARE, shape=shape, dtype=torch.float64).numpy()
        for i, peer in enumerate(self.peer):
            if peer.background_prepare:  # the next forward product's share, while A waits for Enc(h'_i)
                peer.prepare_operands((b, self.ctx.embed_dims[i]), w=self.w[i].w)

    def state(self) -> dict[str, torch.Tensor]:
        return {
            f"interactive_share.{r.party}": torch.from_numpy(s.w).float()
            for r, s in zip(self.ctx.layout.passive, self.w, strict=True)
        }

    def checkpoint_state(self) -> ComponentState:
        """A's shares W^A of every W_i and their momentum (keys are per session:
        a resumed run exchanges fresh ones)."""
        return ComponentState({"shares": [s.saved() for s in self.w]})

    def restore(self, state: ComponentState) -> None:
        for s, saved in zip(self.w, state.tensors["shares"], strict=True):
            s.load(saved)


class HEPassive(PassiveExchange):
    def __init__(self, ctx: ExchangeContext, scheme: HEScheme, weight_init: str):
        self.ctx, self.scheme = ctx, scheme
        ch = ctx.channel
        role = ctx.layout.role(ctx.rank)
        self.i = role.index
        self.a = ctx.layout.active.rank
        self.key = scheme.new_key()
        self.stream = SecretStream.fresh()  # masks, re-drawn shares, share initialisation
        self.peer = _recv_public(scheme, ch, self.a, f"rank {self.a} ({ctx.layout.active.label})")
        ch.send_bytes(self.a, HE_PUBLIC, self.key.public())
        ip = ctx.proto.interactive
        self.w = _Shares(_init_shares(ctx, self.i, "passive", weight_init, self.stream), ip.lr, ip.momentum)
        self.o = ip.out
        self.share_bits = scheme.share_bits()
        self._h: np.ndarray | None = None

    def forward(self, h: torch.Tensor, *, train: bool) -> None:
        ch = self.ctx.channel
        x = h.detach().double().cpu().numpy()
        self._h = x
        blob = self.key.encrypt_shared(x, ops=frozenset({MATMUL}), share_bits=self._h_bits())
        # while A evaluates: this step's backward products use h and the current share; a
        # peer that prepares in the background starts before the send (which waits for A
        # to take Enc(h), after the products of the parties before this one)
        early = train and self.peer.background_prepare
        if early:
            self.peer.prepare_operands((x.shape[0], self.o), w=self.w.w.T, p=x)
        ch.send_bytes(self.a, HE_ENC_H, blob)
        if train and not early:
            self.peer.prepare_operands((x.shape[0], self.o), w=self.w.w.T, p=x)
        v = self.key.decrypt(ch.recv_bytes(self.a, HE_ENC_ZMASK), (x.shape[0], self.o))
        ch.send(self.a, HE_ZSHARE, torch.from_numpy(v + self.key.shared_copy(x) @ self.w.w))

    def _h_bits(self) -> int | None:
        """A only multiplies Enc(h'_i), by its share W_i - W^P: below 2^k + |W_i| <
        2^(k+1) when re-drawn."""
        return None if self.share_bits is None else self.share_bits + 1

    def backward(self) -> torch.Tensor:
        ch = self.ctx.channel
        h = self._h
        assert h is not None
        b, d = h.shape
        # while A encrypts dL/dz: the randomness of this party's next Enc(h'_i) (same batch size)
        self.key.prepare_encryption((b, d), ops=frozenset({MATMUL}), share_bits=self._h_bits())
        blob_g = ch.recv_bytes(self.a, HE_ENC_G)
        mu = self.scheme.mask(self.stream, (b, d))
        r_mask = self.scheme.mask(self.stream, (d, self.o))
        ch.send_bytes(self.a, HE_ENC_GH, self.peer.matmul(blob_g, (b, self.o), self.w.w.T, mu))
        ch.send_bytes(self.a, HE_ENC_GW, self.peer.tmatmul(h, blob_g, (b, self.o), -r_mask))
        masked = ch.recv(self.a, HE_GH_MASKED, shape=(b, d), dtype=torch.float64).numpy()
        self.w.step(r_mask)
        if self.share_bits is not None:  # re-draw: A's share becomes W_i - U (module docstring)
            lim = 2.0**self.share_bits
            u = lim * (2.0 * self.stream.uniform_np(self.w.w.shape) - 1.0)
            delta, self.w.w = redraw_share(self.w.w, u)
            ch.send(self.a, HE_RESHARE, torch.from_numpy(delta))
        self._h = None
        return torch.from_numpy(masked - mu).float().to(self.ctx.device)

    def state(self) -> dict[str, torch.Tensor]:
        return {"interactive_share": torch.from_numpy(self.w.w).float()}

    def checkpoint_state(self) -> ComponentState:
        """P_i's share W^P of W_i and its momentum."""
        return ComponentState({"share": self.w.saved()})

    def restore(self, state: ComponentState) -> None:
        self.w.load(state.tensors["share"])


def he_backend(name: str, scheme_cls: type[HEScheme], description: str) -> type[ExchangeBackend]:
    """An exchange backend running the two-party protocol with a scheme (its
    package registers it in EXCHANGES by path, :mod:`securevfl.exchange`).
    The scheme's options model must have a ``weight_init`` field."""

    class _Backend(ExchangeBackend):
        capabilities = frozenset({"he"})
        options = scheme_cls.options
        scheme = scheme_cls

        @classmethod
        def check(cls, proto: Protocol, options: BaseModel) -> None:
            scheme_cls.check(proto, options)

        @classmethod
        def active(cls, ctx: ExchangeContext) -> ActiveExchange:
            return HEActive(ctx, scheme_cls(ctx.options), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
            return HEPassive(ctx, scheme_cls(ctx.options), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def result_info(cls, options: BaseModel) -> dict[str, Any]:
            info = super().result_info(options)
            info.update(scheme_cls.describe(options))
            return info

    _Backend.name = name
    _Backend.description = description
    _Backend.__name__ = _Backend.__qualname__ = f"{name.capitalize()}Backend"
    return _Backend
