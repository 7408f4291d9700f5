"""DRAVL and the embedding-noise baseline end to end, through the real launcher
(docs/methods/dravl.md §9.4): nothing new crosses the wire, zero weights are vanilla bit for
bit, the first embedding A receives is the vanilla one, and the passive-side
losses run unchanged under the mpc and ckks backends (each tracks the plain run
step by step within that backend's precision)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.protocols import SHORT_STEPS, short_sgd_digits
from tests.support.runs import own_reports, run_doc

pytestmark = pytest.mark.timeout(600)

STEPS = SHORT_STEPS
DEFENDED = {
    "left": [
        {"name": "dravl", "params": {"alpha_r": 0.1, "alpha_n": 0.1, "alpha_d": 0.1, "ar_inner_steps": 2}}
    ],
    "right": [{"name": "gaussian_noise", "params": {"std": 0.5}}],
}
ZERO = {
    "left": [{"name": "dravl", "params": {"alpha_r": 0.0, "alpha_n": 0.0, "alpha_d": 0.0}}],
    "right": [{"name": "gaussian_noise", "params": {"std": 0.0}}],
}
# (params, z tolerance after STEPS steps), as in tests/e2e/test_backends.py
CRYPTO = {
    "mpc": ({"weight_init": "seeded", "insecure": True}, 5e-4),
    "ckks": ({"weight_init": "seeded", "insecure": True}, 1e-6),
}


def _doc(backend: str = "plain", params: dict[str, Any] | None = None, defenses=None) -> dict[str, Any]:
    """STEPS training steps of batch 32 on small digits with SGD (as the backend
    tests do: Adam would turn rounding differences into full steps), the same run
    as the shared undefended one (tests/conftest.py) but for the defenses."""
    doc = short_sgd_digits(STEPS)
    doc["exchange"] = {"backend": backend, "params": params or {}}
    # the runs compared here must draw the same Gaussian noise: pin the private noise seed
    doc["privacy"] = {"noise_seed": 0}
    for p in doc["parties"]["passive"]:
        p["defenses"] = (defenses or {}).get(p["name"], [])
    return doc


def _run(tmp: pytest.TempPathFactory, name: str, doc: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    out = tmp.mktemp(name)
    return run_doc(doc, out), out


@pytest.fixture(scope="module")
def vanilla(undefended_short_run):
    """``_doc()`` without defenses: the session's shared undefended run."""
    return undefended_short_run


@pytest.fixture(scope="module")
def defended(tmp_path_factory):
    return _run(tmp_path_factory, "defended", _doc(defenses=DEFENDED))


def _trace(out: Path) -> list[dict[str, torch.Tensor]]:
    return torch.load(out / "ranks" / "rank0.trace.pt", weights_only=True)


def _ledger(out: Path, rank: int) -> list[tuple]:
    """Every message a rank sent or received, without timing: direction, phase,
    round, peers, tag, shape, dtype, bytes."""
    rows = []
    for line in (out / "ranks" / f"rank{rank}.ledger.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.append((r["direction"], r["phase"], r["round"], r["sender"], r["receiver"], r["tag"]))
        rows[-1] += (tuple(r["shape"]), r["dtype"], r["bytes"])
    return rows


def _untimed(summary: Any) -> Any:
    """A ledger summary without its CPU timings (the secure channel's seal and
    open seconds differ between any two runs); messages, frames and bytes stay."""
    if isinstance(summary, dict):
        return {k: _untimed(v) for k, v in summary.items() if "cpu_s" not in k}
    return summary


def _view(out: Path, rank: int) -> dict[str, Any]:
    return torch.load(out / "ranks" / f"rank{rank}.view.pt", weights_only=False)


def test_nothing_new_crosses_the_wire(vanilla, defended):
    (r0, v_out), (r1, d_out) = vanilla, defended
    for rank in range(r0["world_size"]):
        assert _ledger(d_out, rank) == _ledger(v_out, rank), rank
    assert _untimed(r1["ledger"]) == _untimed(r0["ledger"])
    # per training step: one (32, 16) embedding up and one (32, 16) gradient down
    # per passive party; X (32 columns), noise and reconstructions never appear
    train = [r for r in _ledger(d_out, 0) if r[1] == "train" and r[0] == "recv"]
    assert len(train) == 2 * STEPS
    assert {(r[5], r[6]) for r in train} == {("embedding", (32, 16))}
    sent = [r for r in _ledger(d_out, 0) if r[1] == "train" and r[0] == "sent"]
    assert len(sent) == 2 * STEPS and {r[6] for r in sent} == {(32, 16)}
    for msgs in _view(d_out, 0)["received"].values():
        for _, t in msgs:
            assert t.shape[-1] != 32, t.shape


def test_defenses_ran_and_reported(defended):
    result, out = defended
    assert list(result["defense_report"]["left"]["dravl"]) == ["params"]  # declared: the options alone
    rep = own_reports(out)  # the statistics: each party's own file, not result.json
    left, right = rep["left"]["dravl"], rep["right"]["gaussian_noise"]
    assert left["steps"] == STEPS and left["collapsed_batches"] == 0
    for key in ("ar_loss", "nr_loss", "train_dcor"):
        assert left[key] == left[key] and left[key] > 0, key  # finite, not NaN
    assert left["eval"]["eval_rows"] == right["eval"]["eval_rows"] > 300  # digits: 20 % of 1797 rows
    assert 0 < left["eval"]["sent"]["v_dcor"] <= 1
    # the baseline's noise lowers the dependence A can see, against its clean embedding
    assert right["eval"]["sent"]["v_dcor"] < right["eval"]["clean"]["v_dcor"]


def test_active_party_sees_the_vanilla_first_embedding(vanilla, defended):
    """Step 0: the defended party (dravl, left) sends exactly the vanilla
    embedding; the defense only changes its own later updates."""
    (_, v_out), (_, d_out) = vanilla, defended
    v = dict(_view(v_out, 1)["own"]["embeddings"])
    d = dict(_view(d_out, 1)["own"]["embeddings"])
    assert torch.equal(v[0], d[0])
    assert not torch.equal(v[STEPS - 1], d[STEPS - 1])


def test_zero_weights_are_vanilla_bit_for_bit(vanilla, tmp_path_factory):
    (r0, v_out) = vanilla
    r1, z_out = _run(tmp_path_factory, "zero", _doc(defenses=ZERO))
    for a, b in zip(_trace(v_out), _trace(z_out), strict=True):
        assert torch.equal(a["z"], b["z"]) and torch.equal(a["loss"], b["loss"])
    for rank in (1, 2):
        sa = torch.load(v_out / "ranks" / f"rank{rank}.state.pt", weights_only=True)
        sb = torch.load(z_out / "ranks" / f"rank{rank}.state.pt", weights_only=True)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert r1["test_accuracy"] == r0["test_accuracy"]


@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=pytest.mark.slow) if b == "ckks" else b for b in sorted(CRYPTO)]
)  # mpc in the default suite, ckks in the slow one
def test_runs_under_crypto_backends_like_plain(backend, defended, tmp_path_factory):
    params, tol = CRYPTO[backend]
    _, p_out = defended
    result, out = _run(tmp_path_factory, backend, _doc(backend, params, DEFENDED))
    assert result["backend"] == backend
    assert own_reports(out)["left"]["dravl"]["steps"] == STEPS
    plain, crypto = _trace(p_out), _trace(out)
    assert len(plain) == len(crypto) == STEPS
    for step, (a, b) in enumerate(zip(plain, crypto, strict=True)):
        dz = float((a["z"] - b["z"]).abs().max())
        assert dz <= tol, (backend, step, dz)
    tags = {f["tag"] for f in result["ledger"]["flows"] if f["phase"] == "train"}
    assert "embedding" not in tags
