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


def window_for(bits: int, k: int, j: int) -> int:
    """The Straus window width that minimizes table plus accumulation multiplications."""
    best, best_w = None, 1
    for w in range(1, 9):
        nwin = -(-bits // w)
        cost = k * ((1 << w) - 2) + j * nwin * (k * (1 - 2.0**-w) + 2 * w)
        if best is None or cost < best:
            best, best_w = cost, w
    return best_w


def multiexp(bases: list[Any], e: np.ndarray, n2: Any) -> list[Any]:
    """out[j] = prod_k bases[k]^e[k, j] mod n2 for signed int64 e (k x j).

    Straus-style: a table of bases[k]^1..2^w-1 per base, shared by every output;
    per output one Horner pass over w-bit windows, positive and negative
    exponents in separate accumulators, one inversion at the end. A base that is
    not invertible mod n2 raises ZeroDivisionError."""
    k, j = e.shape
    a = np.abs(e)
    top = int(a.max()) if a.size else 0
    if top == 0:
        return [ONE] * j
    bits = top.bit_length()
    w = window_for(bits, k, j)
    nwin = -(-bits // w)
    wmask = (1 << w) - 1
    tables = []
    for c in bases:
        t = [ONE, c]
        for _ in range((1 << w) - 2):
            t.append(t[-1] * c % n2)
        tables.append(t)
    shifts = (w * np.arange(nwin - 1, -1, -1)).reshape(nwin, 1, 1)
    digits = (a[None, :, :] >> shifts) & wmask
    muls = int(np.count_nonzero(digits))
    digits_l = digits.transpose(2, 0, 1).tolist()  # j, window, k
    neg = (e < 0).T.tolist()
    sq = gmpy2.mpz(1 << w)
    out = []
    for jj in range(j):
        pos_acc, neg_acc = ONE, ONE
        negj = neg[jj]
        for win in digits_l[jj]:
            if pos_acc != 1:
                pos_acc = gmpy2.powmod(pos_acc, sq, n2)
            if neg_acc != 1:
                neg_acc = gmpy2.powmod(neg_acc, sq, n2)
            for kk, dg in enumerate(win):
                if dg:
                    if negj[kk]:
                        neg_acc = neg_acc * tables[kk][dg] % n2
                    else:
                        pos_acc = pos_acc * tables[kk][dg] % n2
        out.append(pos_acc if neg_acc == 1 else pos_acc * gmpy2.invert(neg_acc, n2) % n2)
    nz = int(np.count_nonzero(e))
    count(
        ct_scalar=nz,
        ct_add=max(0, nz - j),
        mulmods=k * ((1 << w) - 2) + muls + 2 * j * (nwin - 1) * w,
    )
    return out
