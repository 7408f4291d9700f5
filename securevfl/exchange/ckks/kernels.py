"""Evaluation of the products on ciphertexts: baby-step giant-step over the
diagonals of a :class:`~securevfl.exchange.ckks.packing.LinearMap`.

Baby rotations of each input are shared by every output; each (output, giant
step) group is summed, rescaled once and then rotated at the lower level
(PackVFL's lazy rotate-and-sum, arXiv 2405.00482, in BSGS form). The diagonals
are encoded at scale q1, the prime the rescale drops, so results come back at
exactly the input scale 2^global_scale_bits: one multiplicative level,
``coeff_mod_bit_sizes = [output primes..., q1, special]``.

Threat model: this runs at the party *without* the secret key, on the other
party's ciphertexts and its own plaintext operands (weight share, embedding);
it only calls public SEAL operations (Galois keys, no relinearization: no
ciphertext x ciphertext product exists). Hiding the operands from the key
owner is the caller's job (re-randomization and masks,
:mod:`securevfl.exchange.ckks.peer`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from securevfl.exchange.ckks._tenseal import sa
from securevfl.exchange.ckks.counters import OpCounter
from securevfl.exchange.ckks.packing import LinearMap


class Ring:
    """The CKKS encoder and the two levels of a context (fresh inputs, results)."""

    def __init__(self, sc: Any, counter: OpCounter):
        self.sc = sc
        self.ops = counter
        self.encoder = sa.CKKSEncoder(sc)
        self.slots = self.encoder.slot_count()
        data = sc.first_context_data()
        levels = []
        while data is not None:
            levels.append(data)
            data = data.next_context_data()
        # levels[0]: every data prime (fresh ciphertexts); levels[1]: after the rescale (results)
        self.in_level = levels[0].parms_id()
        self.out_level = levels[1].parms_id()
        self.q1 = float(levels[0].parms().coeff_modulus()[-1].value())
        self.costs = costs(len(levels[0].parms().coeff_modulus()), len(levels[1].parms().coeff_modulus()))

    def encode(self, values: np.ndarray, parms_id: Any, scale: float) -> Any:
        pt = sa.Plaintext()
        if np.iscomplexobj(values):
            self.encoder.encode(values.tolist(), parms_id, scale, pt)
        else:
            self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), parms_id, scale, pt)
        self.ops.encode += 1
        return pt


# Relative costs used to pick the baby-step size: one key switching at a level of
# L primes ~ L (L + 1), a rescale ~ L (measured ratios at N=8192).
def costs(n_in: int, n_out: int) -> tuple[float, float, float]:
    return n_in * (n_in + 1), n_out * (n_out + 1), 0.7 * n_in


def signed(k: int, slots: int) -> int:
    """The rotation by k (mod slots) as SEAL's signed step, |k| <= slots / 2."""
    k %= slots
    return k - slots if k > slots // 2 else k


def naf_weight(k: int) -> int:
    """Key switchings SEAL needs for a rotation by k with power-of-two keys."""
    k, w = abs(k), 0
    while k:
        if k & 1:
            digit = 2 - (k & 3)  # +1 or -1 (non-adjacent form)
            k -= digit
            w += 1
        k >>= 1
    return w


@functools.lru_cache(maxsize=16)
def _naf_table(slots: int, step: int) -> np.ndarray:
    return np.array([naf_weight(signed(k * step, slots)) for k in range(slots // step)])


def plan(lmap: LinearMap, slots: int, cost: tuple[float, float, float]) -> tuple[int, int]:
    """Common step and baby-step count minimising the estimated rotation cost."""
    c_top, c_low, c_rescale = cost
    step = math.gcd(slots, *np.unique(lmap.delta).tolist())
    d = lmap.delta // step
    naf = _naf_table(slots, step)
    k = 2 if lmap.conj else 1
    best: tuple[float, int] | None = None
    for n1 in range(1, min(int(d.max()) + 1, 128) + 1):
        d1, d2 = d % n1, d // n1
        baby = np.unique(lmap.t * slots + d1) % slots
        giant = np.unique(lmap.s * slots + d2) % slots
        cost_n1 = c_top * naf[baby].sum() + k * (
            c_rescale * len(giant) + c_low * naf[(giant * n1) % (slots // step)].sum()
        )
        if best is None or cost_n1 < best[0]:
            best = (cost_n1, n1)
    assert best is not None
    return step, best[1]


@dataclass
class Encoded:
    """A map's BSGS plan (common step, baby-step count) and its encoded diagonals
    per group: (direct, conjugate part), None where there is none."""

    step: int
    n1: int
    pts: list[tuple[Any | None, Any | None]]


class Kernels:
    """Counted SEAL evaluation with one peer's public keys."""

    def __init__(self, ring: Ring, galois: Any, scale: float):
        self.ring, self.gk, self.scale = ring, galois, scale
        self.ops = ring.ops
        self.ev = sa.Evaluator(ring.sc)
        self._plans: dict[tuple[Any, ...], tuple[int, int]] = {}

    def rot(self, ct: Any, k: int) -> Any:
        k = signed(k, self.ring.slots)
        if k == 0:
            return ct
        out = sa.Ciphertext()
        self.ev.rotate_vector(ct, k, self.gk, out)
        self.ops.rotate += 1
        self.ops.key_switch += naf_weight(k)
        return out

    def add_inplace(self, acc: Any, other: Any) -> None:
        self.ev.add_inplace(acc, other)
        self.ops.add += 1

    def sum(self, parts: list[Any]) -> Any:
        acc = parts[0]
        for p in parts[1:]:
            self.add_inplace(acc, p)
        return acc

    def encode_map(self, lmap: LinearMap) -> Encoded:
        """The BSGS plan and every plaintext diagonal of ``lmap``, rolled by its giant
        step and encoded at scale q1 (a diagonal shared by several groups once).
        Needs no ciphertext, so a party can run it while it waits for the input."""
        ring, slots = self.ring, self.ring.slots
        key = (lmap.t.tobytes(), lmap.s.tobytes(), lmap.delta.tobytes(), lmap.conj)
        if key not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[key] = plan(lmap, slots, ring.costs)
        step, n1 = self._plans[key]
        shifts = (lmap.delta // step // n1) * n1 * step
        encoded: dict[bytes, Any] = {}
        pts: list[tuple[Any | None, Any | None]] = []
        for gi in range(len(lmap.t)):
            pair: list[Any | None] = [None, None]
            for j, dg in enumerate(lmap.diag(gi)):
                if dg is None:
                    continue
                dg = np.roll(dg if j == 0 else np.conj(dg), int(shifts[gi]))
                if not dg.any():
                    continue
                if np.iscomplexobj(dg) and not dg.imag.any():
                    dg = dg.real
                tag = dg.tobytes() + bytes([dg.dtype.kind == "c"])
                if tag not in encoded:
                    encoded[tag] = ring.encode(dg, ring.in_level, ring.q1)
                if not encoded[tag].is_zero():  # all entries round to 0 at q1: SEAL refuses the product
                    pair[j] = encoded[tag]
            pts.append((pair[0], pair[1]))
        return Encoded(step, n1, pts)

    def apply(self, cts: list[Any], lmap: LinearMap, encoded: Encoded | None = None) -> list[Any | None]:
        """The map's outputs (None where no diagonal reaches an output), folded;
        ``encoded``: the map's :meth:`encode_map`, if the caller prepared it."""
        ev = self.ev
        enc = self.encode_map(lmap) if encoded is None else encoded
        step, n1 = enc.step, enc.n1
        d = lmap.delta // step
        d1, d2 = d % n1, d // n1
        baby: dict[tuple[int, int], Any] = {}
        for t, a in sorted({(int(t), int(a)) for t, a in zip(lmap.t, d1, strict=True)}):
            baby[(t, a)] = self.rot(cts[t], a * step)
        n_out = lmap.n_out
        outs: list[list[Any]] = [[] for _ in range(n_out)]
        conj_outs: list[list[Any]] = [[] for _ in range(n_out)]
        order = np.lexsort((d2, lmap.s))
        keys = np.stack([lmap.s[order], d2[order]], axis=1)
        starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
        ends = np.r_[starts[1:], len(order)]
        for lo, hi in zip(starts, ends, strict=True):
            s, b = int(keys[lo, 0]), int(keys[lo, 1])
            shift = b * n1 * step
            acc: list[Any | None] = [None, None]
            for gi in order[lo:hi]:
                src = baby[(int(lmap.t[gi]), int(d1[gi]))]
                for j, pt in enumerate(enc.pts[int(gi)]):
                    if pt is None:
                        continue
                    prod = sa.Ciphertext()
                    ev.multiply_plain(src, pt, prod)
                    self.ops.multiply_plain += 1
                    if acc[j] is None:
                        acc[j] = prod
                    else:
                        self.add_inplace(acc[j], prod)
            for j, a in enumerate(acc):
                if a is None:
                    continue
                ev.rescale_to_next_inplace(a)
                self.ops.rescale += 1
                if a.scale != self.scale:  # exact: diagonals are encoded at scale q1
                    raise RuntimeError(f"ckks: scale {a.scale} after rescale, expected {self.scale}")
                (outs if j == 0 else conj_outs)[s].append(self.rot(a, shift))
        result: list[Any | None] = []
        for s in range(n_out):
            parts = outs[s]
            if conj_outs[s]:
                c = self.sum(conj_outs[s])
                ev.complex_conjugate_inplace(c, self.gk)
                self.ops.key_switch += 1
                parts = [*parts, c]
            result.append(self.sum(parts) if parts else None)
        if result and result[0] is not None:
            for k in lmap.fold:
                self.add_inplace(result[0], self.rot(result[0], k))
        return result
