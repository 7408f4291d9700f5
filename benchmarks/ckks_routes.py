"""Products without rotations for ``ckks``: what each route costs at the reference point
(B=256, h=64, o=64, the default CkksOptions; docs/crypto-performance.md §3.1).

One process, one thread, fresh keys, random data; nothing here runs in a training run.
Every route is priced by the same rule, counts x unit costs measured now
(:func:`securevfl.exchange.ckks.floor.unit_costs`, the fastest of ``--reps``
measurements), so the floors compare on a loaded machine where wall times do not; the
routes that are run also print their wall time.

* ``diagonal``: today's kernels (:mod:`securevfl.exchange.ckks.kernels`), the three
  products of one passive party's step, counted as the backend counts them.
* ``batched slots``: TenSEAL's batched ``CKKSTensor`` layout, one ciphertext per input
  column with the batch in its slots; out_j = sum_k W[k, j] ct_k takes scalar plaintexts
  and no rotation. Run for the forward product (TenSEAL's own ``dot`` on such a tensor
  asks for Galois keys, so the scalar products are made here with SEAL). Its ``tmatmul``
  sums over the batch, that is over slots, so it needs rotations after all. The packed
  variant (ciphertext k holding H[b, k] in every slot (b, j), so that the slots are
  full) needs the encrypted operand replicated o/2 times: counted only.
* ``coefficient``: coefficient encoding (Cheetah, USENIX Security 2022; BOLT, S&P 2024),
  the block product of an encrypted n_w x d_w block and a plaintext d_w x m_w block in
  one polynomial product, no rotation; the cheapest power-of-two blocks with n_w d_w m_w
  <= N. It needs plaintexts built from integer coefficients: the script probes whether
  the bindings can make one (SEAL refuses a CKKS plaintext that is not in NTT form, and
  Python cannot write a SEAL object's memory), else prices each plaintext as one slot
  encoding, the only constructor left, and also as one NTT, what a constructor that
  only moved coefficients to NTT form would cost.

Usage:  python benchmarks/ckks_routes.py [--reps N]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The benchmark runs from a checkout without installing: securevfl is importable
# once the repository root is on the path.
from securevfl.exchange.ckks import CkksOptions  # noqa: E402
from securevfl.exchange.ckks._tenseal import sa  # noqa: E402
from securevfl.exchange.ckks.counters import OpCounter, floor_seconds  # noqa: E402
from securevfl.exchange.ckks.floor import unit_costs  # noqa: E402
from securevfl.exchange.ckks.key import CkksKey  # noqa: E402
from securevfl.exchange.ckks.peer import CkksPeer  # noqa: E402
from securevfl.exchange.he.scheme import MATMUL  # noqa: E402

B, H_DIM, O_DIM = 256, 64, 64


def robust_unit_costs(opts: CkksOptions, reps: int) -> dict[str, float]:
    """Each primitive's fastest time over ``reps`` short measurements: on a shared
    machine the mean follows the load, the minimum stays near the idle cost."""
    runs = [unit_costs(opts, n=3) for _ in range(reps)]
    return {k: min(r[k] for r in runs) for k in runs[0]}


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to the largest power of two <= n."""
    return [1 << i for i in range(max(1, n).bit_length()) if 1 << i <= n]


def coefficient_counts(n: int, d: int, m: int, nw: int, dw: int, mw: int) -> dict[str, int]:
    """Ciphertexts and plaintexts of the block product Enc(X) W (X: n x d encrypted,
    W: d x m plain) with blocks n_w x d_w (encrypted) and d_w x m_w (plain): one
    polynomial product per (row block, inner block, column block), the inner blocks
    of an output block summed."""
    rb, ib, cb = -(-n // nw), -(-d // dw), -(-m // mw)
    return {"inputs": rb * ib, "plaintexts": ib * cb, "products": rb * ib * cb, "outputs": rb * cb}


def coefficient_cost(c: dict[str, int], unit: dict[str, float]) -> float:
    """Seconds of a block product by the unit costs: an input is encoded, encrypted,
    sent and loaded; a plaintext is one encoding; a product one ciphertext x plaintext
    and one addition; an output is rescaled, masked and smudged (two encodings, a
    public-key encryption, two additions), sent, loaded, flooded (one encoding) and
    decrypted, as the backend treats every result ciphertext today."""
    u = unit
    per_input = u["encode"] + u["encrypt"] + u["serialize"] + u["deserialize"]
    per_output = (
        u["rescale"]
        + 3 * u["encode"]
        + u["encrypt_public"]
        + 3 * u["add"]
        + u["serialize"]
        + u["deserialize"]
        + u["decrypt"]
    )
    return (
        c["inputs"] * per_input
        + c["plaintexts"] * u["encode"]
        + c["products"] * (u["multiply_plain"] + u["add"])
        + c["outputs"] * per_output
    )


def best_coefficient(n: int, d: int, m: int, slots_n: int, unit: dict[str, float]) -> tuple[Any, ...]:
    """The cheapest power-of-two blocks with n_w d_w m_w <= N: (seconds, blocks, counts)."""
    best: tuple[Any, ...] | None = None
    for nw in pow2_upto(n):
        for dw in pow2_upto(d):
            for mw in pow2_upto(m):
                if nw * dw * mw > slots_n:
                    continue
                c = coefficient_counts(n, d, m, nw, dw, mw)
                s = coefficient_cost(c, unit)
                if best is None or s < best[0]:
                    best = (s, (nw, dw, mw), c)
    assert best is not None
    return best


def ntt_seconds(key: CkksKey, reps: int) -> float:
    """One polynomial's NTT over the inputs' primes (the fastest of ``reps``): what a
    plaintext given by integer coefficients would cost with a constructor that only
    moves it to NTT form (a ciphertext's two polynomials, back and forth, over 4)."""
    ring = key.ring
    ct = key.io.load(
        key.io.dump(key.encrypt_plaintext(ring.encode(np.ones(ring.slots), ring.in_level, key.scale)))
    )
    ev = sa.Evaluator(key.io.sc)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        ev.transform_from_ntt_inplace(ct)
        ev.transform_to_ntt_inplace(ct)
        best = min(best, (time.perf_counter() - t0) / 4)
    return best


def coefficient_plaintext_refusal(key: CkksKey) -> str | None:
    """None when a plaintext given by integer coefficients can be moved to NTT form at
    the inputs' level (what a coefficient-encoded product multiplies by), else why not."""
    pt = sa.Plaintext("1x^1 + 1")
    try:
        sa.Evaluator(key.io.sc).transform_to_ntt_inplace(pt, key.ring.in_level)
    except Exception as exc:  # SEAL's validity check raises std exceptions
        return f"{type(exc).__name__}: {exc}"
    return None


def diagonal_route(opts: CkksOptions, rng: np.random.Generator) -> list[tuple[str, float, dict[str, int]]]:
    """Today's three products of one passive party's step: (name, wall s, counts), the
    counts of both parties' work on that product (encryption, evaluation, decryption)."""
    key_p, key_a = CkksKey(opts), CkksKey(opts)
    at_a, at_p = CkksPeer(opts, key_p.public(), "P"), CkksPeer(opts, key_a.public(), "A")
    h, w = rng.normal(size=(B, H_DIM)), rng.normal(scale=0.1, size=(H_DIM, O_DIM))
    g = rng.normal(scale=1e-2, size=(B, O_DIM))
    rows = []

    def timed(name: str, owner: CkksKey, ev: CkksPeer, fn: Any) -> None:
        owner.ops.reset()
        ev.ops.reset()
        t0 = time.perf_counter()
        fn()
        rows.append((name, time.perf_counter() - t0, (owner.ops + ev.ops).as_dict()))

    def forward() -> None:
        blob = key_p.encrypt(h, ops=frozenset({MATMUL}))
        z = key_p.decrypt(at_a.matmul(blob, (B, H_DIM), w, np.zeros((B, O_DIM))), (B, O_DIM))
        assert np.abs(z - h @ w).max() < 1e-5

    blob_g: list[bytes] = []

    def backward() -> None:
        blob_g.append(key_a.encrypt(g))
        key_a.decrypt(at_p.matmul(blob_g[0], (B, O_DIM), w.T, np.zeros((B, H_DIM))), (B, H_DIM))

    def weight_grad() -> None:
        key_a.decrypt(at_p.tmatmul(h, blob_g[0], (B, O_DIM), np.zeros((H_DIM, O_DIM))), (H_DIM, O_DIM))

    timed("forward   Enc(h') W", key_p, at_a, forward)
    timed("backward  Enc(g) W^T", key_a, at_p, backward)
    timed("weights   h'^T Enc(g)", key_a, at_p, weight_grad)
    return rows


def batched_slots_forward(opts: CkksOptions, rng: np.random.Generator) -> tuple[float, float, dict[str, int]]:
    """TenSEAL's batched layout for Enc(H) W, made with SEAL: one ciphertext per input
    column (B values in the slots), scalar plaintexts. (encryption, sending and loading
    s, products s, counts);
    one output column is checked against H W."""
    key = CkksKey(opts)
    ring, ev = key.ring, sa.Evaluator(key.io.sc)
    h, w = rng.normal(size=(B, H_DIM)), rng.normal(scale=0.1, size=(H_DIM, O_DIM))
    ops = OpCounter()
    t0 = time.perf_counter()
    # encrypted, sent and loaded as the backend's inputs are
    cts = [
        key.io.load(key.io.dump(key.encrypt_plaintext(ring.encode(h[:, k], ring.in_level, key.scale))))
        for k in range(H_DIM)
    ]
    t_enc = time.perf_counter() - t0
    for op in ("encode", "encrypt", "serialize", "deserialize"):
        setattr(ops, op, H_DIM)
    t0 = time.perf_counter()
    outs = []
    for j in range(O_DIM):
        acc = None
        for k in range(H_DIM):
            pt = sa.Plaintext()
            ring.encoder.encode(float(w[k, j]), ring.in_level, ring.q1, pt)
            prod = sa.Ciphertext()
            ev.multiply_plain(cts[k], pt, prod)
            if acc is None:
                acc = prod
            else:
                ev.add_inplace(acc, prod)
                ops.add += 1
        assert acc is not None
        ev.rescale_to_next_inplace(acc)
        outs.append(acc)
    t_mul = time.perf_counter() - t0
    ops.multiply_plain += H_DIM * O_DIM
    ops.rescale += O_DIM
    got = key.decrypt_slots(outs[0])[:B].real
    assert np.abs(got - h @ w[:, 0]).max() < 1e-5
    return t_enc, t_mul, ops.as_dict()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10, help="measurements per unit cost (the fastest is used)")
    args = ap.parse_args()
    opts = CkksOptions()
    rng = np.random.default_rng(0)
    n_poly = opts.poly_modulus_degree
    slots = n_poly // 2
    unit = robust_unit_costs(opts, args.reps)
    print("unit ms (fastest of the repetitions)  " + "  ".join(f"{k} {v * 1e3:.3f}" for k, v in unit.items()))
    # a scalar plaintext (the batched route's) costs far less than a slot vector's encoding
    key = CkksKey(opts)
    pt = sa.Plaintext()
    t0 = time.perf_counter()
    for _ in range(200):
        key.ring.encoder.encode(0.5, key.ring.in_level, key.ring.q1, pt)
    scalar_encode = (time.perf_counter() - t0) / 200
    print(f"scalar encode {scalar_encode * 1e3:.4f} ms")

    print("\ndiagonal (today), one passive party's products; floor = counts x unit costs")
    total = 0.0
    for name, wall, counts in diagonal_route(opts, rng):
        fl = floor_seconds(counts, unit)
        total += fl
        cells = "  ".join(f"{k} {v}" for k, v in counts.items() if v and k != "rotate")
        print(f"  {name:24s} floor {fl * 1e3:6.0f} ms  wall {wall * 1e3:6.0f} ms  {cells}")
    print(f"  {'all three':24s} floor {total * 1e3:6.0f} ms")

    print("\nbatched slots (TenSEAL's batched CKKSTensor layout), forward product")
    t_enc, t_mul, counts = batched_slots_forward(opts, rng)
    fl = (
        H_DIM * (unit["encode"] + unit["encrypt"] + unit["serialize"] + unit["deserialize"])
        + H_DIM * O_DIM * (scalar_encode + unit["multiply_plain"] + unit["add"])
        + O_DIM * coefficient_cost({"inputs": 0, "plaintexts": 0, "products": 0, "outputs": 1}, unit)
    )
    print(
        f"  {H_DIM} input and {O_DIM} output ciphertexts of {B} of {slots} slots, "
        f"{H_DIM * O_DIM} scalar products: floor {fl * 1e3:.0f} ms "
        f"(measured: encryption {t_enc * 1e3:.0f} ms, products {t_mul * 1e3:.0f} ms)"
    )
    rep = H_DIM * math.ceil(B * math.ceil(O_DIM / 2) / slots)
    per_input = unit["encode"] + unit["encrypt"] + unit["serialize"] + unit["deserialize"]
    print(
        f"  full slots (H[b, k] in every slot (b, j) of ciphertext k): {rep} input ciphertexts "
        f"instead of 2, {rep * per_input * 1e3:.0f} ms to encrypt, send and load them alone; "
        "the weight product (h'^T Enc(g)) sums over slots: rotations"
    )

    print("\ncoefficient encoding (Cheetah / BOLT), cheapest power-of-two blocks")
    refusal = coefficient_plaintext_refusal(key)
    what = "supported by these bindings" if refusal is None else f"refused ({refusal})"
    print(f"  plaintexts from integer coefficients: {what}; each priced as one slot encoding")
    ntt = ntt_seconds(key, 20 * args.reps)
    # with a constructor that only runs the NTT, every encoding of the route (weights,
    # inputs, masks, smudging, flooding: all given by coefficients) would cost one NTT
    fast = dict(unit, encode=ntt)
    for label, prices in (
        ("each plaintext one slot encoding", unit),
        (f"each one NTT ({ntt * 1e3:.3f} ms)", fast),
    ):
        print(f"  priced with {label}:")
        total = 0.0
        for name, (n, d, m) in (
            ("forward   Enc(h') W", (B, H_DIM, O_DIM)),
            ("backward  Enc(g) W^T", (B, O_DIM, H_DIM)),
            ("weights   Enc(g)^T h'", (O_DIM, B, H_DIM)),
        ):
            s, blocks, c = best_coefficient(n, d, m, n_poly, prices)
            total += s
            cells = "  ".join(f"{k} {v}" for k, v in c.items())
            print(f"    {name:22s} floor {s * 1e3:6.0f} ms  blocks {blocks}  {cells}")
        print(f"    {'all three':22s} floor {total * 1e3:6.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
