"""Crypto exchange backends end to end, with real processes: each trains like
``plain`` within its precision, and the wire audit holds (the active party never
receives anything that is, or linearly reveals with the weights it holds, a
passive party's embedding; a passive party receives its embedding gradient and
protocol traffic only)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from securevfl.app.loader import load_protocol_dict
from securevfl.exchange.mpc.crypten.frames import CRYPTEN_TAG
from securevfl.exchange.paillier import PaillierOptions, exact
from securevfl.models import build_top
from tests.support.protocols import small_digits
from tests.support.runs import cli, run_doc

pytestmark = pytest.mark.timeout(600)

# (backend, params for a step-by-step comparison with plain, z tolerance after 8 steps);
# seeded starts are refused without insecure: true (A knows W_i^0), which a comparison is
SEEDED = {"weight_init": "seeded", "insecure": True}
CRYPTO = {
    "mpc": (SEEDED, 5e-4),  # 16-bit fixed point: ~1e-4 per step observed
    "ckks": (SEEDED, 1e-6),  # flooded CKKS decryptions (7.4e-8 each): ~5e-7 observed
    "paillier": (SEEDED, 1e-5),  # 48-bit fixed point: ~1e-6 observed
}


def _doc(backend: str, params: dict[str, Any]) -> dict[str, Any]:
    """8 training steps of batch 32 on small digits, then one evaluation. The
    bottoms and top use SGD: Adam divides by the root of the second moment, which
    turns any rounding difference in a near-zero gradient into a step of size lr,
    and would measure the optimizer instead of the exchange."""
    doc = small_digits(epochs=1, batch_size=32, max_steps=8, optimizer="sgd", lr=0.05)
    doc["exchange"] = {"backend": backend, "params": params}
    doc["runtime"] = {"trace_steps": 8, "dump_views": True}
    return doc


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("plain")
    result = run_doc(_doc("plain", {}), out)
    return result, torch.load(out / "ranks" / "rank0.trace.pt", weights_only=True), out


PROBE = Path(__file__).resolve().parents[1] / "support" / "dist_probe"


@pytest.fixture(scope="module", params=sorted(CRYPTO))
def crypto_run(request, tmp_path_factory: pytest.TempPathFactory):
    """One run per backend, its ranks started with the torch.distributed probe
    (tests/support/dist_probe) writing beside the run's folder (:func:`_probe_dir`)."""
    backend = request.param
    params, tol = CRYPTO[backend]
    out = tmp_path_factory.mktemp(backend)
    probe = _probe_dir(out)
    probe.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROBE), os.environ.get("PYTHONPATH")])))
        mp.setenv("SECUREVFL_DIST_PROBE", str(probe))
        # the probe is a sitecustomize: it needs every rank to be a fresh interpreter
        mp.setenv("SECUREVFL_START_METHOD", "spawn")
        result = run_doc(_doc(backend, params), out)
    return backend, tol, result, torch.load(out / "ranks" / "rank0.trace.pt", weights_only=True), out


def _probe_dir(out: Path) -> Path:
    return out.with_name(out.name + "-probe")


def test_tracks_plain_step_by_step(plain_trace, crypto_run):
    backend, tol, result, trace, _ = crypto_run
    _, plain, _ = plain_trace
    assert result["backend"] == backend
    assert len(trace) == len(plain) == 8
    for step, (a, b) in enumerate(zip(plain, trace, strict=True)):
        dz = float((a["z"] - b["z"]).abs().max())
        assert dz <= tol, (backend, step, dz)
        assert abs(float(a["loss"]) - float(b["loss"])) <= tol, (backend, step)


def _view(out: Path, rank: int) -> dict[str, Any]:
    return torch.load(out / "ranks" / f"rank{rank}.view.pt", weights_only=False)


# paillier's plaintext matrices are exact integers at this scale, sent as int64 limbs
PAILLIER_SCALE = PaillierOptions().shared_precision_bits + PaillierOptions().scalar_precision_bits


def _as_float(t: torch.Tensor) -> np.ndarray | None:
    """What a party can read off a received tensor as numbers: floats as they
    are, paillier's integers (int64 limbs, rows x cols x limbs) at their fixed-point
    scale, CrypTen ring elements decoded as 16-bit fixed point; bytes are opaque."""
    if t.dtype in (torch.float32, torch.float64):
        return t.double().numpy()
    if t.dtype == torch.int64 and t.dim() == 3:
        return exact.to_float(exact.from_limbs(t.numpy()), PAILLIER_SCALE)
    if t.dtype == torch.int64:
        return t.double().numpy() / 2**16
    return None


def linear_recovery(t: np.ndarray, h: np.ndarray, held: list[np.ndarray]) -> float:
    """Best R^2 of reading h off t, as-is or through a matrix the receiver holds
    (t, t @ M^T, t @ pinv(M)); 1.0 means h is revealed, <= 0 means no better
    than guessing h's mean."""
    if t.ndim != 2 or t.shape[0] != h.shape[0]:
        return -np.inf
    cands = (
        [t]
        + [t @ m.T for m in held if m.shape[0] == t.shape[1]]
        + [t @ np.linalg.pinv(m) for m in held if m.shape[1] == t.shape[1]]
    )
    var = float(((h - h.mean(0)) ** 2).sum())
    best = -np.inf
    for c in cands:
        if c.shape != h.shape or not np.isfinite(c).all():
            continue
        best = max(best, 1.0 - float(((c - h) ** 2).sum()) / var)
    return best


def _embeddings(out: Path, rank: int) -> dict[int, np.ndarray]:
    return {r: h.double().numpy() for r, h in _view(out, rank)["own"]["embeddings"]}


def test_audit_detects_plain_leak(plain_trace):
    """Sanity: on ``plain`` the audit sees A receive h'_i exactly."""
    _, _, out = plain_trace
    h1 = _embeddings(out, 1)
    got = [(r, t) for r, t in _view(out, 0)["received"]["embedding"] if r in h1]
    assert got and max(linear_recovery(_as_float(t), h1[r], []) for r, t in got) > 0.999


def test_active_never_reads_off_an_embedding(crypto_run):
    backend, _, _, _, out = crypto_run
    view = _view(out, 0)
    held = [v.double().numpy() for v in view["own"]["held_at_start"].values()]
    for p in (1, 2):
        h = _embeddings(out, p)
        first = min(h)
        worst = -np.inf
        examined = 0
        for msgs in view["received"].values():
            for r, t in msgs:
                if r != first:
                    continue
                arr = _as_float(t)
                if arr is None:
                    continue
                examined += arr.ndim == 2 and arr.shape[0] == h[first].shape[0]
                worst = max(worst, linear_recovery(arr, h[first], held))
        assert examined > 0, "the audit saw no batch-shaped tensor at the active party"
        assert worst < 0.5, (backend, p, worst)
    assert "embedding" not in view["received"]


def test_passive_receives_only_its_gradient_and_protocol_traffic(crypto_run):
    backend, _, _, _, out = crypto_run
    for p, other in ((1, 2), (2, 1)):
        view = _view(out, p)
        h_other = _embeddings(out, other)
        for msgs in view["received"].values():
            for r, t in msgs:
                arr = _as_float(t)
                if arr is not None and r in h_other:
                    assert linear_recovery(arr, h_other[r], []) < 0.5, (backend, p)
        assert "embedding" not in view["received"]


def test_mpc_three_passive_parties(tmp_path: Path):
    """breast_cancer over 3 passive parties + a label-only active party + dealer:
    truncation with more than two MPC parties uses the dealer's wraps protocol."""
    from tests.support.protocols import load_yaml

    doc = load_yaml("breast_cancer.yaml")
    doc["exchange"] = {"backend": "mpc"}
    doc["training"]["epochs"] = 3
    result = run_doc(doc, tmp_path)
    assert result["n_passive"] == 3 and result["world_size"] == 5
    assert len(set(result["party_pids"].values())) == 5
    assert result["test_auc"] >= 0.95, result["test_auc"]
    tags = {f["tag"] for f in result["ledger"]["flows"] if f["phase"] == "train"}
    assert "embedding" not in tags and "mpc.broadcast" in tags


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["plain", "mpc"])
def test_cuda_device(tmp_path: Path, backend: str):
    """The same run on CUDA and on the CPU: it trains (far above the 10% of chance)
    and lands where the CPU run does (2 epochs of small digits reach about 0.38)."""
    results = {}
    for device in ("cpu", "cuda"):
        doc = small_digits(epochs=2, device=device)
        doc["exchange"] = {"backend": backend}
        results[device] = run_doc(doc, tmp_path / device)
    assert results["cuda"]["device"] == "cuda"
    assert results["cuda"]["test_accuracy"] > 0.3
    assert abs(results["cuda"]["test_accuracy"] - results["cpu"]["test_accuracy"]) < 0.05


def test_he_public_material_only(crypto_run):
    """Under HE backends, every key message a party received loads as public-only
    material (the scheme refuses anything carrying a secret key), and the active
    party received exactly one such message per passive party."""
    from securevfl.exchange import EXCHANGES

    backend, _, result, _, out = crypto_run
    cls = EXCHANGES.get(backend)
    roles = cls.role_objects()
    if not hasattr(roles, "scheme"):
        pytest.skip("not a homomorphic backend")
    scheme = roles.scheme(cls.options.model_validate(result["backend_params"]))
    got = _view(out, 0)["received"]["he_public"]
    assert len(got) == 2
    for _, blob in got:
        scheme.peer(blob.numpy().tobytes(), sender="test")
    for p in (1, 2):
        ((_, blob),) = _view(out, p)["received"]["he_public"]
        scheme.peer(blob.numpy().tobytes(), sender="test")


# -- federated prediction through each crypto backend (docs/design.md §12) ------------------------
PREDICT_ROWS = 64  # two batches of 32: keep the crypto runs tiny


def _predict_test_rows(out: Path, dest: Path) -> tuple[Path, dict[str, Any]]:
    """``securevfl predict`` on the run in ``out`` with the passive parties' files
    cut to the run's first test rows (aligned order: sorted IDs), so the batches
    are the first ones of the run's evaluation; returns the output folder and the
    active party's training view."""
    view = _view(out, 0)["own"]
    test_ids = set(sorted(view["ids"][i] for i in view["test_idx"])[:PREDICT_ROWS])
    data = []
    for party in ("left", "right"):
        (src,) = (out / "data").glob(f"*/{party}.csv")
        frame = pd.read_csv(src, dtype={"id": str})
        frame[frame["id"].isin(test_ids)].to_csv(dest / f"{party}.csv", index=False)
        data.append(f"--data={party}={dest / f'{party}.csv'}")
    r = cli("predict", str(out), "--out", str(dest / "pred"), *data)
    assert r.returncode == 0, r.stderr[-3000:]
    return dest / "pred", view


def test_prediction_reveals_no_embedding_and_matches_the_evaluation(crypto_run, tmp_path: Path):
    """Under each crypto backend the active party receives no embedding while
    predicting (the wire audit above, on the prediction's transcript), and the
    scores equal the run's last evaluation of the same rows within the backend's
    precision (the z it was revealed then, through its final top model). Two
    batches: the audit reads every tensor, the comparison every row."""
    backend, tol, _, _, out = crypto_run
    pred_dir, view = _predict_test_rows(out, tmp_path)
    pview = torch.load(pred_dir / "ranks" / "rank0.predict_view.pt", weights_only=False)
    assert "embedding" not in pview["received"]
    held = [v.double().numpy() for v in view["held_at_start"].values()]
    for p in (1, 2):
        sent = torch.load(pred_dir / "ranks" / f"rank{p}.predict_view.pt", weights_only=False)
        h = {b: t.double().numpy() for b, t in sent["own"]["embeddings"]}
        assert len(h) == len(pview["own"]["z"]) > 1
        examined, worst = 0, -np.inf
        for msgs in pview["received"].values():
            for _, t in msgs:
                arr = _as_float(t)
                if arr is None or arr.ndim != 2:
                    continue
                for hb in h.values():  # any batch's embedding, read off any tensor of that size
                    if arr.shape[0] == hb.shape[0]:
                        examined += 1
                        worst = max(worst, linear_recovery(arr, hb, held))
        assert examined > 0, "the audit saw no batch-shaped tensor at the active party"
        assert worst < 0.5, (backend, p, worst)

    forwards = zip(view["forwards"], view["z"], strict=True)
    evals = [(f["round"], z) for f, z in forwards if f["phase"] == "eval"]
    last = [z for r, z in evals if r == max(r for r, _ in evals)][: len(pview["own"]["z"])]
    for a, b in zip(last, pview["own"]["z"], strict=True):
        assert float((a - b).abs().max()) <= tol, backend
    proto = load_protocol_dict(_doc(backend, CRYPTO[backend][0]))
    top = build_top(proto.top, proto.interactive.out, view["classes"], seed=0)
    top.load_state_dict(view["top"])
    with torch.no_grad():
        want = torch.softmax(top(torch.cat(last) + view["bias"]), dim=1).numpy()
    pred = pd.read_csv(pred_dir / "predictions.csv", dtype={"id": str})
    got = pred[[f"p_{c}" for c in range(view["classes"])]].to_numpy()
    assert len(got) == PREDICT_ROWS and np.abs(got - want).max() <= tol, backend


def test_no_gloo_collective_only_point_to_point_frames(crypto_run):
    """Every rank of the run (the dealer included) issued torch.distributed
    point-to-point calls only: no collective and no process sub-group, so under
    ``mpc`` CrypTen's openings, reveals, dealer traffic and seeds all travel as
    frames of securevfl's channel (CrypTen's under their own gloo tag)."""
    backend, _, result, _, out = crypto_run
    probe = _probe_dir(out)
    calls = [json.loads(p.read_text()) for p in probe.glob("*.p2p")]
    assert len(calls) == result["world_size"], "the probe did not run in every rank"
    collectives = {p.name: p.read_text() for p in probe.glob("*.collectives")}
    assert not collectives, collectives
    crypten_frames = sum(n for c in calls for k, n in c.items() if k.endswith(f":{CRYPTEN_TAG}"))
    assert (crypten_frames > 0) == (backend == "mpc"), (backend, calls)
