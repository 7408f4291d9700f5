"""benchmarks/ckks_routes.py: the block counts of coefficient encoding (pure arithmetic)
and the bindings' refusal that docs/crypto-performance.md §3.1 rests on."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _routes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ckks_routes", ROOT / "benchmarks" / "ckks_routes.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_coefficient_counts_at_the_reference_point():
    r = _routes()
    # (256 x 64)(64 x 64) in blocks 256 x 4 (encrypted) and 4 x 8 (plain): 16 inner blocks, 8 column blocks
    assert r.coefficient_counts(256, 64, 64, 256, 4, 8) == {
        "inputs": 16,
        "plaintexts": 128,
        "products": 128,
        "outputs": 8,
    }
    # a ragged split rounds up
    assert r.coefficient_counts(10, 3, 5, 4, 2, 4) == {
        "inputs": 6,
        "plaintexts": 4,
        "products": 12,
        "outputs": 6,
    }


@pytest.mark.parametrize("blocks", [(256, 4, 8), (128, 8, 8), (64, 16, 8), (256, 1, 32), (32, 16, 16)])
def test_coefficient_counts_trade_ciphertexts_for_plaintexts(blocks):
    """With full blocks the products are n d m / (n_w d_w m_w) and products^2 =
    inputs x outputs x plaintexts: fewer plaintexts cost more ciphertexts."""
    r = _routes()
    c = r.coefficient_counts(256, 64, 64, *blocks)
    assert c["products"] == 256 * 64 * 64 // math.prod(blocks)
    assert c["products"] ** 2 == c["inputs"] * c["outputs"] * c["plaintexts"]


def test_best_coefficient_blocks_fit_the_ring():
    r = _routes()
    unit = {
        "encode": 1.0,
        "encrypt": 2.0,
        "encrypt_public": 5.0,
        "decrypt": 1.5,
        "multiply_plain": 0.1,
        "add": 0.03,
        "rescale": 0.5,
        "serialize": 0.5,
        "deserialize": 0.5,
    }
    seconds, blocks, counts = r.best_coefficient(256, 64, 64, 8192, unit)
    assert math.prod(blocks) <= 8192
    assert counts == r.coefficient_counts(256, 64, 64, *blocks)
    assert seconds == pytest.approx(r.coefficient_cost(counts, unit))
    # no power-of-two block that fits is cheaper
    for nw in r.pow2_upto(256):
        for dw in r.pow2_upto(64):
            for mw in r.pow2_upto(64):
                if nw * dw * mw <= 8192:
                    assert r.coefficient_cost(r.coefficient_counts(256, 64, 64, nw, dw, mw), unit) >= seconds


def test_the_bindings_refuse_a_plaintext_given_by_coefficients():
    """SEAL (through TenSEAL) will not move a CKKS plaintext given by integer coefficients
    to NTT form, so coefficient encoding pays a slot encoding per plaintext; when a
    TenSEAL release allows it, this fails and §3.1's pricing is out of date."""
    pytest.importorskip("tenseal")
    from securevfl.exchange.ckks import CkksOptions
    from securevfl.exchange.ckks.key import CkksKey

    r = _routes()
    refusal = r.coefficient_plaintext_refusal(CkksKey(CkksOptions()))
    assert refusal is not None and "not valid" in refusal
