"""Ring-product microbenchmark: torch's int64 matmul against the float64 limb kernel
(securevfl.exchange.mpc.ringmatmul), min of N timings in one process, one thread.

Rows:
  * the reference step's products, (256 x 64) @ (64 x 64), (64 x 256) @ (256 x 64)
    and (256 x 64) @ (64 x 64)^T (a transposed operand, as dL/dz W^T);
  * one party's Beaver arithmetic for each of them, eps b + a delta + eps delta:
    before, three int64 products; now ``beaver_terms`` (one fused product) on
    each kernel;
  * the inner-dimension sweep at 64 x k x 64 across the chunk boundaries (1024,
    2048), with a four-limb variant (16-bit limbs, 10 float64 products, exact to
    2^21 terms; this script only) beside the three-limb chunked kernel.

Every result is checked bit for bit against int64 before it is timed.

Usage:  python benchmarks/ring_kernels.py [--repeats N] [--json PATH]
        benchmarks/cpu/avx2.sh python benchmarks/ring_kernels.py   (as on an AVX2-only CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from securevfl.exchange.mpc.ringmatmul import (  # noqa: E402
    beaver_terms,
    choose_kernel,
    limb_matmul_sum,
)


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def ring(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, shape, generator=g, dtype=torch.long)


def four_limbs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y mod 2^64 with balanced 16-bit limbs (the alternative to chunking): the
    digits laid out as the kernel lays out its three, [X_0 | .. | X_3] and
    [Y_3; ..; Y_0], four float64 products on slices (10 digit products)."""
    m, k = x.shape
    n = y.shape[1]
    xs = torch.empty((m, 4, k), dtype=torch.float64)
    ys = torch.empty((4, k, n), dtype=torch.float64)
    for t, put in ((x, lambda i, d: xs[:, i].copy_(d)), (y, lambda i, d: ys[3 - i].copy_(d))):
        r = t
        for i in range(3):
            d = (r << 48) >> 48
            put(i, d)
            r = (r - d) >> 16
        put(3, r)
    xf, yf = xs.view(m, 4 * k), ys.view(4 * k, n)
    z = torch.zeros((m, n), dtype=torch.long)
    for s in range(4):
        z += torch.matmul(xf[:, : (s + 1) * k], yf[(3 - s) * k :]).long() << (16 * s)
    return z


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = args.repeats
    rows: list[dict[str, Any]] = []

    def limbs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return limb_matmul_sum([(x, y)])

    print(
        f"ring products, {platform.machine()}, torch {torch.__version__}, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, kernel auto -> {choose_kernel()}; min of {n}, 1 thread"
    )
    print("| product | int64 | float64 (one product) | limbs | int64 / limbs |")
    print("|---|---:|---:|---:|---:|")
    refs = {
        "(256x64)@(64x64)": (ring((256, 64), g), ring((64, 64), g)),
        "(64x256)@(256x64)": (ring((64, 256), g), ring((256, 64), g)),
        "(256x64)@(64x64)^T": (ring((256, 64), g), ring((64, 64), g).t()),
    }
    for name, (x, y) in refs.items():
        assert torch.equal(limbs(x, y), x @ y)
        xd, yd = x.double(), y.double()
        r = {
            "product": name,
            "int64_ms": best_ms(lambda x=x, y=y: x @ y, n),
            "float64_ms": best_ms(lambda xd=xd, yd=yd: xd @ yd, n),
            "limbs_ms": best_ms(lambda x=x, y=y: limbs(x, y), n),
        }
        rows.append(r)
        print(
            f"| {name} | {r['int64_ms']:.3f} ms | {r['float64_ms']:.3f} ms | {r['limbs_ms']:.3f} ms "
            f"| {r['int64_ms'] / r['limbs_ms']:.1f}x |"
        )

    print("\none party's Beaver arithmetic (rank 0: eps b + a delta + eps delta)")
    print(
        "| product | before: 3 int64 products | beaver_terms, int64 | beaver_terms, limbs | before / limbs |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, (x, y) in refs.items():
        eps, a, delta, b = (
            ring(tuple(x.shape), g),
            ring(tuple(x.shape), g),
            y.clone(),
            ring(tuple(y.shape), g),
        )

        def old(eps: torch.Tensor = eps, a: torch.Tensor = a, d: torch.Tensor = delta, b: torch.Tensor = b):
            return eps.matmul(b) + a.matmul(d) + eps.matmul(d)

        want = old()
        timings = {}
        for k in ("int64", "limbs"):
            os.environ["SECUREVFL_RING_KERNEL"] = k
            assert torch.equal(beaver_terms(eps, delta, a, b, first=True), want)
            timings[k] = best_ms(lambda eps=eps, a=a, d=delta, b=b: beaver_terms(eps, d, a, b, first=True), n)
        os.environ.pop("SECUREVFL_RING_KERNEL")
        r = {
            "beaver": name,
            "before_ms": best_ms(old, n),
            "int64_ms": timings["int64"],
            "limbs_ms": timings["limbs"],
        }
        rows.append(r)
        print(
            f"| {name} | {r['before_ms']:.3f} ms | {r['int64_ms']:.3f} ms | {r['limbs_ms']:.3f} ms "
            f"| {r['before_ms'] / r['limbs_ms']:.1f}x |"
        )

    print("\ninner-dimension sweep, (64 x k) @ (k x 64)")
    print("| k | int64 | limbs (3 x 22 bits, chunks <= 1024) | 4 x 16-bit limbs |")
    print("|---:|---:|---:|---:|")
    for k in (64, 256, 1024, 1025, 2048, 2049, 4096):
        x, y = ring((64, k), g), ring((k, 64), g)
        want = x @ y
        assert torch.equal(limbs(x, y), want) and torch.equal(four_limbs(x, y), want)
        reps = n
        r = {
            "k": k,
            "int64_ms": best_ms(lambda x=x, y=y: x @ y, reps),
            "limbs_ms": best_ms(lambda x=x, y=y: limbs(x, y), reps),
            "four_limbs_ms": best_ms(lambda x=x, y=y: four_limbs(x, y), reps),
        }
        rows.append(r)
        print(f"| {k} | {r['int64_ms']:.3f} ms | {r['limbs_ms']:.3f} ms | {r['four_limbs_ms']:.3f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
