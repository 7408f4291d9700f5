"""Built-in datasets and their materialization into one file per party."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from securevfl.app.loader import load_protocol_dict
from securevfl.data import partition
from securevfl.data.partition import (
    LABEL_COLUMN,
    PENDING,
    await_materialized,
    dataset_key,
    materialize,
    materialize_apart,
    materializing,
    party_source,
)
from securevfl.errors import DataError


def _synthetic(rows=300, features=12, classes=3):
    return {
        "name": "syn",
        "dataset": {
            "name": "synthetic",
            "synthetic": {"rows": rows, "features": features, "classes": classes},
        },
        "parties": {
            "active": {"name": "a"},
            "passive": [
                {"name": "p1", "columns": {"index": [0, 5]}, "model": {"out": 4}},
                {"name": "p2", "columns": {"index": [5, features]}, "model": {"out": 4}},
            ],
        },
    }


def test_synthetic_materializes_one_file_per_party(tmp_path: Path):
    proto = load_protocol_dict(_synthetic())
    folder = materialize(proto, tmp_path)
    assert folder == tmp_path / dataset_key(proto)
    a = pd.read_csv(folder / "a.csv")
    p1 = pd.read_csv(folder / "p1.csv")
    p2 = pd.read_csv(folder / "p2.csv")
    assert list(a.columns) == ["id", LABEL_COLUMN] and sorted(a[LABEL_COLUMN].unique()) == [0, 1, 2]
    assert list(p1.columns) == ["id", "f0", "f1", "f2", "f3", "f4"]
    assert list(p2.columns) == ["id"] + [f"f{i}" for i in range(5, 12)]
    assert len(a) == len(p1) == len(p2) == 300
    assert LABEL_COLUMN not in p1.columns and LABEL_COLUMN not in p2.columns
    src = party_source(proto, "a", tmp_path)
    assert src.label_column == LABEL_COLUMN and src.feature_columns == []


def test_materialize_one_party_only_and_is_deterministic(tmp_path: Path):
    proto = load_protocol_dict(_synthetic())
    materialize(proto, tmp_path / "x", only="p1")
    folder = tmp_path / "x" / dataset_key(proto)
    assert sorted(f.name for f in folder.glob("*.csv")) == ["p1.csv"]
    materialize(proto, tmp_path / "y")
    assert (folder / "p1.csv").read_text() == (tmp_path / "y" / dataset_key(proto) / "p1.csv").read_text()


def test_parallel_writers_produce_the_serial_files(tmp_path: Path, monkeypatch):
    proto = load_protocol_dict(_synthetic())
    serial = materialize(proto, tmp_path / "serial")
    monkeypatch.setattr(partition, "PARALLEL_MIN_VALUES", 0)
    monkeypatch.setattr(partition, "_cores", lambda: 2)
    forked = materialize(proto, tmp_path / "forked")
    names = sorted(f.name for f in serial.iterdir())
    assert names == sorted(f.name for f in forked.iterdir()) == ["a.csv", "meta.json", "p1.csv", "p2.csv"]
    for name in names:
        assert (serial / name).read_bytes() == (forked / name).read_bytes(), name


def test_a_rank_waits_for_its_file_while_the_launcher_writes_the_folder(tmp_path: Path):
    proto = load_protocol_dict(_synthetic())
    folder = tmp_path / dataset_key(proto)
    with materializing(proto, tmp_path) as pending:
        assert pending and [p.name for p in folder.glob(f"{PENDING}.*")] == [f"{PENDING}.{os.getpid()}"]
        writer = threading.Timer(0.3, materialize, args=(proto, tmp_path))
        writer.start()
        src = party_source(proto, "a", tmp_path)  # blocks until a.csv is there
        writer.join()
    assert (folder / "a.csv").is_file() and src.feature_columns == []  # read once the file existed
    assert not list(folder.glob(f"{PENDING}.*"))
    with materializing(proto, tmp_path) as pending:  # every file there: nothing to do
        assert not pending and not list(folder.glob(f"{PENDING}.*"))


def test_waiting_for_a_file_that_never_comes_is_a_data_error(tmp_path: Path):
    (tmp_path / f"{PENDING}.1").write_text("1")  # another launcher's marker
    with pytest.raises(DataError, match=r"party 'p1'.*not written within"):
        await_materialized(tmp_path / "p1.csv", timeout_s=0.2)
    (tmp_path / f"{PENDING}.1").unlink()
    await_materialized(tmp_path / "p1.csv", timeout_s=0.2)  # nothing pending: returns at once


@pytest.mark.parametrize("name,n,cols,classes", [("digits", 1797, 64, 10), ("breast_cancer", 569, 30, 2)])
def test_builtin_tables(name, n, cols, classes):
    from securevfl.data.catalog import DATASETS

    proto = load_protocol_dict({**_synthetic(), "dataset": {"name": name}})
    t = DATASETS.get(name)(proto.dataset, 0)
    assert len(t.ids) == n and t.features.shape == (n, cols) and len(set(t.labels)) == classes
    assert len(set(t.ids)) == n


def test_synthetic_label_noise_redraws_that_share_of_labels():
    """``label_noise`` is scikit-learn's flip_y: that share of rows gets a label
    drawn at random, about half of which differ on a binary task. A linear model
    fitted on the rows loses about that much accuracy (0.4 x 1/2 = 0.2)."""
    from sklearn.linear_model import LogisticRegression

    from securevfl.config import DatasetSpec
    from securevfl.data.datasets import synthetic

    def fit_accuracy(noise: float) -> float:
        spec = DatasetSpec(name="synthetic", synthetic={"rows": 4000, "features": 8, "label_noise": noise})
        t = synthetic(spec, 7)
        return LogisticRegression(max_iter=1000).fit(t.features, t.labels).score(t.features, t.labels)

    clean, noisy = fit_accuracy(0.0), fit_accuracy(0.4)
    assert 0.12 < clean - noisy < 0.28, (clean, noisy)
    with pytest.raises(ValueError):
        DatasetSpec(name="synthetic", synthetic={"label_noise": 1.0})


def test_one_party_materialized_apart_writes_its_file_only(tmp_path: Path):
    """``securevfl party``'s materialization: a forked child writes the party's own
    file (the other parties' columns never enter the calling process), and its
    error is raised in the caller."""
    proto = load_protocol_dict(_synthetic())
    materialize_apart(proto, tmp_path, "p2")
    folder = tmp_path / dataset_key(proto)
    assert sorted(p.name for p in folder.glob("*.csv")) == ["p2.csv"]
    assert list(pd.read_csv(folder / "p2.csv", nrows=0).columns) == ["id"] + [f"f{i}" for i in range(5, 12)]
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        materialize_apart(proto, tmp_path / "file", "p1")


@pytest.mark.parametrize("name", ["digits", "breast_cancer", "diabetes", "synthetic"])
def test_catalog_columns_are_the_builders_columns(name):
    """The columns known without building a dataset (checked at load, with no
    scikit-learn) are the columns its builder makes, in order."""
    from securevfl.config import DatasetSpec
    from securevfl.data.catalog import DATASETS, feature_columns

    spec = DatasetSpec(name=name)
    table = DATASETS.get(name)(spec, 0)
    assert feature_columns(name, spec) == list(table.features.columns)
