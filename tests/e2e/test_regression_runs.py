"""Regression end to end: scikit-learn's diabetes split over two passive parties
(protocols/diabetes_regression.yaml) reaches the R^2 of a centralized model with
the same architecture on ``plain``, and trains on every crypto backend to the
plain model's quality. Real processes, the real launcher."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from securevfl.app.loader import load_protocol_dict
from securevfl.data.partition import party_source
from securevfl.data.party_data import load_party_data, split_indices, standardize
from securevfl.models import interactive_optimizer, make_optimizer
from securevfl.parties.tasks import regression_metrics
from securevfl.schedule import eval_batches, train_batches
from securevfl.seeding import generator
from tests.support.protocols import load_yaml
from tests.support.reference import ReferenceSplit
from tests.support.runs import run_doc

pytestmark = pytest.mark.timeout(900)


def diabetes(backend: str = "plain", epochs: int | None = None) -> dict[str, Any]:
    doc = load_yaml("diabetes_regression.yaml")
    # crypto backends draw W_i privately by default, and every party its bottom model;
    # seeded (insecure), they start where plain and the central reference do
    doc["exchange"] = {
        "backend": backend,
        "params": {} if backend == "plain" else {"weight_init": "seeded", "insecure": True},
    }
    for p in doc["parties"]["passive"]:
        p["model"]["init"] = "seeded"
    if epochs is not None:
        doc["training"]["epochs"] = epochs
    return doc


def central_r2(proto, data_dir: Path) -> float:
    """The same split architecture trained in one process on the same rows, batches
    and initial weights, with MSE on the target standardized as the active party
    does; its R^2 on the test rows."""
    act = load_party_data(
        party_source(proto, "active", data_dir), "active", is_active=True, task="regression"
    )
    xs = [
        load_party_data(party_source(proto, p.name, data_dir), p.name, is_active=False).x
        for p in proto.parties.passive
    ]
    tr = proto.training
    n = len(act.ids)
    train_idx, test_idx = split_indices(n, proto.dataset.test_fraction, generator(tr.seed, "split"))
    scaled = [standardize(x[train_idx], x[test_idx]) for x in xs]
    x_train = [torch.as_tensor(a) for a, _ in scaled]
    x_test = [torch.as_tensor(b) for _, b in scaled]
    assert act.y is not None
    y_train, y_test = act.y[train_idx].astype(np.float64), act.y[test_idx].astype(np.float64)
    mu, sd = y_train.mean(), y_train.std()
    target = torch.as_tensor(((y_train - mu) / sd).astype(np.float32))
    ref = ReferenceSplit(proto, x_train, 1)
    opt = make_optimizer([q for m in [*ref.bottoms, ref.top] for q in m.parameters()] + [ref.bias], tr)
    opt_w = interactive_optimizer([b.weight for b in ref.blocks], proto.interactive)
    for epoch in range(tr.epochs):
        for idx in train_batches(len(train_idx), tr.batch_size, tr.seed, epoch):
            out = ref.logits([b(x[idx]) for b, x in zip(ref.bottoms, x_train, strict=True)])
            loss = F.mse_loss(out.squeeze(1), target[idx])
            opt.zero_grad()
            opt_w.zero_grad()
            loss.backward()
            opt.step()
            opt_w.step()
    with torch.no_grad():
        preds = []
        for idx in eval_batches(len(test_idx), tr.batch_size):
            out = ref.logits([b(x[idx]) for b, x in zip(ref.bottoms, x_test, strict=True)])
            preds.append(out.squeeze(1).double().numpy() * sd + mu)
    return regression_metrics(np.concatenate(preds), y_test)["test_r2"]


@pytest.fixture(scope="module")
def plain_short(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_doc(diabetes(epochs=3), tmp_path_factory.mktemp("plain3"))


def test_diabetes_plain_reaches_the_central_r2(tmp_path: Path):
    doc = diabetes()
    result = run_doc(doc, tmp_path)
    assert result["task"] == "regression" and result["test_accuracy"] is None
    assert {"test_rmse", "test_mae", "test_r2"} <= set(result["history"][-1])
    central = central_r2(load_protocol_dict(copy.deepcopy(doc)), tmp_path / "data")
    assert result["test_r2"] > 0.4, result["test_r2"]
    assert abs(result["test_r2"] - central) <= 0.05, (result["test_r2"], central)


@pytest.mark.parametrize(
    "backend",
    ["mpc", pytest.param("ckks", marks=pytest.mark.slow), pytest.param("paillier", marks=pytest.mark.slow)],
)
def test_regression_trains_on_crypto_backends(plain_short, tmp_path: Path, backend: str):
    result = run_doc(diabetes(backend, epochs=3), tmp_path)
    assert result["backend"] == backend and result["task"] == "regression"
    assert result["train_steps"] == plain_short["train_steps"]
    # the same model within the backend's precision: R^2 and RMSE close to plain's
    assert abs(result["test_r2"] - plain_short["test_r2"]) <= 0.05, (
        result["test_r2"],
        plain_short["test_r2"],
    )
    assert result["test_rmse"] == pytest.approx(plain_short["test_rmse"], rel=0.05)
