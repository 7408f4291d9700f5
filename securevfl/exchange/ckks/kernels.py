"""Evaluation of the products on ciphertexts: baby-step giant-step over the
diagonals of a :class:`~securevfl.exchange.ckks.packing.LinearMap`.

Baby rotations of each input are shared by every output; each (output, giant
step) group is summed, rescaled once and then rotated at the lower level
(PackVFL's lazy rotate-and-sum, arXiv 2405.00482, in BSGS form). SEAL's Python
bindings expose neither hoisted rotations nor a cheaper path for several
rotations of one ciphertext, and a rotation by k costs one key switching per
nonzero digit of k's non-adjacent form with the power-of-two Galois keys. So
baby steps are a chain (each from the previous one) and giant steps are
combined by Horner's rule (the running sum rotated by one giant step at a
time): with a power-of-two baby-step count every rotation is by a power of
two, one key switching (the reference step's tmatmul: 80 -> 46). The diagonals
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
from securevfl.exchange.ckks.params import MAX_BABY_STEPS


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


def chain_cost(offsets: np.ndarray, naf: np.ndarray) -> int:
    """Key switchings to reach every offset (units of the table's step, all of one
    sign, 0 excluded) by a chain from 0: each rotation starts from the previous
    one, so it costs the NAF weight of the gap, 1 for consecutive offsets."""
    ks = np.unique(np.abs(offsets[offsets != 0]))
    if len(ks) == 0:
        return 0
    return int(naf[np.diff(np.r_[0, ks]) % len(naf)].sum())


def signed_units(b: np.ndarray, n: int) -> np.ndarray:
    """Giant-step indices mod n as signed indices in (-n/2, n/2]."""
    b = np.asarray(b) % n
    return np.where(b > n // 2, b - n, b)


def plan(lmap: LinearMap, slots: int, cost: tuple[float, float, float]) -> tuple[int, int]:
    """Common step and baby-step count (a power of two, at most MAX_BABY_STEPS)
    minimising the estimated key-switching cost of :meth:`Kernels.apply`: per
    input, a chain of baby rotations at the top level; per output (and conjugate
    part), one rescale per giant group and a Horner chain of giant rotations at the
    lower level. The cap bounds the key switchings the error under a diagonal's
    weight has gone through, which the decryption flooding is sized for
    (:func:`securevfl.exchange.ckks.params.error_model`); the planner picks at most 8
    for the protocol's shapes up to d = o = 64 anyway."""
    c_top, c_low, c_rescale = cost
    step = math.gcd(slots, *np.unique(lmap.delta).tolist())
    units = slots // step
    d = lmap.delta // step
    naf = _naf_table(slots, step)
    k = 2 if lmap.conj else 1
    best: tuple[float, int] | None = None
    n1 = 1
    while n1 <= min(units, MAX_BABY_STEPS):
        d1, d2 = d % n1, signed_units(d // n1, units // n1)
        baby = sum(chain_cost(d1[lmap.t == t], naf) for t in np.unique(lmap.t))
        giant, groups = 0, 0
        for s in np.unique(lmap.s):
            b = np.unique(d2[lmap.s == s])
            giant += chain_cost(b[b > 0] * n1, naf) + chain_cost(b[b < 0] * n1, naf)
            groups += len(b)
        cost_n1 = c_top * baby + k * (c_low * giant + c_rescale * groups)
        if best is None or cost_n1 < best[0]:
            best = (cost_n1, n1)
        n1 *= 2
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

    def add_plain_inplace(self, acc: Any, pt: Any) -> None:
        self.ev.add_plain_inplace(acc, pt)
        self.ops.add += 1

    def sum(self, parts: list[Any]) -> Any:
        acc = parts[0]
        for p in parts[1:]:
            self.add_inplace(acc, p)
        return acc

    def encode_map(self, lmap: LinearMap, ring: Ring | None = None) -> Encoded:
        """The BSGS plan and every plaintext diagonal of ``lmap``, rolled by its giant
        step and encoded at scale q1 (a diagonal shared by several groups once).
        Needs no ciphertext, so a party can run it while it waits for the input;
        ``ring``: another encoder of the same context (one per thread), counting
        its encodings on its own counter."""
        ring = self.ring if ring is None else ring
        slots = ring.slots
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

    def chain(self, ct: Any, offsets: list[int], unit: int) -> dict[int, Any]:
        """rot(ct, o * unit) for every offset o (all >= 0): each from the previous
        one, so consecutive offsets cost one key switching each."""
        out, cur, prev = {0: ct}, ct, 0
        for o in sorted(set(offsets) - {0}):
            cur = self.rot(cur, (o - prev) * unit)
            out[o], prev = cur, o
        return out

    def horner(self, parts: dict[int, Any], unit: int) -> Any:
        """sum over b of rot(parts[b], b * unit), by Horner's rule on each side of 0:
        farthest first, rotating the running sum by the gap to the next index, so a
        run of consecutive giant steps costs one key switching per step."""
        total = parts.get(0)
        for sign in (1, -1):
            acc, prev = None, 0
            for b in sorted((b for b in parts if b * sign > 0), key=abs, reverse=True):
                if acc is None:
                    acc = parts[b]
                else:
                    acc = self.rot(acc, (prev - b) * unit)
                    self.add_inplace(acc, parts[b])
                prev = b
            if acc is not None:
                acc = self.rot(acc, prev * unit)
                if total is None:
                    total = acc
                else:
                    self.add_inplace(total, acc)
        return total

    def apply(self, cts: list[Any], lmap: LinearMap, encoded: Encoded | None = None) -> list[Any | None]:
        """The map's outputs (None where no diagonal reaches an output), folded;
        ``encoded``: the map's :meth:`encode_map`, if the caller prepared it.

        Baby-step giant-step: with d = delta / step = b n1 + a, the baby rotations
        rot(in_t, a step) are a chain per input; the products of each (output, b)
        group are summed and rescaled once, and the groups of an output are
        combined by :meth:`horner` at the lower level (giant step n1 step)."""
        ev = self.ev
        enc = self.encode_map(lmap) if encoded is None else encoded
        step, n1 = enc.step, enc.n1
        units = self.ring.slots // step
        d = lmap.delta // step
        d1, d2 = d % n1, signed_units(d // n1, units // n1)
        baby: dict[tuple[int, int], Any] = {}
        for t in np.unique(lmap.t).tolist():
            for a, c in self.chain(cts[t], d1[lmap.t == t].tolist(), step).items():
                baby[(t, a)] = c
        n_out = lmap.n_out
        giants: list[list[dict[int, Any]]] = [[{}, {}] for _ in range(n_out)]
        order = np.lexsort((d2, lmap.s))
        keys = np.stack([lmap.s[order], d2[order]], axis=1)
        starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
        ends = np.r_[starts[1:], len(order)]
        for lo, hi in zip(starts, ends, strict=True):
            s, b = int(keys[lo, 0]), int(keys[lo, 1])
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
            for j, ct in enumerate(acc):
                if ct is None:
                    continue
                ev.rescale_to_next_inplace(ct)
                self.ops.rescale += 1
                if ct.scale != self.scale:  # exact: diagonals are encoded at scale q1
                    raise RuntimeError(f"ckks: scale {ct.scale} after rescale, expected {self.scale}")
                giants[s][j][b] = ct
        result: list[Any | None] = []
        for s in range(n_out):
            direct, conj = (self.horner(g, n1 * step) if g else None for g in giants[s])
            if conj is not None:
                ev.complex_conjugate_inplace(conj, self.gk)
                self.ops.key_switch += 1
                if direct is None:
                    direct = conj
                else:
                    self.add_inplace(direct, conj)
            result.append(direct)
        if result and result[0] is not None:
            for k in lmap.fold:
                self.add_inplace(result[0], self.rot(result[0], k))
        return result
