"""Two-party homomorphic interactive layer, shared by ``ckks`` and ``paillier``.

Per passive party P_i, between A (rank 0) and P_i, with two key pairs: P_i's (it
encrypts its embedding) and A's (it encrypts dL/dz). W_i never exists anywhere:
A holds a share W^A, P_i holds W^P, W_i = W^A + W^P (docs/design.md §4).

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

Start (``weight_init: private``): W_i^0 = c R_A F_P (d >= o) or c F_A R_P (d < o),
a product of a Haar-random orthogonal factor of one party and a uniformly random
orthonormal factor of the other (:mod:`securevfl.exchange.orthogonal`: W_i^0 is
then independent of each factor, so of each party's view). For d >= o::

    P_i -> A   Enc_P(F_P^T)                          F_P: P_i's d x o, orthonormal columns
    A   -> P_i Enc_P(F_P^T c R_A^T + eps)            R_A: A's d x d Haar; eps: A's mask (o x d)
    P_i:       W^P = (that)^T = W_i^0 + eps^T;   A: W^A = -eps^T

and for d < o the same with the roles swapped (A sends Enc_A(F_A), P_i returns
Enc_A(F_A c R_P + mu), A decrypts W^A = W_i^0 + mu, P_i keeps W^P = -mu). Then P_i
re-draws its share at once (below), so A holds W_i^0 - U and P_i holds U before the
first step. Each decrypted value is masked as every product is, and the re-draw
hides W_i^0 from A as it hides every later W_i.

Operand bounds, when the scheme declares one (:meth:`HEScheme.value_bound` = C;
``ckks`` and ``paillier``): P_i clips every row of h to l2 norm C before it
encrypts (and multiplies) it, and returns the gradient through the clipping; A
scales g so that its rows and columns are within C
(:mod:`securevfl.exchange.bounds`). The scheme's guards then hold for any bottom
model; a healthy run's operands are far inside C and are left as they are.

Re-drawn share, when the scheme asks for it (:meth:`HEScheme.share_bits` = k;
``ckks`` and ``paillier``)::

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
key. Masks are drawn by the scheme's arithmetic (:class:`ShareArith`: float64
masks from :meth:`HEScheme.mask` for ``ckks``; exact integers over every bit of a
slot for ``paillier``), so the hiding of a masked value is statistical, with the
bound the scheme documents (``paillier``: for the whole run).
Secret keys never leave their owner: only :meth:`HEKey.public` is sent.

A scheme (CKKS, Paillier) implements :class:`HEScheme`; the packing of values
into ciphertexts is the scheme's own business, behind ``encrypt``/``matmul``/
``tmatmul``. Backends are one small class each, made by :func:`he_backend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel

from securevfl.config import Protocol
from securevfl.csprng import SecretStream
from securevfl.errors import Diverged
from securevfl.exchange.base import (
    SEEDED_WARNING,
    ActiveExchange,
    ExchangeBackend,
    ExchangeContext,
    PassiveExchange,
    check_weight_init,
)
from securevfl.exchange.bounds import clip_rows, clip_rows_grad, scale_to_bound
from securevfl.exchange.orthogonal import gain, haar, orthonormal_columns, orthonormal_rows
from securevfl.models import build_interactive
from securevfl.runtime.channel import Channel
from securevfl.runtime.messages import BYTES, FLOATS, register_tag
from securevfl.snapshot import ComponentState

HE_PUBLIC = register_tag("he_public", BYTES, "public HE context/key of the sender (no secret key)")
HE_ENC_H = register_tag("he_enc_h", BYTES, "P_i -> A: Enc_P(h'_i)")
HE_ENC_ZMASK = register_tag("he_enc_zmask", BYTES, "A -> P_i: Enc_P(h'_i W^A + eps)")
#: plaintext matrices: float64 (``ckks``) or exact integers as int64 limbs (``paillier``); the
#: receiver names the one its scheme uses (:class:`ShareArith`)
PLAIN = FLOATS | {torch.int64}
HE_ZSHARE = register_tag("he_zshare", PLAIN, "P_i -> A: h'_i W_i + eps (masked)")
HE_ENC_G = register_tag("he_enc_g", BYTES, "A -> P_i: Enc_A(dL/dz)")
HE_ENC_GH = register_tag("he_enc_gh", BYTES, "P_i -> A: Enc_A(g W^P^T + mu)")
HE_ENC_GW = register_tag("he_enc_gw", BYTES, "P_i -> A: Enc_A(h^T g - R)")
HE_GH_MASKED = register_tag("he_gh_masked", PLAIN, "A -> P_i: g W_i^T + mu (masked)")
HE_RESHARE = register_tag("he_reshare", PLAIN, "P_i -> A: W^P - U, U P_i's fresh share (re-drawn share)")
HE_START_ENC = register_tag(
    "he_start_enc", BYTES, "start of W_i: Enc(orthonormal factor) from the party of the smaller side"
)
HE_START_MASKED = register_tag(
    "he_start_masked", BYTES, "start of W_i: Enc(that factor times the other's orthogonal factor + mask)"
)

#: ``exchange.params.weight_init`` of the HE backends (module docstring, "Start")
HEWeightInit = Literal["private", "seeded"]

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


class ShareArith:
    """How a scheme computes on what he.py handles in the clear: the weight shares
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
        is brought within before encryption (:mod:`securevfl.exchange.bounds`): the
        bound the scheme's parameters are sized for. None (the default): no bound."""
        return None

    @classmethod
    def check(cls, proto: Protocol, options: BaseModel) -> None:
        """Refuse insecure parameters at load (CryptoParameterError)."""
        return None

    @classmethod
    def describe(cls, options: BaseModel) -> dict[str, Any]:
        return {}


def _seeded_start(ctx: ExchangeContext, i: int, side: str) -> np.ndarray:
    """``weight_init: seeded``: A's share is plain's W_i^0 (from the public seed), P_i's
    is 0, so A knows W_i^0 (step-by-step comparisons with ``plain`` only; refused
    without ``insecure: true``)."""
    d, o = ctx.embed_dims[i], ctx.proto.interactive.out
    if side != "active":
        return np.zeros((d, o))
    role = ctx.layout.passive[i]
    blk = build_interactive(d, o, seed=ctx.proto.training.seed, party=role.party)
    return blk.weight.detach().double().T.numpy().copy()


class _Shares:
    """A weight share with its momentum buffer; SGD with momentum is linear, so
    the two sides' updates add up to the update of W_i (in the scheme's arithmetic:
    exact integers round each product to the share's resolution, on each side)."""

    def __init__(self, w: Any, lr: float, momentum: float, arith: ShareArith):
        self.w = w
        self.v: Any = None
        self.lr, self.momentum = lr, momentum
        self.ar = arith

    def step(self, grad: Any) -> None:
        ar = self.ar
        self.v = grad if self.v is None else ar.scaled(self.momentum, self.v) + grad
        self.w = self.w - ar.scaled(self.lr, self.v)

    def saved(self) -> dict[str, torch.Tensor]:
        """The share and its momentum, exactly, for a checkpoint."""
        out = {"w": self.ar.save(self.w)}
        if self.v is not None:
            out["v"] = self.ar.save(self.v)
        return out

    def load(self, saved: dict[str, torch.Tensor]) -> None:
        self.w = self.ar.load(saved["w"])
        self.v = self.ar.load(saved["v"]) if "v" in saved else None


def redraw_share(w: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P_i's re-draw (module docstring): with U = u its fresh share, returns (delta,
    new share) with delta = W^P - U sent to A, who adds it to W^A, and new share
    W^P - delta (= U up to one float64 rounding), so the sum W_i is unchanged."""
    delta = w - u
    return delta, w - delta


def _finite(x: np.ndarray, what: str, step: int) -> np.ndarray:
    """x, when every value is finite; else Diverged naming the value (not its entries)
    before anything derived from it is encrypted or sent."""
    if not np.isfinite(x).all():
        raise Diverged(
            f"{what} holds NaN or infinite values at pass {step} through the interactive layer: "
            "training diverged (lower training.lr or interactive.lr, or standardize the features)"
        )
    return x


def _recv_public(scheme: HEScheme, ch: Channel, src: int, who: str) -> HEPeer:
    return scheme.peer(ch.recv_bytes(src, HE_PUBLIC, max_len=MAX_PUBLIC_BYTES), sender=who)


class HEActive(ActiveExchange):
    def __init__(self, ctx: ExchangeContext, scheme: HEScheme, weight_init: str):
        self.ctx, self.scheme = ctx, scheme
        self.ar = scheme.arith()
        ch = ctx.channel
        self.peers_rank = [r.rank for r in ctx.layout.passive]
        self.key = scheme.new_key()
        self.stream = SecretStream.fresh()  # masks, this side's factor of every W_i^0
        pub = self.key.public()
        self.peer: list[HEPeer] = []
        for r in ctx.layout.passive:
            ch.send_bytes(r.rank, HE_PUBLIC, pub)
            self.peer.append(_recv_public(scheme, ch, r.rank, f"rank {r.rank} ({r.label})"))
        ip = ctx.proto.interactive
        self.o = ip.out
        self.share_bits = scheme.share_bits()
        self.bound = scheme.value_bound()
        self.passes = 0
        if weight_init == "seeded":
            starts = [
                self.ar.from_float(_seeded_start(ctx, i, "active")) for i in range(len(self.peers_rank))
            ]
        else:
            starts = self._joint_start()
        self.w = [_Shares(w0, ip.lr, ip.momentum, self.ar) for w0 in starts]

    def _joint_start(self) -> list[Any]:
        """A's share of every W_i^0 (module docstring, "Start"): the pairs' first
        messages, then P_i's re-drawn shares."""
        ch, ar, o = self.ctx.channel, self.ar, self.o
        shares: list[Any] = []
        for i, r in enumerate(self.peers_rank):
            d = self.ctx.embed_dims[i]
            if d >= o:  # P_i's orthonormal columns arrive encrypted; A multiplies by c R_A^T
                blob = ch.recv_bytes(r, HE_START_ENC)
                eps = ar.mask(self.stream, (o, d), terms=d, share=True)
                rot = ar.operand(ar.from_float(gain(d, o) * haar(self.stream, d).T))
                ch.send_bytes(r, HE_START_MASKED, self.peer[i].matmul(blob, (o, d), rot, eps))
                shares.append(-eps.T)
            else:  # A's orthonormal rows go out encrypted; P_i multiplies by c R_P
                f = orthonormal_rows(self.stream, d, o)
                ch.send_bytes(
                    r,
                    HE_START_ENC,
                    self.key.encrypt_shared(f, ops=frozenset({MATMUL}), share_bits=self.share_bits),
                )
                shares.append(None)
        for i, r in enumerate(self.peers_rank):
            if shares[i] is None:
                shares[i] = ar.decrypt(
                    self.key, ch.recv_bytes(r, HE_START_MASKED), (self.ctx.embed_dims[i], o)
                )
        if self.share_bits is not None:  # P_i's first re-draw: A's share becomes W_i^0 - U
            for i, r in enumerate(self.peers_rank):
                shares[i] = shares[i] + ar.recv(ch, r, HE_RESHARE, (self.ctx.embed_dims[i], o))
        return shares

    def forward(self, batch_size: int, *, train: bool) -> torch.Tensor:
        ch, ar = self.ctx.channel, self.ar
        self.passes += 1
        ar.check_pass(self.passes)
        z = np.zeros((batch_size, self.o))
        # Each pair runs the same messages in the same order; the pairs overlap: P_i
        # decrypts its reply while A evaluates the next party's product.
        eps: list[Any] = []
        for i, r in enumerate(self.peers_rank):
            d = self.ctx.embed_dims[i]
            blob = ch.recv_bytes(r, HE_ENC_H)
            eps.append(ar.mask(self.stream, (batch_size, self.o), terms=d, share=True))
            out = self.peer[i].matmul(blob, (batch_size, d), ar.operand(self.w[i].w), eps[i])
            ch.send_bytes(r, HE_ENC_ZMASK, out)
        for i, r in enumerate(self.peers_rank):
            s = ar.recv(ch, r, HE_ZSHARE, (batch_size, self.o))
            z += ar.to_float(s - eps[i])
        return torch.from_numpy(z).float().to(self.ctx.device)

    def backward(self, grad_z: torch.Tensor) -> None:
        ch, ar = self.ctx.channel, self.ar
        g = _finite(grad_z.detach().double().cpu().numpy(), "dL/dz", self.passes)
        if self.bound is not None:  # rows and columns within the scheme's bound (bounds.py)
            g = scale_to_bound(g, self.bound)
        blob_g = self.key.encrypt_shared(g, share_bits=self.share_bits)  # P_i multiplies by its share
        gq = ar.copy_of(self.key, g)
        b = g.shape[0]
        for r in self.peers_rank:  # every P_i starts its products at once (they run in parallel)
            ch.send_bytes(r, HE_ENC_G, blob_g)
        for i, r in enumerate(self.peers_rank):
            d = self.ctx.embed_dims[i]
            u = ar.decrypt(self.key, ch.recv_bytes(r, HE_ENC_GH), (b, d))
            dw = ar.decrypt(self.key, ch.recv_bytes(r, HE_ENC_GW), (d, self.o))
            ar.send(ch, r, HE_GH_MASKED, u + ar.product(gq, self.w[i].w.T))
            self.w[i].step(dw)
        if self.share_bits is not None:
            for i, r in enumerate(self.peers_rank):
                shape = (self.ctx.embed_dims[i], self.o)
                self.w[i].w = self.w[i].w + ar.recv(ch, r, HE_RESHARE, shape)
        for i, peer in enumerate(self.peer):
            if peer.background_prepare:  # the next forward product's share, while A waits for Enc(h'_i)
                peer.prepare_operands((b, self.ctx.embed_dims[i]), w=ar.operand(self.w[i].w))

    def state(self) -> dict[str, torch.Tensor]:
        return {
            f"interactive_share.{r.party}": torch.from_numpy(self.ar.to_float(s.w)).float()
            for r, s in zip(self.ctx.layout.passive, self.w, strict=True)
        }

    def checkpoint_state(self) -> ComponentState:
        """A's shares W^A of every W_i and their momentum, and the passes so far (keys
        are per session: a resumed run exchanges fresh ones). A share alone is not
        uniform: under a re-drawing scheme it is W_i minus P_i's uniform U (within the
        scheme's statistical bound of independent of W_i), otherwise W_i minus P_i's
        accumulated masks; at the start W_i^0 minus P_i's first U (module docstring)."""
        return ComponentState({"shares": [s.saved() for s in self.w]}, {"passes": self.passes})

    def restore(self, state: ComponentState) -> None:
        for s, saved in zip(self.w, state.tensors["shares"], strict=True):
            s.load(saved)
        self.passes = int(state.meta.get("passes", 0))


class HEPassive(PassiveExchange):
    def __init__(self, ctx: ExchangeContext, scheme: HEScheme, weight_init: str):
        self.ctx, self.scheme = ctx, scheme
        self.ar = scheme.arith()
        ch = ctx.channel
        role = ctx.layout.role(ctx.rank)
        self.i = role.index
        self.a = ctx.layout.active.rank
        self.key = scheme.new_key()
        self.stream = SecretStream.fresh()  # masks, re-drawn shares, this side's factor of W_i^0
        self.peer = _recv_public(scheme, ch, self.a, f"rank {self.a} ({ctx.layout.active.label})")
        ch.send_bytes(self.a, HE_PUBLIC, self.key.public())
        ip = ctx.proto.interactive
        self.o = ip.out
        self.share_bits = scheme.share_bits()
        self.bound = scheme.value_bound()
        if weight_init == "seeded":
            w0 = self.ar.from_float(_seeded_start(ctx, self.i, "passive"))
        else:
            w0 = self._joint_start()
        self.w = _Shares(w0, ip.lr, ip.momentum, self.ar)
        self._h: np.ndarray | None = None
        # the embedding as given and the clipping's row factors, for the gradient through it
        self._clip: tuple[np.ndarray, np.ndarray] | None = None
        self.passes = 0

    def _joint_start(self) -> Any:
        """P_i's share of W_i^0 (module docstring, "Start"), re-drawn at once."""
        ch, ar, o = self.ctx.channel, self.ar, self.o
        d = self.ctx.embed_dims[self.i]
        if d >= o:  # this party's orthonormal columns go out encrypted; A multiplies by c R_A^T
            f = orthonormal_columns(self.stream, d, o)
            ch.send_bytes(
                self.a,
                HE_START_ENC,
                self.key.encrypt_shared(f.T, ops=frozenset({MATMUL}), share_bits=self._h_bits()),
            )
            share = ar.decrypt(self.key, ch.recv_bytes(self.a, HE_START_MASKED), (o, d)).T
        else:  # A's orthonormal rows arrive encrypted; this party multiplies by c R_P
            blob = ch.recv_bytes(self.a, HE_START_ENC)
            mu = ar.mask(self.stream, (d, o), terms=o, share=True)
            rot = ar.operand(ar.from_float(gain(d, o) * haar(self.stream, o)))
            ch.send_bytes(self.a, HE_START_MASKED, self.peer.matmul(blob, (d, o), rot, mu))
            share = -mu
        drawn = ar.redraw(self.stream, share)
        if drawn is not None:
            delta, share = drawn
            ar.send(ch, self.a, HE_RESHARE, delta)
        return share

    def forward(self, h: torch.Tensor, *, train: bool) -> None:
        ch, ar = self.ctx.channel, self.ar
        self.passes += 1
        ar.check_pass(self.passes)
        x = _finite(h.detach().double().cpu().numpy(), "the embedding h'_i", self.passes)
        self._clip = None
        if self.bound is not None:  # rows within the scheme's bound (bounds.py)
            raw = x
            x, factors = clip_rows(raw, self.bound)
            self._clip = (raw, factors) if train else None
        self._h = x
        blob = self.key.encrypt_shared(x, ops=frozenset({MATMUL}), share_bits=self._h_bits())
        # while A evaluates: this step's backward products use h and the current share; a
        # peer that prepares in the background starts before the send (which waits for A
        # to take Enc(h), after the products of the parties before this one)
        early = train and self.peer.background_prepare
        if early:
            self.peer.prepare_operands((x.shape[0], self.o), w=ar.operand(self.w.w).T, p=x)
        ch.send_bytes(self.a, HE_ENC_H, blob)
        if train and not early:
            self.peer.prepare_operands((x.shape[0], self.o), w=ar.operand(self.w.w).T, p=x)
        v = ar.decrypt(self.key, ch.recv_bytes(self.a, HE_ENC_ZMASK), (x.shape[0], self.o))
        ar.send(ch, self.a, HE_ZSHARE, v + ar.product(ar.copy_of(self.key, x), self.w.w))

    def _h_bits(self) -> int | None:
        """A only multiplies Enc(h'_i), by its share W_i - W^P: below 2^k + |W_i| <
        2^(k+1) when re-drawn."""
        return None if self.share_bits is None else self.share_bits + 1

    def backward(self) -> torch.Tensor:
        ch, ar = self.ctx.channel, self.ar
        h = self._h
        assert h is not None
        b, d = h.shape
        # while A encrypts dL/dz: the randomness of this party's next Enc(h'_i) (same batch size)
        self.key.prepare_encryption((b, d), ops=frozenset({MATMUL}), share_bits=self._h_bits())
        blob_g = ch.recv_bytes(self.a, HE_ENC_G)
        mu = ar.mask(self.stream, (b, d), terms=self.o, share=True)
        r_mask = ar.mask(self.stream, (d, self.o), terms=b, share=False)
        ch.send_bytes(self.a, HE_ENC_GH, self.peer.matmul(blob_g, (b, self.o), ar.operand(self.w.w).T, mu))
        ch.send_bytes(self.a, HE_ENC_GW, self.peer.tmatmul(h, blob_g, (b, self.o), -r_mask))
        masked = ar.recv(ch, self.a, HE_GH_MASKED, (b, d))
        self.w.step(r_mask)
        drawn = ar.redraw(self.stream, self.w.w)
        if drawn is not None:  # re-draw: A's share becomes W_i - U (module docstring)
            delta, self.w.w = drawn
            ar.send(ch, self.a, HE_RESHARE, delta)
        self._h = None
        grad = ar.to_float(masked - mu)  # dL/dh'_i at the rows as encrypted
        if self._clip is not None:  # through the clipping, to the embedding as given
            grad = clip_rows_grad(*self._clip, grad)
            self._clip = None
        return torch.from_numpy(grad).float().to(self.ctx.device)

    def state(self) -> dict[str, torch.Tensor]:
        return {"interactive_share": torch.from_numpy(self.ar.to_float(self.w.w)).float()}

    def checkpoint_state(self) -> ComponentState:
        """P_i's share W^P of W_i and its momentum, and the passes so far. Under a
        re-drawing scheme the share is P_i's own uniform U (independent of W_i);
        its momentum is a sum of P_i's masks."""
        return ComponentState({"share": self.w.saved()}, {"passes": self.passes})

    def restore(self, state: ComponentState) -> None:
        self.w.load(state.tensors["share"])
        self.passes = int(state.meta.get("passes", 0))


def he_backend(name: str, scheme_cls: type[HEScheme], description: str) -> type[ExchangeBackend]:
    """An exchange backend running the two-party protocol with a scheme (its
    package registers it in EXCHANGES by path, :mod:`securevfl.exchange`).
    The scheme's options model must have ``weight_init`` (:data:`HEWeightInit`) and
    ``insecure`` fields."""

    class _Backend(ExchangeBackend):
        capabilities = frozenset({"he"})
        options = scheme_cls.options
        scheme = scheme_cls

        @classmethod
        def check(cls, proto: Protocol, options: BaseModel) -> None:
            scheme_cls.check(proto, options)
            check_weight_init(options)

        @classmethod
        def active(cls, ctx: ExchangeContext) -> ActiveExchange:
            return HEActive(ctx, scheme_cls.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def passive(cls, ctx: ExchangeContext) -> PassiveExchange:
            return HEPassive(ctx, scheme_cls.for_run(ctx), ctx.options.weight_init)  # type: ignore[attr-defined]

        @classmethod
        def result_info(cls, options: BaseModel) -> dict[str, Any]:
            info = super().result_info(options)
            info.update(scheme_cls.describe(options))
            info["insecure"] = options.weight_init == "seeded"  # type: ignore[attr-defined]
            if info["insecure"]:
                info["warning"] = SEEDED_WARNING
            return info

    _Backend.name = name
    _Backend.description = description
    _Backend.__name__ = _Backend.__qualname__ = f"{name.capitalize()}Backend"
    return _Backend
