"""A ``ckks`` step's primitive-operation counts and their unit costs, measured
in one process on this machine, so that the floor (counts x unit costs) can be
printed beside a measured step (docs/crypto-performance.md §7).

:func:`step_counts` runs the HE calls of one protocol step
(:mod:`securevfl.exchange.he.protocol`: per passive party, Enc_P(h), A's product, P's
decryption; Enc_A(g), P's two products, A's decryptions) on random data with
fresh keys and counts each party's operations; :func:`unit_costs` times each
primitive at the same parameters. Threat model: none (local, random data, keys
thrown away); nothing here runs in a training run.

The critical-path floor is A's work plus one P_i's, all of it. In a run, P_i
encodes its backward operands on a worker thread while A evaluates its forward
product (:meth:`~securevfl.exchange.ckks.peer.CkksPeer.prepare_operands`), so
those encodings (about 320 of P_i's 324 at the reference step) overlap A's work;
A encodes its next weight share's diagonals (130 of its 134 for two parties) while
it waits for Enc(h'_i); so a measured step can come out below this floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from securevfl.exchange.ckks._tenseal import sa
from securevfl.exchange.ckks.counters import OpCounter, floor_seconds
from securevfl.exchange.ckks.kernels import naf_weight
from securevfl.exchange.ckks.key import CkksKey
from securevfl.exchange.ckks.params import CkksOptions
from securevfl.exchange.ckks.peer import CkksPeer
from securevfl.exchange.ckks.wire import HEADER, LEN
from securevfl.exchange.he.scheme import MATMUL


def step_counts(opts: CkksOptions, batch: int, dims: list[int], out: int) -> dict[str, dict[str, int]]:
    """Counts of one training step, by who does them: ``active`` (A, all pairs)
    and ``passive`` (one P_i, the largest d; the P_i run in parallel)."""
    rng = np.random.default_rng(0)
    key_a = CkksKey(opts)
    peer_a = CkksPeer(opts, key_a.public(), "A")  # what each P_i evaluates with
    active, passive = OpCounter(), OpCounter()
    g = rng.normal(scale=1e-2, size=(batch, out))
    mask = rng.normal(scale=opts.mask_std, size=(max(batch, *dims), max(out, *dims)))
    key_a.ops.reset()
    blob_g = key_a.encrypt(g)
    for i, d in enumerate(dims):
        key_p = CkksKey(opts)
        peer_p = CkksPeer(opts, key_p.public(), f"P{i + 1}")  # what A evaluates with
        h = rng.normal(size=(batch, d))
        w = rng.normal(scale=0.1, size=(d, out))
        key_p.ops.reset()
        peer_p.ops.reset()
        peer_a.ops.reset()
        blob_h = key_p.encrypt(h, ops=frozenset({MATMUL}))  # as he/protocol.py's P_i encrypts h'_i
        z = key_p.decrypt(peer_p.matmul(blob_h, (batch, d), w, mask[:batch, :out]), (batch, out))
        gh = peer_a.matmul(blob_g, (batch, out), w.T, mask[:batch, :d])
        gw = peer_a.tmatmul(h, blob_g, (batch, out), mask[:d, :out])
        key_a.decrypt(gh, (batch, d))
        key_a.decrypt(gw, (d, out))
        assert np.abs(z - mask[:batch, :out] - h @ w).max() < 1e-6
        active = active + peer_p.ops
        if d == max(dims):
            passive = key_p.ops + peer_a.ops
    active = active + key_a.ops
    return {"active": active.as_dict(), "passive": passive.as_dict()}


def _timed(fn: Callable[[], Any], n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def unit_costs(opts: CkksOptions, n: int = 20) -> dict[str, float]:
    """Seconds per primitive at these parameters (one thread, this machine).
    ``key_switch`` is a rotation by one power of two (one Galois key switching)."""
    key = CkksKey(opts)
    peer = CkksPeer(opts, key.public(), "unit")
    ring, ev, gk = peer.ring, peer.kernels.ev, peer.kernels.gk
    rng = np.random.default_rng(1)
    v = rng.normal(size=ring.slots) + 1j * rng.normal(size=ring.slots)
    pt = ring.encode(v, ring.in_level, key.scale)
    blob = key.encrypt(rng.normal(size=(ring.slots, 2)))
    ct = peer.io.load(_first_ct(blob))
    diag = ring.encode(v, ring.in_level, ring.q1)
    out = sa.Ciphertext()
    acc = sa.Ciphertext()
    ev.multiply_plain(ct, diag, acc)
    res = sa.Ciphertext()
    ev.multiply_plain(ct, diag, res)
    ev.rescale_to_next_inplace(res)
    res_bytes = peer.io.dump(res)
    pt_out = ring.encode(v, ring.out_level, key.scale)
    assert naf_weight(1) == 1  # a rotation by 1: one key switching

    def rescale() -> None:
        c = sa.Ciphertext()
        ev.multiply_plain(ct, diag, c)
        ev.rescale_to_next_inplace(c)

    t_mul = _timed(lambda: ev.multiply_plain(ct, diag, out), n)
    costs = {
        "encrypt": _timed(lambda: key.encrypt_plaintext(pt), n),
        "encrypt_public": _timed(lambda: peer.encrypt_plaintext(pt_out), n),
        "decrypt": _timed(lambda: key.decrypt_slots(res), n),
        "encode": _timed(lambda: ring.encode(v, ring.in_level, ring.q1), n),
        "multiply_plain": t_mul,
        "add": _timed(lambda: ev.add_inplace(acc, out), n),
        "key_switch": _timed(lambda: ev.rotate_vector(ct, 1, gk, out), n),
        "rescale": max(_timed(rescale, n) - t_mul, 0.0),
        "serialize": _timed(lambda: peer.io.dump(res), n),
        "deserialize": _timed(lambda: peer.io.load(res_bytes), n),
    }
    return costs


def _first_ct(blob: bytes) -> bytes:
    """The first ciphertext of a blob (header, length, bytes)."""
    (n,) = LEN.unpack_from(blob, HEADER.size)
    return blob[HEADER.size + LEN.size : HEADER.size + LEN.size + n]


def report(opts: CkksOptions, batch: int, dims: list[int], out: int) -> dict[str, Any]:
    """Counts per step, unit costs and floors: ``floor_total_s`` all parties'
    work; ``floor_critical_s`` A's work plus one P_i's (the P_i run in parallel)."""
    counts = step_counts(opts, batch, dims, out)
    unit = unit_costs(opts)
    fa, fp = floor_seconds(counts["active"], unit), floor_seconds(counts["passive"], unit)
    return {
        "counts": counts,
        "unit_s": unit,
        "floor_active_s": fa,
        "floor_passive_s": fp,
        "floor_critical_s": fa + fp,
        "floor_total_s": fa + len(dims) * fp,
    }
