"""The Criteo TSV loader, its VFL split (docs/methods/dravl.md §4.4) and the per-party
preprocessing that encodes it, on the checked-in 300-record fixture in Criteo
format (tests/data/criteo_tiny.tsv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from securevfl.config import CsvSource, PreprocessSpec
from securevfl.data.criteo import (
    ACTIVE_CATEGORICAL,
    DENSE,
    PASSIVE_CATEGORICAL,
    criteo_paths,
    criteo_preprocess,
    criteo_protocol,
    read_criteo,
    split_criteo,
)
from securevfl.data.party_data import load_party_data
from securevfl.data.preprocess import fit_preprocessor
from securevfl.errors import DataError

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "criteo_tiny.tsv"


def test_fixture_parses_into_days_labels_and_missing_values():
    f = read_criteo(FIXTURE)
    assert len(f) == 300 and list(f.columns[:3]) == ["id", "day", "label"]
    assert set(f["label"]) == {0, 1}
    days = f["day"].to_numpy()
    assert (np.diff(days) >= 0).all() and sorted(set(days)) == list(range(7))
    assert max(np.bincount(days)) - min(np.bincount(days)) <= 1  # 7 equal chunks by row order
    raw = [line.split("\t") for line in FIXTURE.read_text().splitlines()]
    empty_dense = sum(v == "" for r in raw for v in r[1:14])
    assert empty_dense > 0 and int(f[DENSE].isna().sum().sum()) == empty_dense
    assert read_criteo(FIXTURE, max_rows=50)["day"].max() == 6


def test_split_gives_each_party_only_its_own_raw_fields(tmp_path: Path):
    paths = split_criteo(FIXTURE, tmp_path)
    assert paths == criteo_paths(tmp_path)
    p = pd.read_csv(paths["passive"], dtype=str, keep_default_na=False)
    a = pd.read_csv(paths["active"], dtype=str, keep_default_na=False)
    assert p["id"].tolist() == a["id"].tolist() and len(p) == 300
    assert list(p.columns) == ["id", *DENSE, *PASSIVE_CATEGORICAL]
    assert list(a.columns) == ["id", "day", "label", *ACTIVE_CATEGORICAL]
    raw = [line.split("\t") for line in FIXTURE.read_text().splitlines()]
    assert a["label"].tolist() == [r[0] for r in raw]
    assert p["C1"].tolist() == [r[14] for r in raw]  # hashes as written, '' when missing
    assert p["I2"].tolist() == [r[2] for r in raw]


def _passive_matrix(tmp_path: Path, top_k: int) -> tuple[list[str], np.ndarray, pd.DataFrame]:
    paths = split_criteo(FIXTURE, tmp_path)
    pre = PreprocessSpec.model_validate(
        criteo_preprocess(top_k, dense=DENSE, categorical=PASSIVE_CATEGORICAL)
    )
    data = load_party_data(CsvSource(path=str(paths["passive"])), "media", is_active=False, preprocess=pre)
    fitted = fit_preprocessor(pre, "media", data.frame)
    return fitted.columns, fitted.transform(data.frame), read_criteo(FIXTURE)


def test_passive_preprocessing_is_the_specs_signed_log_with_missing_indicators(tmp_path: Path):
    columns, x, raw = _passive_matrix(tmp_path, 4)
    for field in ("I1", "I2"):
        v = raw[field].to_numpy()
        expect = np.where(np.isnan(v), 0.0, np.sign(v) * np.log1p(np.abs(v)))
        assert np.allclose(x[:, columns.index(field)], expect, atol=1e-6)
        if np.isnan(v).any():
            assert (
                x[:, columns.index(f"missingindicator_{field}")].tolist()
                == np.isnan(v).astype(float).tolist()
            )


def test_categorical_fields_become_top_k_one_hots_with_an_other_column(tmp_path: Path):
    columns, x, raw = _passive_matrix(tmp_path, 4)
    for field in PASSIVE_CATEGORICAL:
        cols = [j for j, c in enumerate(columns) if c.startswith(f"{field}_")]
        assert len(cols) <= 5 and (x[:, cols].sum(axis=1) == 1).all()
    values = raw["C1"].replace("", "missing")
    top = values.value_counts()
    kept = [c.removeprefix("C1_") for c in columns if c.startswith("C1_") and "infrequent" not in c]
    assert len(kept) == min(4, values.nunique())
    assert min(top[k] for k in kept) >= max([top[v] for v in top.index if v not in kept], default=0)


def test_protocol_declares_each_partys_own_preprocessing(tmp_path: Path):
    doc = criteo_protocol(criteo_paths(tmp_path), top_k=3)
    active, media = doc["parties"]["active"], doc["parties"]["passive"][0]
    assert active["source"]["feature_columns"] == ACTIVE_CATEGORICAL  # day is not a feature
    assert active["preprocess"]["categorical"] == {
        "columns": ACTIVE_CATEGORICAL,
        "max_categories": 3,
        "other": True,
    }
    assert "signed_log1p" not in active["preprocess"]
    assert media["preprocess"]["signed_log1p"] == DENSE
    assert media["preprocess"]["categorical"]["columns"] == PASSIVE_CATEGORICAL
    with pytest.raises(DataError, match="top_k must be at least 1"):
        criteo_protocol(criteo_paths(tmp_path), top_k=0)


@pytest.mark.parametrize(
    "line,needle",
    [
        ("1\t2\t3", "line 2: 3 tab-separated fields, expected 40"),
        ("2" + "\t" * 39, "line 2: label is '2'"),
        ("0\tx" + "\t" * 38, "line 2: I1 is 'x', not an integer"),
    ],
)
def test_malformed_records_name_the_line_and_field(tmp_path: Path, line: str, needle: str):
    good = FIXTURE.read_text().splitlines()[0]
    bad = tmp_path / "bad.tsv"
    bad.write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError, match=needle):
        read_criteo(bad)


def test_empty_or_missing_file_is_refused(tmp_path: Path):
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(DataError, match="no records"):
        read_criteo(tmp_path / "empty.tsv")
    with pytest.raises(DataError, match="no file"):
        read_criteo(tmp_path / "absent.tsv")
