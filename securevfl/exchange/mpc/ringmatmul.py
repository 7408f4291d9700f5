"""Exact matrix products in the ring Z_2^64 (torch int64) on float64 BLAS, for CPU.

Every product of the ``mpc`` backend is a product of ring elements: each party's
Beaver arithmetic (c + eps b + a delta + eps delta on its shares) and the dealer's
c = a b for every triple. torch has no BLAS for integers. On a CPU with AVX-512
its int64 ``matmul`` runs fbgemm's JIT kernel and costs about what float64 does;
on AVX2-only x86 CPUs (the machines most users own) fbgemm runs reference loops:
(256 x 64) @ (64 x 64) takes 1.9 ms in int64 against 0.063 ms in float64 on one
core of an AMD EPYC with fbgemm's AVX-512 path turned off (docs/mpc-kernels.md),
2.8 ms against 0.12 ms on an AVX2-only EPYC.

The limb product (CrypTen does the same on CUDA, ``crypten/cuda/cuda_tensor.py``):
every ring element is written in balanced base-2^22 digits,
x = d_0 + 2^22 d_1 + 2^44 d_2 (mod 2^64) with |d_0|, |d_1| <= 2^21 and
|d_2| <= 2^19 (:func:`split_limbs`). Then x y = S_0 + 2^22 S_1 + 2^44 S_2 (mod 2^64)
with S_s the sum of the digit products X_i Y_j with i + j = s; the products with
i + j >= 3 are multiples of 2^66 and vanish mod 2^64, so 6 of the 9 are computed.
Each S_s is a float64 product of digit matrices; the digits of x lie side by side
along the inner dimension ([X_0 | X_1 | X_2]) and those of y stacked in reverse
([Y_2; Y_1; Y_0]), so S_0, S_1 and S_2 are three BLAS calls on slices of the same
two buffers, and the results are recombined in int64 with shifts (which wrap mod
2^64 exactly as the ring does).

**Exactness bound.** float64 holds every integer of magnitude <= 2^53 exactly, so
a sum of integers is exact in any order of summation (FMA or not) while the sum
of the terms' magnitudes is <= 2^53. Digit products are at most 2^42 in
magnitude; over an inner dimension of c, S_0 has c such terms, S_1 2c and S_2 at
most 1.5 c terms' worth (its products with d_2 are <= 2^40), so every float64
value the kernel forms is below 2c 2^42 <= 2^53 when c <= :data:`CHUNK` = 1024.
Longer inner dimensions are cut into chunks of at most 1024 whose recombined
int64 results are added in the ring. Three limbs are the fewest that can be
exact at all (two of 32 bits give products of 2^62), and narrower limbs (four of
16 bits, exact up to 2^21 terms) cost 10 float64 products instead of 6, more
than the chunks' recombination at every inner dimension measured
(docs/mpc-kernels.md); so the inner dimension sets the chunking, not the width.

**Which kernel.** :func:`kernel` picks, once per process, the faster of the two
exact kernels on this machine (a timed probe; the results are bit-identical
either way, only the speed differs): ``int64`` (torch's own, fbgemm's AVX-512
kernel where there is one) or ``limbs``. ``SECUREVFL_RING_KERNEL=int64|limbs``
forces one (benchmarks, A/B comparisons).

**Where it is installed.** On CUDA CrypTen's shares are ``CUDALongTensor``s,
whose ``__torch_function__`` takes ``torch.matmul`` to CrypTen's limb product;
that path is kept as it is: everything here passes a product through to
``torch.matmul`` unless both operands are plain CPU int64 tensors. On CPU the
shares are plain int64 tensors, so there is no tensor type to hook, and giving
them one would send every share operation of every party (and the frames the
communicator seals) through Python. The product is chosen instead where the
protocol multiplies:

* the parties' Beaver arithmetic calls :func:`beaver_terms`: the pairwise
  layout's ``ring.beaver_share`` and the joint layout's ``ops.beaver_matmuls``
  (securevfl's batched form of CrypTen's ``beaver.matmul``); it also fuses the
  three products into one limb product over twice the inner dimension
  (eps (b + delta) + a delta at the first party, a ring identity);
* the dealer (``crypten.dealer.SecretDealer``, securevfl's own TTP server) is
  given :func:`ring_matmul` as the product it computes every c = a b with: the
  joint layout's triples (its ``additive``) and the pairwise layout's
  (``crypten.dealer.pair_c0``, ``pair_step_c0``);
* the provider calls a party makes for its triples (CrypTen's insecure TFP
  computes c = a b at the parties) run inside :class:`RingProducts`, a
  ``TorchFunctionMode`` (the same ``__torch_function__`` protocol, applied to a
  scope instead of a tensor type) that takes every CPU int64 ``matmul`` to
  :func:`ring_matmul`. The dealer takes the kernel as an argument rather than a
  scope: a mode sees every torch call of its scope (thousands per bundle), an
  argument only the products.

The training loop never sees any of this: it calls the exchange as before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from securevfl.exchange.mpc import KERNEL_ENV as KERNEL_ENV
from securevfl.exchange.mpc import KERNELS as KERNELS
from securevfl.exchange.mpc import forced_kernel

LIMB_BITS = 22
LIMBS = 3
CHUNK = 1024  # inner-dimension terms per float64 sum: 2 * 1024 * 2^42 = 2^53

_LOW = 64 - LIMB_BITS  # shift that leaves the low digit's bits at the top

Pair = tuple[torch.Tensor, torch.Tensor]


def split_limbs(x: torch.Tensor, d0: torch.Tensor, d1: torch.Tensor, d2: torch.Tensor) -> None:
    """Write the balanced base-2^22 digits of the ring elements ``x`` (int64, any
    strides) into the float64 views ``d0``, ``d1``, ``d2`` of x's shape:
    x = d0 + 2^22 d1 + 2^44 d2 (mod 2^64), |d0|, |d1| <= 2^21, |d2| <= 2^19.

    d0 is x's low 22 bits read as a signed number; r = (x - d0) / 2^22 is then an
    exact 42-bit integer (exact in float64 too), split in floating point as
    d2 = round(r / 2^22) and d1 = r - 2^22 d2: every value formed is an integer
    below 2^42, so each operation is exact."""
    lo = x << _LOW
    lo >>= _LOW
    d0.copy_(lo)
    r = x - lo  # wraps mod 2^64; its low 22 bits are zero
    r >>= LIMB_BITS
    d1.copy_(r)
    torch.mul(d1, 2.0**-LIMB_BITS, out=d2)
    d2.round_()
    d1.add_(d2, alpha=-(2.0**LIMB_BITS))


def _recombine(s0: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """S_0 + 2^22 S_1 + 2^44 S_2 mod 2^64 from the exact float64 digit sums."""
    z = s2.long()
    z <<= LIMB_BITS
    z += s1.long()
    z <<= LIMB_BITS
    z += s0.long()
    return z


def _chunks(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """The pairs' inner dimensions laid end to end and cut into near-equal chunks
    of at most :data:`CHUNK`; each chunk lists the (x, y) slices it holds."""
    total = sum(x.shape[-1] for x, _ in pairs)
    n = max(1, math.ceil(total / CHUNK))
    size = math.ceil(total / n) if total else 0
    out: list[list[Pair]] = [[] for _ in range(n)]
    at = 0  # global inner index of the current pair's first column
    for x, y in pairs:
        k = x.shape[-1]
        lo = 0
        while lo < k:
            c = (at + lo) // size
            hi = min(k, (c + 1) * size - at)
            out[c].append((x[..., lo:hi], y[..., lo:hi, :]))
            lo = hi
        at += k
    return out


def _chunk_product(pieces: Sequence[Pair]) -> torch.Tensor:
    """sum_j x_j @ y_j mod 2^64 over one chunk (total inner dimension <= CHUNK):
    three float64 products on the digit buffers, recombined in int64."""
    x0, y0 = pieces[0]
    c = sum(x.shape[-1] for x, _ in pieces)
    xs = torch.empty((*x0.shape[:-1], LIMBS, c), dtype=torch.float64)
    ys = torch.empty((*y0.shape[:-2], LIMBS, c, y0.shape[-1]), dtype=torch.float64)
    at = 0
    for x, y in pieces:
        k = x.shape[-1]
        # x's digits side by side, [X_0 | X_1 | X_2]; y's stacked in reverse, [Y_2; Y_1; Y_0]
        split_limbs(x, xs[..., 0, at : at + k], xs[..., 1, at : at + k], xs[..., 2, at : at + k])
        split_limbs(y, ys[..., 2, at : at + k, :], ys[..., 1, at : at + k, :], ys[..., 0, at : at + k, :])
        at += k
    xf = xs.view(*xs.shape[:-2], LIMBS * c)
    yf = ys.view(*ys.shape[:-3], LIMBS * c, ys.shape[-1])
    s0 = torch.matmul(xf[..., :c], yf[..., 2 * c :, :])  # X_0 Y_0
    s1 = torch.matmul(xf[..., : 2 * c], yf[..., c:, :])  # X_0 Y_1 + X_1 Y_0
    s2 = torch.matmul(xf, yf)  # X_0 Y_2 + X_1 Y_1 + X_2 Y_0
    return _recombine(s0, s1, s2)


def limb_matmul_sum(pairs: Sequence[Pair]) -> torch.Tensor:
    """sum_j x_j @ y_j in Z_2^64 with the limb kernel, whatever :func:`kernel` says.

    Operands are CPU int64 tensors of at least 2 dimensions with torch.matmul's
    broadcasting of leading (batch) dimensions; every x_j shares one shape but its
    last dimension, every y_j one shape but its first-of-two (their inner
    dimensions k_j may differ). The inner dimensions are laid end to end, so the
    sum costs one limb product over sum_j k_j."""
    x0, y0 = pairs[0]
    if sum(x.shape[-1] for x, _ in pairs) == 0:
        shape = (*torch.broadcast_shapes(x0.shape[:-2], y0.shape[:-2]), x0.shape[-2], y0.shape[-1])
        return torch.zeros(shape, dtype=torch.long)
    out: torch.Tensor | None = None
    for pieces in _chunks(pairs):
        z = _chunk_product(pieces)
        out = z if out is None else out.add_(z)
    assert out is not None
    return out


def _timed(fn: Callable[[], Any], repeats: int = 3, *, above: float = math.inf) -> float:
    """The best of ``repeats`` calls after one warm-up, on this thread's CPU clock:
    every rank probes at the same moment of its start-up, so on a busy machine a
    wall clock would time the scheduler as much as the kernel. Stops early once
    the best is still above ``above`` (a candidate that has already lost)."""
    fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
        if best > above:
            break
    return best


def _probe_operands(m: int, k: int, n: int) -> Pair:
    """Full-range ring operands for the kernel probe, without a random generator
    (a multiplicative sequence mod 2^64: its values are not secret)."""
    a = torch.arange(1, m * k + 1, dtype=torch.long) * -7046029254386353131
    b = torch.arange(1, k * n + 1, dtype=torch.long) * 6364136223846793005
    return a.reshape(m, k), b.reshape(k, n)


_KERNEL: str | None = None


def choose_kernel() -> str:
    """The faster exact kernel on this machine, timed at (128 x 64) @ (64 x 64)."""
    x, y = _probe_operands(128, 64, 64)
    t_limbs = _timed(lambda: limb_matmul_sum([(x, y)]))
    # int64 without a fast kernel is 3-30x the limbs: one timed call at twice them settles it
    t_int = _timed(lambda: torch.matmul(x, y), above=2 * t_limbs)
    return "int64" if t_int <= t_limbs else "limbs"


def kernel() -> str:
    """``int64`` or ``limbs``: ``SECUREVFL_RING_KERNEL`` if set, else the faster
    one here (:func:`choose_kernel`, measured once per process)."""
    global _KERNEL
    forced = forced_kernel()
    if forced:
        return forced
    if _KERNEL is None:
        _KERNEL = choose_kernel()
    return _KERNEL


def _cpu_ring(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.long and t.device.type == "cpu"


def ring_matmul_sum(pairs: Sequence[Pair]) -> torch.Tensor:
    """sum_j x_j @ y_j in Z_2^64 (int64, wrapping), bit for bit what torch's int64
    products and sums give. CPU int64 operands of at least 2 dimensions take the
    faster exact kernel (:func:`kernel`), as one limb product when the shapes let
    the pairs share it (:func:`limb_matmul_sum`); anything else (CUDA shares,
    CrypTen's ``CUDALongTensor``) is left to ``torch.matmul``."""
    cpu = all(_cpu_ring(x) and _cpu_ring(y) and x.dim() >= 2 and y.dim() >= 2 for x, y in pairs)
    if not cpu or kernel() == "int64":
        out = torch.matmul(*pairs[0])
        for x, y in pairs[1:]:
            out = out + torch.matmul(x, y)
        return out
    x0, y0 = pairs[0]
    fused = all(
        x.shape[:-1] == x0.shape[:-1] and y.shape[:-2] == y0.shape[:-2] and y.shape[-1] == y0.shape[-1]
        for x, y in pairs
    )
    if fused:
        return limb_matmul_sum(pairs)
    out = limb_matmul_sum(pairs[:1])
    for p in pairs[1:]:
        out = out + limb_matmul_sum([p])
    return out


def ring_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y in Z_2^64, with torch.matmul's shape rules (1-d operands included)."""
    if not (_cpu_ring(x) and _cpu_ring(y)) or x.dim() == 0 or y.dim() == 0:
        return torch.matmul(x, y)
    vec_x, vec_y = x.dim() == 1, y.dim() == 1
    z = ring_matmul_sum([(x.unsqueeze(0) if vec_x else x, y.unsqueeze(-1) if vec_y else y)])
    if vec_y:
        z = z.squeeze(-1)
    if vec_x:
        z = z.squeeze(-1 if vec_y else -2)
    return z


def beaver_terms(
    eps: torch.Tensor, delta: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool
) -> torch.Tensor:
    """eps @ b + a @ delta (+ eps @ delta at the ``first`` party): a party's share of
    x @ y less its share of c, from the opened eps = x - a, delta = y - b (Beaver
    1991; CrypTen's ``beaver.matmul``). On CPU one fused product,
    [eps | a] @ [b (+ delta); delta]; elsewhere (CUDA) CrypTen's three products."""
    if not all(_cpu_ring(t) for t in (eps, delta, a, b)):
        z = torch.matmul(eps, b) + torch.matmul(a, delta)
        return z + torch.matmul(eps, delta) if first else z
    return ring_matmul_sum([(eps, b + delta if first else b), (a, delta)])


_MATMULS = frozenset({torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.__matmul__})


class RingProducts(TorchFunctionMode):
    """Inside this scope, ``torch.matmul`` (``mm``, ``@``, the methods) of two CPU
    int64 tensors is :func:`ring_matmul`; every other call passes through
    unchanged. Entered around CrypTen's provider calls at the parties (module docstring)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _MATMULS and not kwargs and len(args) == 2 and _cpu_ring(args[0]) and _cpu_ring(args[1]):
            return ring_matmul(args[0], args[1])
        return func(*args, **(kwargs or {}))
