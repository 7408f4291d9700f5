"""The Criteo TSV loader and its VFL split (spec 002 §4.4), on the checked-in
300-record fixture in Criteo format (tests/data/criteo_tiny.tsv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from securevfl.data.criteo import (
    ACTIVE_CATEGORICAL,
    DENSE,
    PASSIVE_CATEGORICAL,
    dense_transform,
    one_hot_top,
    read_criteo,
    split_criteo,
)
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


def test_dense_transform_is_signed_log_with_a_missing_indicator():
    v, miss = dense_transform(pd.Series([0.0, 3.0, -2.0, np.nan]))
    assert np.allclose(v, [0.0, np.log(4.0), -np.log(3.0), 0.0])
    assert miss.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_one_hot_keeps_the_top_values_and_an_other_bucket():
    s = pd.Series(["a", "b", "a", "", "c", "a", "b"])
    hot = one_hot_top(s, "C1", 2)
    assert list(hot.columns) == ["C1_a", "C1_b", "C1_other"]
    assert (hot.sum(axis=1) == 1).all()
    assert hot["C1_other"].tolist() == [0, 0, 0, 1, 1, 0, 0]  # missing and rare values


def test_split_gives_each_party_only_its_own_fields(tmp_path: Path):
    paths = split_criteo(FIXTURE, tmp_path, top_k=4)
    p, a = pd.read_csv(paths["passive"]), pd.read_csv(paths["active"])
    assert p["id"].tolist() == a["id"].tolist() and len(p) == 300
    assert not p.isna().any().any() and not a.isna().any().any()
    assert "label" not in p and "day" not in p
    fields_p = {c.split("_")[0] for c in p.columns if c != "id"}
    fields_a = {c.split("_")[0] for c in a.columns if c not in ("id", "day", "label")}
    assert fields_p == set(DENSE) | set(PASSIVE_CATEGORICAL)
    assert fields_a == set(ACTIVE_CATEGORICAL)
    assert all(f"{d}_missing" in p for d in DENSE)
    for f in ACTIVE_CATEGORICAL:  # top 4 plus other, one of them set per row
        cols = [c for c in a.columns if c.startswith(f"{f}_")]
        assert len(cols) <= 5 and (a[cols].sum(axis=1) == 1).all()


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
