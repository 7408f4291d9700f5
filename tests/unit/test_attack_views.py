"""Attacks on hand-built views (test doubles of a run's views): row identity,
and each attack's direction on synthetic data where the answer is known."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from securevfl.attacks.base import View
from securevfl.attacks.code_reconstruction import class_codes, invert
from securevfl.attacks.feature_reconstruction import FeatureReconstruction, FeatureReconstructionOptions
from securevfl.attacks.label_inference import (
    LabelDirection,
    LabelDirectionOptions,
    LabelNorm,
    LabelNormOptions,
    ModelCompletion,
    ModelCompletionOptions,
)
from securevfl.attacks.membership import attack_features
from securevfl.attacks.views import per_row, received_per_forward
from securevfl.errors import ProtocolError
from securevfl.schedule import train_batches


@pytest.fixture(autouse=True)
def _one_thread():
    """The attacks' small models run single-threaded, as under the harness (a
    shared CPU makes multi-threaded tiny matmuls much slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_per_row_keeps_the_latest_training_tensor_and_the_final_eval():
    fw = [
        {"phase": "train", "round": 0, "rows": np.array([2, 0])},
        {"phase": "train", "round": 1, "rows": np.array([1, 2])},
        {"phase": "eval", "round": 0, "rows": np.array([0, 1])},
        {"phase": "eval", "round": 1, "rows": np.array([0, 1])},
    ]
    t = [torch.tensor([[20.0], [0.0]]), torch.tensor([[11.0], [21.0]]), torch.zeros(2, 1), torch.ones(2, 1)]
    table = per_row(fw, t, n_train=4, n_test=2)
    assert table.train[:, 0].tolist() == [0.0, 11.0, 21.0, 0.0]
    assert table.train_seen.tolist() == [True, True, True, False]
    assert table.test[:, 0].tolist() == [1.0, 1.0]
    with pytest.raises(ProtocolError):
        per_row(fw, t[:3], 4, 2)
    with pytest.raises(ProtocolError):
        per_row(fw[:1], [torch.zeros(3, 1)], 4, 2)


def _fw(*sizes: int) -> list[dict]:
    return [{"phase": "train", "round": 0, "rows": np.arange(n)} for n in sizes]


def test_received_per_forward_splits_interleaved_peers():
    rec = [(0, torch.full((1, 1), float(k))) for k in range(6)]  # 3 forwards x 2 peers
    assert [float(x) for x in received_per_forward(rec, _fw(1, 1, 1), 2, 1)] == [1.0, 3.0, 5.0]
    with pytest.raises(ProtocolError):
        received_per_forward(rec, _fw(1, 1, 1, 1), 2, 0)
    with pytest.raises(ProtocolError):
        received_per_forward(rec[:5], _fw(1, 1, 1), 2, 0)


def test_received_per_forward_splits_a_round_message_into_its_batches():
    # FedBCD rounds: one message per peer holds a round's batches (2 + 3 rows, then 1 row)
    peer0 = [torch.arange(5.0)[:, None], torch.tensor([[5.0]])]
    peer1 = [-t for t in peer0]
    rec = [(0, peer0[0]), (1, peer1[0]), (0, peer0[1]), (1, peer1[1])]
    out = received_per_forward(rec, _fw(2, 3, 1), 2, 1)
    assert [t.flatten().tolist() for t in out] == [[-0.0, -1.0], [-2.0, -3.0, -4.0], [-5.0]]


def _schedule(n_train: int, batch: int, epochs: int) -> list[np.ndarray]:
    return [b for e in range(epochs) for b in train_batches(n_train, batch, 0, e)]


def _active_view(x_train: torch.Tensor, x_test: torch.Tensor, emb) -> tuple[View, list]:
    batches = _schedule(len(x_train), 32, 2)
    fw = [{"phase": "train", "round": i, "rows": b} for i, b in enumerate(batches)]
    fw.append({"phase": "eval", "round": 1, "rows": np.arange(len(x_test))})
    tensors = [emb(x_train[b]) for b in batches] + [emb(x_test)]
    received = {"embedding": [(f["round"], t) for f, t in zip(fw, tensors, strict=True)]}
    own = {
        "train_idx": np.arange(len(x_train)),
        "test_idx": np.arange(len(x_test)),
        "forwards": fw,
        "z": tensors,
    }
    return View(0, "active", received, own), tensors


@pytest.mark.parametrize("leaky", [True, False])
def test_feature_reconstruction_decodes_an_invertible_embedding_and_not_noise(leaky: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 8, generator=g)
    w = torch.randn(8, 12, generator=g)
    emb = (lambda v: torch.tanh(v @ w)) if leaky else (lambda v: torch.randn(len(v), 12, generator=g))
    view, _ = _active_view(x[:300], x[300:], emb)
    aux = np.arange(0, 300, 5)
    view.prior = {
        "victim": "p",
        "victim_index": 0,
        "n_peers": 1,
        "aux_rows": aux,
        "aux_x": x[aux],
        "source": "embedding",
    }
    atk = FeatureReconstruction(FeatureReconstructionOptions(hidden=[64, 64]))
    guess = atk.run(view)
    from securevfl.attacks.metrics import normalized_mse

    nmse = normalized_mse(guess["recon"], x[300:].numpy(), guess["aux_mean"])["nmse"]
    if leaky:
        assert nmse < 0.35  # measured 0.212 (60 aux rows, tanh of a random 8->12 map)
        assert guess["used"]["answered_with"] == "decoder"
    else:
        assert nmse > 0.9  # the attacker falls back to (about) the mean


def _passive_view(y: np.ndarray, grad_of) -> View:
    batches = _schedule(len(y), 32, 3)
    fw = [{"phase": "train", "round": i, "rows": b} for i, b in enumerate(batches)]
    grads = [grad_of(b) for b in batches]
    return View(1, "p", {}, {"train_idx": np.arange(len(y)), "forwards": fw, "grads": grads})


def _label_world(y: np.ndarray, y_test: np.ndarray | None = None):
    class _W:  # the attributes the label attacks' scoring reads
        proto = SimpleNamespace(privacy=SimpleNamespace(delta=1e-5))  # the run's delta (record_test)
        active = View(
            0,
            "a",
            {},
            {
                "y_train": torch.as_tensor(y),
                "classes": 2,
                "y_test": torch.as_tensor(y if y_test is None else y_test),
            },
        )

    return _W()


def test_norm_and_direction_scoring_on_binary_softmax_gradients():
    """dL/dh for a linear head: (p - onehot(y)) W. Positives (rare) get larger
    norms; the two classes point in opposite directions."""
    rng = np.random.default_rng(0)
    y = (rng.random(300) < 0.2).astype(int)
    w = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))

    def grad_of(rows):
        p1 = torch.full((len(rows),), 0.2)  # the model predicts the base rate
        err = torch.stack([p1 - torch.as_tensor(1 - y[rows]), (1 - p1) - torch.as_tensor(1 - y[rows])], 1)
        err = torch.stack([-err[:, 1], err[:, 1]], 1)
        return err.float() @ w + 0.01 * torch.randn(len(rows), 8)

    view = _passive_view(y, grad_of)
    world = _label_world(y)
    norm = LabelNorm(LabelNormOptions())
    assert norm.score(norm.run(view), world)["auc"] > 0.95
    d = LabelDirection(LabelDirectionOptions(n_known=10))
    known = np.arange(0, 300, 30)
    view.prior = {"known_rows": known, "known_positive": y[known]}
    out = d.score(d.run(view), world)
    assert out["auc"] > 0.95
    # random gradients carry nothing
    noise = _passive_view(y, lambda rows: torch.randn(len(rows), 8))
    noise.prior = view.prior
    assert d.score(d.run(noise), world)["auc"] < 0.7
    assert norm.score(norm.run(noise), world)["auc"] < 0.7


def test_model_completion_uses_only_the_known_labels():
    rng = np.random.default_rng(0)
    y_tr, y_te = rng.integers(0, 2, 200), rng.integers(0, 2, 100)
    feats = lambda yy: torch.as_tensor(rng.normal(size=(len(yy), 4)) + 2.0 * yy[:, None], dtype=torch.float32)  # noqa: E731
    view = View(1, "p", {}, {"sent_train": feats(y_tr), "sent_test": feats(y_te)})
    known = np.arange(20)
    view.prior = {"known_rows": known, "known_labels": y_tr[known], "classes": 2}
    mc = ModelCompletion(ModelCompletionOptions(n_known=20))
    out = mc.score(mc.run(view), _label_world(y_tr, y_te))
    assert out["accuracy"] > 0.85 and out["auc"] > 0.9
    view.prior = {**view.prior, "known_labels": rng.integers(0, 2, 20)}  # wrong labels: no skill
    assert mc.score(mc.run(view), _label_world(y_tr, y_te))["accuracy"] < 0.75


def test_membership_features_and_class_codes():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    f = attack_features(p, np.array([0, 0]))
    assert f[0, :3].tolist() == [0.7, 0.2, 0.1] and f[1, 3] == pytest.approx(0.1)
    assert f[1, 4] == pytest.approx(-np.log(0.1))
    codes = torch.tensor([[1.0, -1.0], [1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    out = class_codes(codes, torch.tensor([0, 0, 0, 1]), 3, binary=True)
    assert out.tolist() == [[1.0, -1.0], [-1.0, -1.0], [0.0, 0.0]]


def test_invert_recovers_the_input_of_an_invertible_map():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    target_x = torch.rand(1, 2, 2)
    with torch.no_grad():
        target = lin(target_x.reshape(1, -1))
    x = invert(lin, target, (2, 2), 0.5, iterations=800, lr=0.05, tv=0.0)
    assert torch.allclose(x, target_x, atol=0.05)


def test_result_keys_label_or_name_and_index_for_repeats():
    from securevfl.app.harness import attack_keys
    from securevfl.app.loader import load_checked_dict
    from tests.support.protocols import small_digits

    doc = small_digits()
    doc["attacks"] = [
        {"name": "label_norm"},
        {"name": "label_norm", "params": {"label": "norm_left"}},
        {"name": "membership_inference"},
        {"name": "membership_inference", "params": {"seed": 1}},
    ]
    keys = attack_keys(load_checked_dict(doc).components)
    assert keys == ["label_norm", "norm_left", "membership_inference#2", "membership_inference#3"]
