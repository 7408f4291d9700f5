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

Start (``weight_init: private``): W_i^0 = R_A G_P, A's Haar-random d x d orthogonal
matrix times P_i's d x o matrix of independent N(0, 1 / (3 d)) entries
(:mod:`securevfl.exchange.he.orthogonal`: W_i^0 is then exactly a Gaussian start,
independent of A's view; P_i knows it only up to A's rotation)::

    P_i -> A   Enc_P(G_P^T)                          G_P: P_i's d x o Gaussian factor
    A   -> P_i Enc_P(G_P^T R_A^T + eps)              R_A: A's d x d Haar; eps: A's mask (o x d)
    P_i:       W^P = (that)^T = W_i^0 + eps^T;   A: W^A = -eps^T

Then P_i re-draws its share at once (below), so A holds W_i^0 - U and P_i holds U
before the first step. Each decrypted value is masked as every product is, and the
re-draw hides W_i^0 from A as it hides every later W_i.

Operand bounds, when the scheme declares one (:meth:`HEScheme.value_bound` = C;
``ckks`` and ``paillier``): P_i clips every row of h to l2 norm C before it
encrypts (and multiplies) it, and returns the gradient through the clipping; A
scales g so that its rows and columns are within C
(:mod:`securevfl.exchange.he.bounds`). The scheme's guards then hold for any bottom
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

A scheme (CKKS, Paillier) implements :class:`~securevfl.exchange.he.scheme.HEScheme`;
the packing of values into ciphertexts is the scheme's own business, behind
``encrypt``/``matmul``/``tmatmul``. The messages are :mod:`securevfl.exchange.he.messages`;
a backend is its declaration (:class:`~securevfl.exchange.he.declaration.HEBackend`) and
one small class of role objects (:class:`~securevfl.exchange.he.roles.HERoles`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from securevfl.csprng import SecretStream
from securevfl.errors import Diverged
from securevfl.exchange.base import ActiveExchange, ExchangeContext, PassiveExchange
from securevfl.exchange.he.bounds import clip_rows, clip_rows_grad, scale_to_bound
from securevfl.exchange.he.messages import (
    HE_ENC_G,
    HE_ENC_GH,
    HE_ENC_GW,
    HE_ENC_H,
    HE_ENC_ZMASK,
    HE_GH_MASKED,
    HE_PUBLIC,
    HE_RESHARE,
    HE_START_ENC,
    HE_START_MASKED,
    HE_ZSHARE,
    MAX_PUBLIC_BYTES,
)
from securevfl.exchange.he.orthogonal import gaussian_factor, haar
from securevfl.exchange.he.scheme import MATMUL, HEPeer, HEScheme, ShareArith
from securevfl.models import build_interactive
from securevfl.runtime.channel import Channel
from securevfl.snapshot import ComponentState


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
        for i, r in enumerate(self.peers_rank):  # P_i's Gaussian factor arrives encrypted
            d = self.ctx.embed_dims[i]
            blob = ch.recv_bytes(r, HE_START_ENC)
            eps = ar.mask(self.stream, (o, d), terms=d, share=True)
            rot = ar.operand(ar.from_float(haar(self.stream, d).T))
            ch.send_bytes(r, HE_START_MASKED, self.peer[i].matmul(blob, (o, d), rot, eps))
            shares.append(-eps.T)
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
        g = gaussian_factor(self.stream, d, o)  # goes out encrypted; A multiplies by R_A^T
        ch.send_bytes(
            self.a,
            HE_START_ENC,
            self.key.encrypt_shared(g.T, ops=frozenset({MATMUL}), share_bits=self._h_bits()),
        )
        share = ar.decrypt(self.key, ch.recv_bytes(self.a, HE_START_MASKED), (o, d)).T
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
