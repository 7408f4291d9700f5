"""Count and cost one training step of the ``paillier`` exchange, in one process.

docs/crypto-performance.md §7: next to a backend's measured step, print the count
of its primitive operations and their unit costs measured on the same machine;
the product is the protocol's floor there, and measured / floor shows how much
is overhead rather than cryptography. :func:`step_counts` replays the scheme
calls of one step of :mod:`securevfl.exchange.he.protocol` (every passive party: P_i
encrypts h'_i, A multiplies, P_i decrypts; A encrypts dL/dz once, P_i multiplies
twice, A decrypts twice) under :func:`~.counters.counting`; :func:`unit_costs`
times each primitive on its own. Both use fresh keys and random data of the
step's shapes; no party data is involved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import securevfl.exchange.paillier.exact as exact
from securevfl.csprng import SecretStream
from securevfl.exchange.he.scheme import MATMUL
from securevfl.exchange.paillier.arith import PaillierArith
from securevfl.exchange.paillier.backend import PaillierScheme
from securevfl.exchange.paillier.counters import OpCounts, counting
from securevfl.exchange.paillier.kernels import multiexp
from securevfl.exchange.paillier.options import PaillierOptions, Params

#: the primitives whose unit costs make the floor (each includes its own modular multiplications)
FLOOR_OPS = ("encryptions", "decryptions", "obfuscations", "ct_scalar")


@dataclass(frozen=True)
class StepProfile:
    counts: OpCounts
    unit_s: dict[str, float]
    replay_s: float

    def floor_s(self) -> float:
        """sum over FLOOR_OPS of count x unit cost: one core's cryptographic work per step."""
        c = self.counts.as_dict()
        return sum(c[op] * self.unit_s[op] for op in FLOOR_OPS)


def _weights(stream: SecretStream, d: int, o: int, prm: Params) -> np.ndarray:
    """A weight share as the protocol multiplies it: uniform below 2^share at 2^-fw."""
    return exact.uniform(stream, (d, o), prm.share + prm.fw + 1)


def step_counts(
    options: PaillierOptions,
    batch: int,
    dims: list[int],
    out: int,
    *,
    cpu: list[float] | None = None,
    rows_products: list[int] | None = None,
) -> tuple[OpCounts, float]:
    """Operation counts of one step (all parties together) and the replay's wall
    seconds (its CPU seconds are appended to ``cpu`` if given; the ct x scalar
    products of the ``tmatmul``s, whose scalars are embeddings rather than weight
    shares, to ``rows_products``). The weight shares used as scalars are drawn at
    their re-drawn size (P_i's below 2^share_bits, A's W_i minus it), which sets
    the exponent lengths."""
    prm = Params.of(options, batch, dims, out)
    sch = PaillierScheme(options, prm)
    ar = PaillierArith(sch, prm)
    share_bits = prm.share
    rng = np.random.default_rng(0)  # profile inputs (public, reproducible)
    masks = SecretStream.from_seed(0, "paillier-profile")  # masks and shares as the exchange draws them
    ka = sch.new_key()
    keys = [sch.new_key() for _ in dims]
    at_a = [sch.peer(k.public(), sender=f"P{i + 1}") for i, k in enumerate(keys)]
    at_p = [sch.peer(ka.public(), sender="A") for _ in dims]
    parties: list[Any] = [ka, *keys, *at_a, *at_p]
    for party in parties:
        party.prepare()  # set-up is once per run, not per step
    g = rng.normal(0.0, 1e-3, size=(batch, out))
    t0, c0 = time.perf_counter(), time.process_time()
    tm_products = 0
    with counting() as c:
        for i, d in enumerate(dims):
            h = rng.normal(0.0, 0.5, size=(batch, d))
            blob = keys[i].encrypt_shared(h, ops=frozenset({MATMUL}), share_bits=share_bits + 1)
            eps = ar.mask(masks, (batch, out), terms=d, share=True)
            z = at_a[i].matmul(blob, (batch, d), _weights(masks, d, out, prm), eps)
            keys[i].decrypt_exact(z, (batch, out), prm.Fs)
        blob_g = ka.encrypt_shared(g, share_bits=share_bits)
        for i, d in enumerate(dims):
            h = rng.normal(0.0, 0.5, size=(batch, d))
            wp = _weights(masks, d, out, prm)
            mu = ar.mask(masks, (batch, d), terms=out, share=True)
            u = at_p[i].matmul(blob_g, (batch, out), wp.T, mu)
            r_mask = ar.mask(masks, (d, out), terms=batch, share=False)
            with counting() as tm:
                dw = at_p[i].tmatmul(h, blob_g, (batch, out), -r_mask)
            tm_products += tm.ct_scalar
            ka.decrypt_exact(u, (batch, d), prm.Fs)
            ka.decrypt_exact(dw, (d, out), prm.Fs)
    if cpu is not None:
        cpu.append(time.process_time() - c0)
    if rows_products is not None:
        rows_products.append(tm_products)
    return c, time.perf_counter() - t0


def bytes_floor(options: PaillierOptions, batch: int, dims: list[int], out: int) -> float:
    """Bytes per step the protocol must move (package docstring, "Costs and floors"):
    per passive party the encrypted h'_i (B x d), h'_i W^A + eps (B x o), dL/dz
    (B x o, once although it is sent in two packings), g W^P^T + mu (B x d) and
    h'^T g - R (d x o), each value at 2|n|/8 / L bytes with L the slots of its
    blob in :meth:`PaillierKey.encrypt_shared`'s packing, plus the plaintext
    integers z share (B x o), dL/dh masked (B x d), each at its slot's width in
    bytes, and the re-draw (d x o) at the width of the re-drawn share."""
    prm = Params.of(options, batch, dims, out)
    nbits = options.key_bits
    ct = 2 * nbits / 8

    def slot(cols: bool, terms: int, op_bits: int) -> int:
        return prm.protocol_slot(cols, terms, op_bits, nbits)

    def per_value(cols: bool, terms: int, op_bits: int) -> float:
        return ct / ((nbits - 1) // slot(cols, terms, op_bits))

    share_bytes = (prm.share + prm.Fs + 2) / 8
    total = 0.0
    for d in dims:
        h_blob = per_value(True, d, prm.share + 1)  # Enc(h'_i), and A's reply in its packing
        g_cols = per_value(True, out, prm.share)  # Enc(dL/dz) for g W^P^T, and the reply
        g_rows = per_value(False, batch, prm.v)  # Enc(dL/dz) for h'^T g, and the reply
        total += batch * d * h_blob + batch * out * h_blob
        total += batch * out * g_cols + batch * d * g_cols + d * out * g_rows
        total += batch * out * slot(True, d, prm.share + 1) / 8 + batch * d * slot(True, out, prm.share) / 8
        total += d * out * share_bytes
    return total


def unit_costs(
    options: PaillierOptions, *, reps: int = 32, share_bits: int | None = None, batch: int = 256
) -> dict[str, float]:
    """CPU seconds per primitive, single thread (CPU time, so that other jobs on the
    machine do not inflate them): encryption (with its obfuscator), decryption,
    evaluator obfuscator, and ciphertext x scalar product (with its addition) in a
    64 x 64 multi-exponentiation with scalars of share_bits + fw bits (default: the
    re-drawn share's size, :attr:`Params.share`), the ``matmul`` products. Also
    ``ct_scalar_rows``: the same in a ``batch`` x 64 multi-exponentiation with the
    scalars of a ``tmatmul``, embeddings of the replay's size (|h| < 2) at fw bits,
    which are shorter and share tables over 4x the bases."""
    one = options.model_copy(update={"threads": 1, "precompute": False})
    prm = Params.of(one, batch)
    if share_bits is None:
        share_bits = prm.share
    sch = PaillierScheme(one, prm)
    key = sch.new_key()
    peer = sch.peer(key.public(), sender="profile")
    key.prepare()
    peer.prepare()
    ms = [int(v) for v in np.random.default_rng(1).integers(0, 2**62, size=reps)]

    def timed(f: object) -> float:
        t0 = time.process_time()
        f()  # type: ignore[operator]
        return time.process_time() - t0

    cts = key.encrypt_ints(ms)
    out = {
        "encryptions": timed(lambda: key.encrypt_ints(ms)) / reps,
        "decryptions": timed(lambda: key.decrypt_ints(cts)) / reps,
        "obfuscations": timed(lambda: peer.obfuscators(reps)) / reps,
    }
    k = 64
    bases = key.encrypt_ints(list(range(1, k + 1)))
    e = exact.uniform(SecretStream.from_seed(2, "paillier-profile"), (k, k), share_bits + prm.fw + 1)
    with counting() as c:
        t = timed(lambda: multiexp(bases, e, key.n2))
    out["ct_scalar"] = t / max(1, c.ct_scalar)
    rows_bases = key.encrypt_ints(list(range(1, batch + 1)))
    h = np.random.default_rng(3).normal(0.0, 0.5, size=(batch, k)).clip(-1.99, 1.99)
    e_rows = np.rint(np.ldexp(h, one.scalar_precision_bits)).astype(np.int64)
    with counting() as c:
        t = timed(lambda: multiexp(rows_bases, e_rows, key.n2))
    out["ct_scalar_rows"] = t / max(1, c.ct_scalar)
    return out


def profile_step(options: PaillierOptions, batch: int, dims: list[int], out: int) -> StepProfile:
    """Counts and unit costs of one step. ``unit_s["ct_scalar"]`` is the mean over the
    step's products, weighted by how many are ``matmul`` products (99-bit scalars at
    the defaults) and how many ``tmatmul`` products (~21-bit scalars): a single
    64 x 64 figure would overstate the latter several times."""
    rows: list[int] = []
    counts, replay = step_counts(options, batch, dims, out, rows_products=rows)
    unit = unit_costs(options, batch=batch)
    total = max(1, counts.ct_scalar)
    unit["ct_scalar_share"] = unit["ct_scalar"]
    mixed = (total - rows[0]) * unit["ct_scalar_share"] + rows[0] * unit["ct_scalar_rows"]
    unit["ct_scalar"] = mixed / total
    return StepProfile(counts, unit, replay)
