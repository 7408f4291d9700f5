"""Big-integer kernels of ``paillier`` evaluation (pure functions over gmpy2 ints).

``multiexp`` computes the homomorphic product Enc(X) @ W of a block of packed
ciphertexts by a plaintext integer matrix: out[j] = prod_k c_k^(e[k, j]) mod n^2,
i.e. sum_k e[k, j] x_k under encryption (one ciphertext x scalar product per
non-zero e[k, j], and the additions between them). ``powmods`` batches fixed-
exponent powers (decryption) over threads: gmpy2's list powmod releases the GIL.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gmpy2
import numpy as np

from securevfl.exchange.paillier.counters import count

ONE = gmpy2.mpz(1)

_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
_EXEC_LOCK = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    with _EXEC_LOCK:
        ex = _EXECUTORS.get(threads)
        if ex is None:
            ex = _EXECUTORS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="paillier")
        return ex


def powmods(bases: list[Any], e: Any, mod: Any, threads: int) -> list[Any]:
    """[b^e mod m]; gmpy2's list powmod releases the GIL, so chunks run in parallel."""
    count(modexps=len(bases))
    if threads <= 1 or len(bases) < 2 * threads:
        return gmpy2.powmod_base_list(bases, e, mod)
    step = -(-len(bases) // threads)
    parts = [bases[i : i + step] for i in range(0, len(bases), step)]
    out: list[Any] = []
    for part in _executor(threads).map(lambda b: gmpy2.powmod_base_list(b, e, mod), parts):
        out.extend(part)
    return out


def plan(k: int, j: int, bits: int) -> tuple[int, int]:
    """(group size g, digit bits c) minimizing the multiplications of :func:`multiexp`:
    (k/g) 2^(g c) for the tables plus j ceil(bits/c) (k/g) for the accumulations."""
    best: tuple[float, int, int] | None = None
    for g in (1, 2, 3, 4, 5, 6, 8):
        for c in range(1, 9):
            if g * c > 10:
                continue
            groups = -(-k // g)
            cost = groups * (1 << (g * c)) + j * (-(-bits // c)) * groups + j * bits / 8
            if best is None or cost < best[0]:
                best = (cost, g, c)
    assert best is not None
    return best[1], best[2]


def group_tables(bases: list[Any], g: int, c: int, mod: Any) -> list[list[Any]]:
    """For every group of g consecutive bases (the last padded with 1), the table of
    prod_m base_m^(d_m) over all c-bit digits d, indexed by sum_m d_m 2^(c m)."""
    tables = []
    muls = 0
    for i in range(0, len(bases), g):
        grp = bases[i : i + g]
        tab = [ONE]
        for base in grp:
            pw = [ONE, base]
            for _ in range((1 << c) - 2):
                pw.append(pw[-1] * base % mod)
            muls += (1 << c) - 2
            nxt = list(tab)
            for p in pw[1:]:
                nxt.extend(p if t is ONE else t * p % mod for t in tab)
                muls += len(tab) - 1
            tab = nxt
        tab.extend([ONE] * ((1 << (g * c)) - len(tab)))  # a short last group: digits of 0
        tables.append(tab)
    count(mulmods=muls)
    return tables


LIMB_BITS = 62


def _digits(eb: np.ndarray, c: int, nwin: int) -> np.ndarray:
    """The c-bit digits of non-negative exponents, window 0 the most significant:
    shape (window, k, j). int64 exponents are shifted directly; larger ones (Python
    ints) are cut into 62-bit int64 limbs first, and a window that straddles two
    limbs takes its high bits from the next one."""
    mask = (1 << c) - 1
    shifts = c * np.arange(nwin - 1, -1, -1)
    if eb.dtype != object:
        return (eb[None, :, :] >> shifts.reshape(nwin, 1, 1)) & mask
    low = (1 << LIMB_BITS) - 1
    nlimbs = -(-(c * nwin) // LIMB_BITS)
    limbs = [((eb >> (LIMB_BITS * i)) & low).astype(np.int64) for i in range(nlimbs)]
    out = np.empty((nwin, *eb.shape), dtype=np.int64)
    for w, sh in enumerate(shifts.tolist()):
        li, r = divmod(sh, LIMB_BITS)
        d = limbs[li] >> r
        if r + c > LIMB_BITS and li + 1 < nlimbs:
            d = d | (limbs[li + 1] << (LIMB_BITS - r))
        out[w] = d & mask
    return out


def digit_indices(e: np.ndarray, g: int, c: int, nwin: int) -> np.ndarray:
    """Table indices (j, window from the top, group): sum_m digit(e[g q + m, j]) 2^(c m),
    for non-negative exponents (int64, or Python ints of any size)."""
    k, j = e.shape
    groups = -(-k // g)
    pad = np.zeros((groups * g, j), dtype=e.dtype)
    pad[:k] = e
    dig = _digits(pad, c, nwin)  # window, k, j
    weights = (1 << (c * np.arange(g))).reshape(1, 1, g, 1)
    idx = (dig.reshape(nwin, groups, g, j) * weights).sum(axis=2)  # window, group, j
    return idx.transpose(2, 0, 1)


class Exponents:
    """A plaintext operand prepared for :func:`multiexp`: its plan and digit
    indices, computed once and shared by every block of ciphertexts it multiplies."""

    def __init__(self, e: np.ndarray):
        self.e = e
        self.k, self.j = e.shape
        top = int(np.abs(e).max()) if e.size else 0
        self.zero = top == 0
        self.bits = top.bit_length()
        self.off = 1 << self.bits
        self.g, self.c = plan(self.k, self.j, self.bits + 1)
        self.nwin = -(-(self.bits + 1) // self.c)
        self.idx: list[Any] = []
        if not self.zero:
            self.idx = digit_indices(e + self.off, self.g, self.c, self.nwin).tolist()
        self.nonzero = int(np.count_nonzero(e))


def multiexp(bases: list[Any], e: np.ndarray | Exponents, n2: Any) -> list[Any]:
    """out[j] = prod_k bases[k]^e[k, j] mod n2 for signed integer e (k x j; int64 or
    Python ints of any size, or an :class:`Exponents` prepared from them).

    Straus's simultaneous exponentiation with interleaved tables: the bases are
    grouped g at a time and each group gets one table of all its c-bit digit
    combinations (shared by every output), so an output costs one multiplication
    per group per c-bit window plus c squarings per window, each a product
    acc * acc mod n2 (measured 4.6 us at |n2| = 4096 against 13.3 us for
    ``powmod(acc, 2)``: powmod pays a Montgomery conversion per call, and the
    plan's windows are one or two bits). Signs: every exponent is
    offset by 2^bits to be non-negative, and the common factor
    (prod_k bases[k])^(-2^bits) is computed once and multiplied into every output.
    A base that is not invertible mod n2 raises ZeroDivisionError."""
    ex = e if isinstance(e, Exponents) else Exponents(e)
    k, j = ex.k, ex.j
    if ex.zero:
        return [ONE] * j
    g, c, nwin, bits = ex.g, ex.c, ex.nwin, ex.bits
    tables = group_tables(bases, g, c, n2)
    prod = ONE
    for b in bases:
        prod = prod * b % n2
    fix = gmpy2.powmod(gmpy2.invert(prod, n2), ex.off, n2)
    out = []
    muls = 0
    for jj in range(j):
        acc = ONE
        for win in ex.idx[jj]:
            if acc is not ONE:
                for _ in range(c):  # c squarings: a product is ~3x cheaper than powmod(acc, 2^c)
                    acc = acc * acc % n2
            for tab, d in zip(tables, win, strict=True):
                if d:
                    if acc is ONE:  # the first factor needs no product
                        acc = tab[d]
                    else:
                        acc = acc * tab[d] % n2
                        muls += 1
        out.append(acc * fix % n2)
    nz = ex.nonzero
    count(
        ct_scalar=nz,
        ct_add=max(0, nz - j),
        mulmods=muls + j + k + bits + j * (nwin - 1) * c,
    )
    return out
