"""Operands of the HE exchanges stay within the scheme's bound by construction
(:mod:`securevfl.exchange.he.bounds`, :mod:`securevfl.exchange.he.protocol`).

The pure functions first (the clip keeps every row within the bound, the gradient
through it is the clipping's exact vector-Jacobian product, dL/dz is scaled by one
factor); then the real protocol (registered ``ckks`` and ``paillier`` backends, real
keys, one passive party; :mod:`tests.support.he_pair`) fed a hostile embedding
of rows up to 10^6 in norm and a dL/dz of rows near 10^3, whatever a bottom model
might produce: no guard fires, and the outputs are those of the clipped operands.
Last, with the clipping taken away the guard does fire, and what a peer hears of
it names the bound but no norm computed from the data.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from securevfl.errors import ConfigError, Diverged
from securevfl.exchange.he.bounds import MARGIN, clip_rows, clip_rows_grad, row_norms, scale_to_bound
from securevfl.exchange.paillier import PaillierOptions
from securevfl.exchange.paillier.backend import PaillierScheme
from securevfl.runtime.notes import error_note
from tests.support.he_pair import run_pair

BATCH, DIM, OUT = 32, 8, 8


# -- pure functions -------------------------------------------------------------------------


def _hostile(seed: int, big: float = 1e6) -> np.ndarray:
    """Rows of every scale from 1e-3 to ``big`` (some far above any bound), one zero row."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, DIM))
    x /= row_norms(x)[:, None]
    x *= np.logspace(-3, np.log10(big), BATCH)[:, None]
    x[3] = 0.0
    return x


@pytest.mark.parametrize("bound", [1.0, 256.0, 2.0**8 * MARGIN])
def test_clip_rows_bounds_every_row_and_keeps_the_rest(bound):
    x = _hostile(0)
    y, f = clip_rows(x, bound)
    norms = row_norms(x)
    assert (row_norms(y) <= bound).all()  # as the schemes' guards compute it
    inside = norms <= bound * MARGIN
    np.testing.assert_array_equal(y[inside], x[inside])
    np.testing.assert_array_equal(f[inside], 1.0)
    out = ~inside
    assert out.sum() >= 5
    cos = (y[out] * x[out]).sum(axis=1) / (row_norms(y[out]) * norms[out])
    np.testing.assert_allclose(cos, 1.0, rtol=1e-12)  # direction kept
    np.testing.assert_allclose(row_norms(y[out]), bound, rtol=1e-9)


def test_clip_rows_takes_any_scale():
    x = _hostile(1, big=1e300)
    y, _ = clip_rows(x, 256.0)
    assert np.isfinite(y).all() and (row_norms(y) <= 256.0).all()


def test_the_gradient_through_the_clip_is_autograd_s():
    """clip_rows_grad is the exact VJP: torch's autograd through the same function."""
    x = _hostile(2, big=1e3)
    g = np.random.default_rng(3).normal(size=x.shape)
    bound = 10.0
    _, f = clip_rows(x, bound)
    xt = torch.from_numpy(x).requires_grad_(True)
    n = xt.norm(dim=1, keepdim=True)
    factor = torch.where(n > bound * MARGIN, bound * MARGIN / n.clamp_min(1e-300), torch.ones_like(n))
    (xt * factor * torch.from_numpy(g)).sum().backward()
    assert xt.grad is not None
    np.testing.assert_allclose(clip_rows_grad(x, f, g), xt.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert (f < 1).sum() >= 10  # the comparison covers clipped rows


def test_scale_to_bound_bounds_rows_and_columns_with_one_factor():
    g = np.zeros((300, 4))
    g[:, 1] = 16.0  # rows of norm 16, column 1 of norm 277 > 256
    y = scale_to_bound(g, 256.0)
    assert row_norms(y).max() <= 256.0 and row_norms(y.T).max() <= 256.0
    np.testing.assert_allclose(y / g[:, 1:2].max(), g / g[:, 1:2].max() * (y[0, 1] / 16.0))
    small = np.random.default_rng(4).normal(size=(64, 16)) / 64
    assert scale_to_bound(small, 256.0) is small or np.array_equal(scale_to_bound(small, 256.0), small)


# -- the protocol: a hostile embedding is bounded before encryption ---------------------------------


def _ckks_options():
    pytest.importorskip("tenseal")
    from securevfl.exchange.ckks import CkksOptions

    return CkksOptions()


def _options(backend: str):
    return _ckks_options() if backend == "ckks" else PaillierOptions(threads=1)


#: the schemes' bound at their defaults: 2^value_norm_bits (ckks), 2^value_bits (paillier)
BOUND = 2.0**8

#: how closely z and dL/dh'_i match the clipped operands' products, relative to the
#: largest value: both come back as float32 (2^-24 relative), and the schemes' own
#: errors (ckks: flooding and smudging; paillier: fixed point at 2^-24 and 2^-20) are
#: smaller here; observed 2.7e-8 (z) and 5.4e-8 (dL/dh'_i) on both backends
RTOL = 1e-6


@pytest.mark.parametrize("backend", ["ckks", pytest.param("paillier", marks=pytest.mark.slow)])
def test_a_hostile_embedding_and_gradient_never_reach_the_guards(backend):
    hs = [_hostile(10 + t) for t in range(2)]
    rng = np.random.default_rng(5)
    gs = [rng.normal(size=(BATCH, OUT)) * 200.0 for _ in range(2)]  # rows near 10^3: a hostile dL/dz
    run = run_pair(backend, _options(backend), hs, gs)
    assert not run.errors, run.errors
    bound = BOUND
    # step 1 (W_1 != 0): z is the clipped rows times W, and dL/dh'_i flows back through the clip
    w = run.weights(1)
    y, f = clip_rows(hs[1], bound)
    z = y @ w
    assert np.abs(run.z[1] - z).max() <= RTOL * np.abs(z).max()
    grad = clip_rows_grad(hs[1], f, scale_to_bound(gs[1], bound) @ w.T)
    assert np.abs(run.grad[1] - grad).max() <= RTOL * np.abs(grad).max()
    assert (f < 1).sum() >= 10 and np.abs(z).max() > 0


def _unbounded(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Take the clipping away (the scheme declares no bound): only the guards remain."""
    if backend == "ckks":
        from securevfl.exchange.ckks.scheme import CkksScheme

        monkeypatch.setattr(CkksScheme, "value_bound", lambda self: None)
    else:
        monkeypatch.setattr(PaillierScheme, "value_bound", lambda self: None)


@pytest.mark.parametrize("backend", ["ckks", "paillier"])
def test_the_guard_tells_peers_the_bound_and_no_norm(monkeypatch, backend):
    """An embedding row of norm 123456.7 sent without clipping: P_i's guard refuses
    it before encrypting; its public error note (what every peer receives) names the
    bound and no norm, the owner's own note keeps the norm in its detail (ckks)."""
    _unbounded(monkeypatch, backend)
    h = np.full((BATCH, DIM), 0.5)
    h[7] *= 123456.7 / float(np.linalg.norm(h[7]))
    run = run_pair(backend, _options(backend), [h], [np.zeros((BATCH, OUT))])
    exc = run.errors.get("P")
    assert isinstance(exc, (Diverged, ConfigError)), run.errors
    public = error_note(1, exc).public().model_dump_json()
    for shown in ("123456", "1.235e+05", "1.23e+05", "row 7", "43648"):  # 43648.3: the entry itself
        assert shown not in public, public
    assert "2^8" in public
    if backend == "ckks":
        assert isinstance(exc, Diverged)
        own = error_note(1, exc)
        assert own.detail == "row 7 has l2 norm 1.235e+05"


@pytest.mark.parametrize("backend", ["ckks", "paillier"])
def test_a_non_finite_embedding_stops_its_owner_naming_it(backend):
    """A bottom model that diverged (NaN rows) stops P_i with Diverged before anything
    is encrypted, rather than as an internal error."""
    h = np.ones((BATCH, DIM))
    h[2, 1] = np.nan
    run = run_pair(backend, _options(backend), [h], [np.zeros((BATCH, OUT))])
    exc = run.errors.get("P")
    assert isinstance(exc, Diverged) and "the embedding h'_i holds NaN or infinite values" in str(exc)
