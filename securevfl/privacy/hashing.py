"""Pure functions behind HashVFL (docs/methods/hashvfl.md): the sign hash with its
straight-through gradient, the pre-defined class codes, the consistency loss,
the abnormal-input detector, bit-balance statistics, the DP add-on's noise and
its honest per-bit epsilon, and a lossless bit packing of codes.

Nothing here holds state; the defense classes in
:mod:`securevfl.defenses.hashvfl` only wire these into the party hooks.

Codes are float tensors with values in {-1, +1} (the hash of docs/methods/hashvfl.md §2.4);
``d`` is the code length, ``C`` the number of classes.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ConfigError

# -- the hash (docs/methods/hashvfl.md §2.4) -----------------------------------------------------------------


def sign(v: torch.Tensor) -> torch.Tensor:
    """Sign with 0 -> +1 (the paper's definition; ``torch.sign`` would emit 0)."""
    one = torch.ones((), dtype=v.dtype, device=v.device)
    return torch.where(v >= 0, one, -one)


class _SignSTE(torch.autograd.Function):
    """Forward :func:`sign`; backward passes the upstream gradient unchanged
    (identity STE, no clipping) or zeroes it where ``|v| > 1`` (clipped STE)."""

    @staticmethod
    def forward(ctx, v: torch.Tensor, clipped: bool) -> torch.Tensor:
        ctx.clipped = clipped
        if clipped:
            ctx.save_for_backward(v)
        return sign(v)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        if ctx.clipped:
            (v,) = ctx.saved_tensors
            return g * (v.abs() <= 1).to(g.dtype), None
        return g, None


def sign_ste(v: torch.Tensor, *, clipped: bool = False) -> torch.Tensor:
    """The hash layer H = Sign(v) with a straight-through gradient dL/dv := dL/dH
    (docs/methods/hashvfl.md §2.4; ``clipped=True`` is the non-default |v| <= 1 variant)."""
    return _SignSTE.apply(v, clipped)


def straight_through(clean: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """``noisy`` forward, the gradient of ``clean`` backward (the DP noise of
    docs/methods/hashvfl.md §2.10 is passed through like the outer Sign's STE)."""
    return clean + (noisy - clean).detach()


def quantization_norm(v: torch.Tensor, p: float = 3.0) -> torch.Tensor:
    """||V - H||_p = (sum |V - H|^p)^(1/p) over the whole B x d batch matrix, with
    H = :func:`sign` (V): GreedyHash's quantization penalty, the loss term of the
    GreedyHash and "w/o consistency" ablations of docs/methods/hashvfl.md §8.1 (Table X note:
    p = 3, weight 1, one norm per batch matrix, not a per-row mean).

    H is treated as a constant (detached). That is the true derivative of the
    sign almost everywhere (0), and it is the only choice under which the term
    does anything: differentiating H through the identity straight-through
    estimator would give d(V - H)/dV = 1 - 1 = 0. So the gradient is
    d/dV_k = |V_k - H_k|^(p-1) sign(V_k - H_k) / ||V - H||_p^(p-1), pulling each
    pre-sign value toward its own code (0 where V = H; at V = H everywhere the
    norm is 0 and autograd's 0/0 is replaced by 0).
    """
    diff = v - sign(v).detach()
    a = diff.abs()
    total = (a**p).sum()
    if float(total.detach()) == 0.0:
        return total  # 0 with a zero gradient (the norm's gradient is undefined at 0)
    return total ** (1.0 / p)


# -- pre-defined class codes (docs/methods/hashvfl.md §2.5, §7 item 6) ---------------------------------------


def min_code_length(classes: int) -> int:
    """ceil(log2 C): the paper's default code length (docs/methods/hashvfl.md §3.1)."""
    return max(1, math.ceil(math.log2(classes)))


def _check_room(classes: int, bits: int) -> None:
    if classes < 2:
        raise ConfigError(f"class codes need at least 2 classes, got {classes}")
    if bits < 1 or 2**bits < classes:
        raise ConfigError(
            f"{classes} classes need distinct codes of at least {min_code_length(classes)} bits, "
            f"but the code length (the bottom models' 'out') is {bits}",
            path="parties.passive[*].model.out",
        )


def random_codes(classes: int, bits: int, generator: torch.Generator) -> torch.Tensor:
    """The paper's codes: i.i.d. uniform +-1 per class and bit, duplicates
    rejected and redrawn (docs/methods/hashvfl.md §2.5, official ``generateOrthogonalTargets``).
    Not orthogonal and not bit-balanced across classes."""
    _check_room(classes, bits)
    rows: list[torch.Tensor] = []
    seen: set[tuple[int, ...]] = set()
    while len(rows) < classes:
        row = torch.randint(0, 2, (bits,), generator=generator) * 2 - 1
        key = tuple(row.tolist())
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return torch.stack(rows).float()


def code_quality(codes: torch.Tensor) -> tuple[int, int, float]:
    """(min pairwise Hamming distance, number of pairs at that distance, worst
    bit imbalance |mean over classes of the +1 indicator - 1/2|)."""
    c = codes.shape[0]
    dist = hamming(codes[:, None, :], codes[None, :, :])
    off = dist[~torch.eye(c, dtype=torch.bool)]
    dmin = int(off.min())
    at_min = int((off == dmin).sum()) // 2
    imbalance = float(((codes > 0).float().mean(0) - 0.5).abs().max())
    return dmin, at_min, imbalance


def balanced_codes(classes: int, bits: int, generator: torch.Generator, *, tries: int = 400) -> torch.Tensor:
    """The fix of docs/methods/hashvfl.md §7 items 5-6: codes whose every bit is +1 for half
    the classes (floor/ceil for odd C), so that codes matching their class code
    on class-balanced data are bit-balanced, and, among ``tries`` seeded draws
    of such column-balanced matrices with distinct rows, the one with the
    largest minimum Hamming distance (then fewest pairs at it)."""
    _check_room(classes, bits)
    # tries x bits independent permutations of a half-+1 column
    perm = torch.rand((tries, bits, classes), generator=generator).argsort(-1)
    col = perm < classes // 2
    if classes % 2:  # odd C: alternate which sign gets the extra class
        col[:, 1::2] = ~col[:, 1::2]
    codes = col.transpose(1, 2).float() * 2 - 1  # tries x C x d
    dist = (bits - codes @ codes.transpose(1, 2)) / 2
    off = ~torch.eye(classes, dtype=torch.bool)
    dist = dist[:, off].reshape(tries, -1)
    dmin = dist.min(1).values
    at_min = (dist == dmin[:, None]).sum(1)
    # a draw with repeated rows has distance 0 and is never chosen over one without
    score = dmin * (classes * classes + 1) - at_min
    best = int(score.argmax())
    if dmin[best] == 0:
        raise ConfigError(
            f"found no column-balanced {classes} x {bits} code with distinct rows in {tries} draws; "
            "use a longer code or codes: random",
            path="parties.active.defenses",
        )
    return codes[best]


def class_codes(
    classes: int, bits: int, kind: Literal["random", "balanced"], generator: torch.Generator
) -> torch.Tensor:
    """The C x d code matrix o of the chosen kind."""
    if kind == "balanced":
        return balanced_codes(classes, bits, generator)
    return random_codes(classes, bits, generator)


# -- consistency loss and Hamming (docs/methods/hashvfl.md §2.6, §2.9) ---------------------------------------


def hamming(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamming distance between +-1 codes along the last axis: (d - <a, b>) / 2."""
    d = a.shape[-1]
    return ((d - (a * b).sum(-1)) / 2).round()


def consistency_loss(codes: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """L_cons = (1/N) sum_i mean_u (1 - <h_i^(u), o_{y_u}> / d) (docs/methods/hashvfl.md §2.6).

    ``codes`` are the N parties' B x d codes, ``targets`` = o_Y (B x d). For
    binary vectors <h, o>/d is their cosine, and 1 - cos = 2 Ham / d; the
    gradient with respect to h_i^(u) is -o_{y_u} / (N B d).
    """
    d = targets.shape[1]
    per_party = [(1 - (h * targets).sum(1) / d).mean() for h in codes]
    return torch.stack(per_party).mean()


def detect(
    codes: list[torch.Tensor], predicted_codes: torch.Tensor, threshold: float
) -> dict[str, torch.Tensor]:
    """The abnormal-input detector of docs/methods/hashvfl.md §2.9 on one batch.

    Returns per-sample tensors: ``pair_max`` (largest Hamming distance between any
    two parties' codes, O(N^2)), ``to_pred_max`` (largest distance of any party's
    code to the predicted class's code o_{y_hat}, O(N)), and the flags
    ``pair_flag`` / ``to_pred_flag`` (distance > threshold; the paper's is d/2).
    """
    b = predicted_codes.shape[0]
    pair = torch.zeros(b)
    for i in range(len(codes)):
        for j in range(i + 1, len(codes)):
            pair = torch.maximum(pair, hamming(codes[i], codes[j]).float().cpu())
    to_pred = torch.stack([hamming(h, predicted_codes).float().cpu() for h in codes]).max(0).values
    return {
        "pair_max": pair,
        "to_pred_max": to_pred,
        "pair_flag": pair > threshold,
        "to_pred_flag": to_pred > threshold,
    }


# -- bit balance (docs/methods/hashvfl.md §2.3, §7 item 5) ---------------------------------------------------


def bit_balance(codes: torch.Tensor) -> torch.Tensor:
    """Per-bit fraction of +1 over the rows of a +-1 code matrix."""
    return (codes > 0).float().mean(0)


def bit_entropy(fraction: torch.Tensor) -> torch.Tensor:
    """Binary entropy (bits) of each bit's +1 fraction; 1 is a perfectly balanced bit."""
    p = fraction.double().clamp(0, 1)
    out = torch.zeros_like(p)
    inner = (p > 0) & (p < 1)
    q = p[inner]
    out[inner] = -(q * torch.log2(q) + (1 - q) * torch.log2(1 - q))
    return out.float()


def column_median(u: torch.Tensor) -> torch.Tensor:
    """Per-column median of a B x d batch, the midpoint of the two middle values
    for even B, so that Sign(u - median) is +1 on exactly half the rows of every
    column whose values are distinct (``torch.median`` would return the lower
    middle value and put B/2 + 1 rows at +1)."""
    if u.shape[0] < 1:
        raise ValueError("the median of an empty batch is undefined")
    return torch.quantile(u.detach().double(), 0.5, dim=0, interpolation="midpoint").to(u.dtype)


def running_update(running: torch.Tensor, batch: torch.Tensor, momentum: float) -> torch.Tensor:
    """Exponential moving average (1 - momentum) * running + momentum * batch,
    the update BatchNorm applies to its running mean (docs/methods/hashvfl.md §2.3)."""
    return (1 - momentum) * running + momentum * batch


def median_sign_ste(u: torch.Tensor, threshold: torch.Tensor, *, clipped: bool = False) -> torch.Tensor:
    """The median-threshold hash Sign(u - m) with the same straight-through
    gradient as :func:`sign_ste` (dL/du := dL/dH; ``m`` is a constant).

    The fix of docs/methods/hashvfl.md §7 item 5: BN's zero batch mean balances a bit only for
    a distribution symmetric about its mean, whereas thresholding each unit at
    its median balances it for any distribution. In training ``m`` is the batch
    median (:func:`column_median`), so every bit of a batch with distinct values
    is exactly half +1; at evaluation ``m`` is a running average of those medians
    (:func:`running_update`), which balances test codes as far as the test rows'
    pre-sign values follow the training rows'."""
    return sign_ste(u - threshold.detach(), clipped=clipped)


# -- the DP add-on (docs/methods/hashvfl.md §2.10, §7 item 1) ------------------------------------------------


def paper_flip_probability(epsilon: float) -> float:
    """Per-bit flip probability of Sign(Sign(v) + Lap(2/eps)): 0.5 e^(-eps/2)."""
    return 0.5 * math.exp(-epsilon / 2)


def rr_flip_probability(epsilon: float) -> float:
    """Per-bit flip probability of eps-randomized response: 1 / (1 + e^eps)."""
    return 1.0 / (1.0 + math.exp(epsilon))


def paper_bit_epsilon(epsilon: float) -> float:
    """The pure per-bit epsilon that the paper's mechanism actually gives:
    ln((1 - p) / p) = ln(2 e^(eps/2) - 1) with p its flip probability
    (docs/methods/hashvfl.md §7 item 1; 0.83, 1.49, 5.69 at eps = 1, 2, 10)."""
    p = paper_flip_probability(epsilon)
    return math.log((1 - p) / p)


def paper_claimed_delta(epsilon: float) -> float:
    """The paper's stated delta = 1 - e^(-eps/2) (vacuous; reported as its claim)."""
    return 1.0 - math.exp(-epsilon / 2)


def binomial_flips(n: int, k: int, p: float) -> float:
    """P(exactly k of n bits flip) when each flips independently with probability p."""
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def flip_bits(codes: torch.Tensor, p: float, stream: SecretStream) -> torch.Tensor:
    """Flip each bit of a +-1 code independently with probability ``p`` (53-bit uniforms
    from the party's secret stream)."""
    u = stream.uniform(codes.shape).to(codes.device)
    return torch.where(u < p, -codes, codes)


def laplace_noise(shape: torch.Size, scale: float, stream: SecretStream) -> torch.Tensor:
    """Laplace(0, scale) samples by the inverse CDF of 53-bit uniforms from the party's
    secret stream (:meth:`SecretStream.laplace`)."""
    return stream.laplace(shape, scale).float()


def dp_noise(
    codes: torch.Tensor,
    mode: Literal["paper", "code", "rr"],
    epsilon: float,
    stream: SecretStream,
) -> torch.Tensor:
    """The DP add-on's output for clean codes (docs/methods/hashvfl.md §2.10).

    * ``paper``: Sign(Sign(v) + Lap(2/eps)), i.e. +-1 with flip prob 0.5 e^(-eps/2);
    * ``code``: Sign(v) + Lap(2/eps), continuous (the official code; not +-1);
    * ``rr``: randomized response, flip with probability 1/(1 + e^eps).
    """
    if mode == "rr":
        return flip_bits(codes, rr_flip_probability(epsilon), stream)
    noise = laplace_noise(codes.shape, 2.0 / epsilon, stream).to(codes.device)
    noisy = codes + noise
    return noisy if mode == "code" else sign(noisy)


# -- wire encoding (docs/methods/hashvfl.md §8.2 item 8) -----------------------------------------------------


def pack_codes(codes: torch.Tensor) -> np.ndarray:
    """A B x d +-1 code matrix as packed bits (uint8, d/8 bytes per row rounded up);
    a value that is not +-1 is refused rather than rounded."""
    arr = codes.detach().cpu().numpy()
    if not np.isin(arr, (-1.0, 1.0)).all():
        raise ValueError("only +-1 codes can be bit-packed")
    return np.packbits(arr > 0, axis=-1)


def unpack_codes(packed: np.ndarray, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes` for codes of ``bits`` bits."""
    out = np.unpackbits(packed, axis=-1, count=bits).astype(np.float32) * 2 - 1
    return torch.from_numpy(out)
