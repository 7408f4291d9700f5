"""End-to-end plaintext split training with real processes: accuracy targets,
one process per party, data isolation, ledger accounting, and equivalence with
centralized training."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from securevfl.app.loader import load_checked, load_protocol, load_protocol_dict
from securevfl.data.partition import ID_COLUMN, LABEL_COLUMN, dataset_key
from tests.support.protocols import PROTOCOLS, small_digits
from tests.support.reference import ReferenceSplit, split_state, training_rows
from tests.support.runs import run_doc

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory):
    """protocols/plain.yaml as shipped, with every rank auditing the files it opens."""
    from securevfl.app.launcher import launch

    out = tmp_path_factory.mktemp("plain")
    mp = pytest.MonkeyPatch()
    mp.setenv("SECUREVFL_AUDIT_OPENS", "1")
    try:
        result = launch(load_checked(PROTOCOLS / "plain.yaml"), out, progress=False)
    finally:
        mp.undo()
    return out, result


def _summary(out: Path, rank: int) -> dict:
    return json.loads((out / "ranks" / f"rank{rank}.summary.json").read_text())


def test_plain_digits_accuracy_and_processes(plain_run):
    _out, result = plain_run
    assert result["test_accuracy"] >= 0.93, result["test_accuracy"]
    assert result["test_auc"] is None  # 10 classes
    pids = result["party_pids"]
    assert set(pids) == {"0", "1", "2"}
    assert len(set(pids.values())) == 3
    import os

    assert os.getpid() not in pids.values()
    for key in (
        "protocol",
        "backend",
        "dataset",
        "n_parties",
        "epochs",
        "time_per_step_s",
        "bytes_per_step",
        "ledger",
    ):
        assert key in result
    assert (result["backend"], result["dataset"], result["n_parties"]) == ("plain", "digits", 3)


def test_active_never_loads_features_passive_never_loads_labels(plain_run):
    out, _ = plain_run
    folder = out / "data" / dataset_key(load_protocol(PROTOCOLS / "plain.yaml"))
    own_file = {0: folder / "active.csv", 1: folder / "left.csv", 2: folder / "right.csv"}
    for rank, path in own_file.items():
        s = _summary(out, rank)
        opened = [p for p in s["opened_files"] if p.endswith((".csv", ".gz", ".npz", ".npy"))]
        # each rank opened exactly its own data file and no dataset file of sklearn
        assert opened == [str(path.resolve())], (rank, opened)
        header = list(pd.read_csv(path, nrows=0).columns)
        if rank == 0:
            assert header == [ID_COLUMN, LABEL_COLUMN]
            assert s["loaded_columns"] == [] and s["has_labels"] is True
        else:
            assert LABEL_COLUMN not in header
            assert s["has_labels"] is False
            assert len(s["loaded_columns"]) == 32
            assert all(c.startswith("px_") for c in s["loaded_columns"])
    left, right = _summary(out, 1)["loaded_columns"], _summary(out, 2)["loaded_columns"]
    assert not set(left) & set(right)


def test_ledger_bytes_per_step_equal_embeddings_and_gradients(plain_run):
    out, result = plain_run
    proto = load_protocol(PROTOCOLS / "plain.yaml")
    n_train = result["rows"]["train"]
    b, d = proto.training.batch_size, proto.parties.passive[0].model.out
    steps = result["train_steps"]
    per_epoch = -(-n_train // b)
    assert steps == per_epoch * proto.training.epochs
    # rows sent per epoch = n_train; embedding and gradient, each way, per passive party
    expected_total = 2 * proto.n_passive * n_train * d * 4 * proto.training.epochs
    led = result["ledger"]
    assert led["by_phase"]["train"]["bytes"] == expected_total
    assert result["bytes_per_step"] == pytest.approx(expected_total / steps)
    # a full batch step is exactly B x d x 4 bytes each way per passive party
    records = [json.loads(line) for line in (out / "ranks" / "rank1.ledger.jsonl").read_text().splitlines()]
    first = [r for r in records if r["phase"] == "train" and r["round"] == 0]
    assert {(r["direction"], r["tag"], tuple(r["shape"]), r["bytes"]) for r in first} == {
        ("sent", "embedding", (b, d), b * d * 4),
        ("recv", "embedding_grad", (b, d), b * d * 4),
    }
    # only the declared message types appear in training
    flows = {(f["sender"], f["receiver"], f["tag"]) for f in led["flows"] if f["phase"] == "train"}
    assert flows == {
        (1, 0, "embedding"),
        (2, 0, "embedding"),
        (0, 1, "embedding_grad"),
        (0, 2, "embedding_grad"),
    }


def test_breast_cancer_three_passive_parties_auc(tmp_path: Path):
    from securevfl.app.launcher import launch

    result = launch(load_checked(PROTOCOLS / "breast_cancer.yaml"), tmp_path, progress=False)
    assert result["n_passive"] == 3 and len(set(result["party_pids"].values())) == 4
    assert result["test_auc"] >= 0.97, result["test_auc"]


# -- split training == centralized training --------------------------------------


def _central_epoch(proto, data_dir: Path) -> dict[str, torch.Tensor]:
    """The same architecture in one process: same seeds, same batches, same init."""
    from securevfl.models import interactive_optimizer, make_optimizer
    from securevfl.schedule import train_batches

    tr = proto.training
    x_train, y_train, classes = training_rows(proto, data_dir)
    ref = ReferenceSplit(proto, x_train, classes)
    params = [q for m in [*ref.bottoms, ref.top] for q in m.parameters()] + [ref.bias]
    opt = make_optimizer(params, tr)
    opt_w = interactive_optimizer([b.weight for b in ref.blocks], proto.interactive)
    for idx in train_batches(len(y_train), tr.batch_size, tr.seed, 0):
        hs = [b(x[idx]) for b, x in zip(ref.bottoms, x_train, strict=True)]
        loss = F.cross_entropy(ref.logits(hs), y_train[idx])
        opt.zero_grad()
        opt_w.zero_grad()
        loss.backward()
        opt.step()
        opt_w.step()
    return ref.state()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_one_epoch_split_equals_central(tmp_path: Path, optimizer: str):
    doc = small_digits(epochs=1, optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.01)
    run_doc(doc, tmp_path)
    proto = load_protocol_dict(doc)
    central = _central_epoch(proto, tmp_path / "data")
    split = split_state(tmp_path, proto)
    assert set(split) == set(central)
    worst = max(float((split[k] - central[k]).abs().max()) for k in central)
    assert worst <= 1e-5, worst
    # and training moved the parameters (the comparison is not vacuous)
    init = _central_init_distance(proto, central)
    assert init > 1e-3


def _central_init_distance(proto, trained: dict[str, torch.Tensor]) -> float:
    from securevfl.models import build_top

    top0 = build_top(proto.top, proto.interactive.out, 10, seed=proto.training.seed)
    return max(float((v - trained[f"top.{k}"]).abs().max()) for k, v in top0.state_dict().items())
