"""Loading one party's own CSV: validation errors name party, column and ID;
labels only at the active party; split and standardization."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from securevfl.config import CsvSource
from securevfl.data.party_data import (
    check_test_rows,
    load_new_records,
    load_party_data,
    split_indices,
    standardize,
)
from securevfl.errors import DataError, DataWarning
from securevfl.seeding import generator


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text.strip() + "\n")
    return str(p)


def src(path: str, **kw) -> CsvSource:
    return CsvSource(path=path, **kw)


def test_passive_loads_every_non_id_column(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,age,income
c-01,30,1.5
c-02,41,2.5
c-03,52,3.5
""",
    )
    data = load_party_data(src(path), "shop", is_active=False)
    assert data.party == "shop"
    assert data.ids == ["c-01", "c-02", "c-03"]
    assert data.columns == ["age", "income"]
    assert data.x.dtype == np.float32
    np.testing.assert_allclose(data.x, [[30, 1.5], [41, 2.5], [52, 3.5]])
    assert data.y is None and data.classes is None


def test_ids_are_read_as_strings(tmp_path):
    # numeric-looking IDs keep their leading zeros (they are keys, not numbers)
    path = write(
        tmp_path,
        "p.csv",
        """
id,f
007,1
010,2
""",
    )
    assert load_party_data(src(path), "p", is_active=False).ids == ["007", "010"]


def test_passive_never_gets_labels(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f1,label
a,1,0
b,2,1
c,3,0
""",
    )
    # a label_column on a passive source is ignored by the loader (and refused at load)
    data = load_party_data(src(path, label_column="label"), "p", is_active=False)
    assert data.y is None and data.classes is None
    # without feature_columns, every non-ID column is this party's own feature
    assert data.columns == ["f1", "label"]
    # with feature_columns, only those are read
    data = load_party_data(src(path, feature_columns=["f1"]), "p", is_active=False)
    assert data.columns == ["f1"]
    assert data.x.shape == (3, 1)
    assert data.y is None


def test_active_label_only(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,secret,label
a,9,yes
b,8,no
c,7,yes
d,6,maybe
""",
    )
    with pytest.warns(DataWarning, match="3 distinct values in 4 rows"):
        data = load_party_data(src(path, label_column="label"), "bank", is_active=True)
    # the active party reads no feature columns unless it lists them
    assert data.columns == []
    assert data.x.shape == (4, 0)
    # labels are mapped to indices of the sorted class values
    assert data.classes == ["maybe", "no", "yes"]
    assert data.y.dtype == np.int64
    assert data.y.tolist() == [2, 1, 2, 0]


def test_active_with_own_features(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,x1,x2,label
a,1,10,3
b,2,20,5
c,3,30,3
""",
    )
    data = load_party_data(src(path, label_column="label", feature_columns=["x2"]), "bank", is_active=True)
    assert data.columns == ["x2"]
    np.testing.assert_allclose(data.x[:, 0], [10, 20, 30])
    assert data.classes == ["3", "5"]
    assert data.y.tolist() == [0, 1, 0]


def test_take_reorders_rows_and_labels(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,x,label
a,1,0
b,2,1
c,3,1
""",
    )
    data = load_party_data(src(path, label_column="label", feature_columns=["x"]), "bank", is_active=True)
    t = data.take(np.array([2, 0]))
    assert t.ids == ["c", "a"]
    assert t.x[:, 0].tolist() == [3, 1]
    assert t.y.tolist() == [1, 0]


# -- errors --------------------------------------------------------------------------------


def test_nan_in_feature_column_names_party_column_and_id(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,age,income
cust-aa01,30,1.5
cust-bb02,41,
cust-cc03,52,3.5
""",
    )
    with pytest.raises(DataError) as info:
        load_party_data(src(path), "shop", is_active=False)
    msg = str(info.value)
    assert "'shop'" in msg
    assert "'income'" in msg
    assert "age" not in msg
    # the public message (relayed to every party) names no ID; the owner's detail does
    assert "cust-" not in msg
    assert "cust-bb02" in info.value.detail and "line 3" in info.value.detail


def test_infinite_value_is_rejected(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f
a,1
b,inf
""",
    )
    with pytest.raises(DataError, match=r"1 missing, infinite.*'f'") as info:
        load_party_data(src(path), "p", is_active=False)
    assert "'b'" not in str(info.value) and "ID 'b'" in info.value.detail


def test_duplicate_ids_are_counted_and_named_to_the_owner_only(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f
u-1,1
u-2,2
u-1,3
u-3,4
u-3,5
""",
    )
    with pytest.raises(DataError) as info:
        load_party_data(src(path), "telco", is_active=False)
    msg = str(info.value)
    assert "'telco'" in msg and "duplicate" in msg and "2 duplicate IDs" in msg
    assert "u-" not in msg  # relayed to every party: no IDs
    detail = info.value.detail
    assert "u-1" in detail and "u-3" in detail
    assert "u-2" not in detail


def test_missing_id_value_names_the_line(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f
u-1,1
,2
u-3,3
""",
    )
    with pytest.raises(DataError) as info:
        load_party_data(src(path), "telco", is_active=False)
    msg = str(info.value)
    assert "'telco'" in msg and "missing ID" in msg and "'id'" in msg
    assert "line" not in msg
    assert "line 3" in info.value.detail


def test_missing_id_column(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
key,f
u-1,1
""",
    )
    with pytest.raises(DataError, match=r"'telco'.*ID column 'id'"):
        load_party_data(src(path), "telco", is_active=False)
    # a custom ID column works
    data = load_party_data(src(path, id_column="key"), "telco", is_active=False)
    assert data.ids == ["u-1"] and data.columns == ["f"]


def test_active_party_with_missing_label_column(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,target
a,1
b,0
""",
    )
    with pytest.raises(DataError) as info:
        load_party_data(src(path, label_column="label"), "bank", is_active=True)
    msg = str(info.value)
    assert "'bank'" in msg and "label column 'label'" in msg


def test_active_party_without_label_column_setting(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,label
a,1
b,0
""",
    )
    with pytest.raises(DataError, match=r"'bank'.*label_column"):
        load_party_data(src(path), "bank", is_active=True)


def test_missing_label_value_names_the_id_to_the_owner_only(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,label
a,1
b,
c,0
""",
    )
    with pytest.raises(DataError, match=r"'bank'.*missing label.*'label' on 1 rows") as info:
        load_party_data(src(path, label_column="label"), "bank", is_active=True)
    assert "'b'" not in str(info.value) and "ID 'b'" in info.value.detail


def test_single_class_labels_rejected(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        """
id,label
a,1
b,1
""",
    )
    with pytest.raises(DataError, match="fewer than 2 classes"):
        load_party_data(src(path, label_column="label"), "bank", is_active=True)


def test_non_numeric_feature_column(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f,city
a,1,Paris
b,2,Rome
""",
    )
    with pytest.raises(DataError, match=r"'shop'.*non-numeric.*city"):
        load_party_data(src(path), "shop", is_active=False)


def test_unknown_feature_columns(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id,f
a,1
""",
    )
    with pytest.raises(DataError, match=r"'shop'.*'g'"):
        load_party_data(src(path, feature_columns=["f", "g"]), "shop", is_active=False)


def test_passive_without_features(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        """
id
a
b
""",
    )
    with pytest.raises(DataError, match=r"'shop'.*no feature columns"):
        load_party_data(src(path), "shop", is_active=False)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"'shop'.*not found"):
        load_party_data(src(str(tmp_path / "nope.csv")), "shop", is_active=False)


# -- split and standardization -------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_complete():
    a_tr, a_te = split_indices(101, 0.2, generator(7, "split"))
    b_tr, b_te = split_indices(101, 0.2, generator(7, "split"))
    np.testing.assert_array_equal(a_tr, b_tr)
    np.testing.assert_array_equal(a_te, b_te)
    assert len(a_te) == 20 and len(a_tr) == 81
    assert not set(a_tr.tolist()) & set(a_te.tolist())
    assert sorted(np.concatenate([a_tr, a_te]).tolist()) == list(range(101))
    # sorted, so rows keep the agreed (aligned) order within each split
    assert (np.diff(a_tr) > 0).all() and (np.diff(a_te) > 0).all()
    c_tr, _ = split_indices(101, 0.2, generator(8, "split"))
    assert not np.array_equal(a_tr, c_tr)


def test_split_keeps_one_test_row_and_refuses_too_few_rows():
    tr, te = split_indices(5, 0.01, generator(0, "split"))
    assert len(te) == 1 and len(tr) == 4
    with pytest.raises(DataError, match="too few"):
        split_indices(1, 0.2, generator(0, "split"))


def test_standardize_uses_training_statistics():
    rng = np.random.default_rng(0)
    x_tr = rng.normal(5.0, 3.0, size=(200, 3)).astype(np.float32)
    x_tr[:, 2] = 4.0  # constant column
    x_te = rng.normal(-2.0, 1.0, size=(50, 3)).astype(np.float32)
    s_tr, s_te = standardize(x_tr, x_te)
    assert s_tr.dtype == np.float32 and s_te.dtype == np.float32
    np.testing.assert_allclose(s_tr[:, :2].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(s_tr[:, :2].std(axis=0), 1.0, atol=1e-4)
    mu, sd = x_tr.mean(axis=0), x_tr.std(axis=0)
    np.testing.assert_allclose(s_te[:, :2], (x_te[:, :2] - mu[:2]) / sd[:2], rtol=1e-5, atol=1e-5)
    # the test rows are not re-centred on their own statistics
    assert s_te[:, 0].mean() < -1.0
    # a constant column keeps scale 1 (only shifted), no division by zero
    np.testing.assert_allclose(s_tr[:, 2], 0.0)
    np.testing.assert_allclose(s_te[:, 2], x_te[:, 2] - 4.0, atol=1e-5)


def test_row_with_extra_fields_is_refused(tmp_path):
    # one row too long: pandas would drop the extra field when reading some columns
    path = write(tmp_path, "p.csv", "\nid,f,g\na,1,2\nb,3,4,99\nc,5,6\n")
    with pytest.raises(DataError, match=r"'p'.*more fields than the header") as info:
        load_party_data(src(path), "p", is_active=False)
    assert "line 3" in info.value.detail


def test_every_row_with_extra_fields_is_refused(tmp_path):
    # every row too long: pandas would silently make the ID column the index
    path = write(tmp_path, "p.csv", "\nid,f\na,1,2\nb,3,4\n")
    with pytest.raises(DataError, match="more fields than the header"):
        load_party_data(src(path), "p", is_active=False)


def test_header_only_file_says_it_has_no_rows(tmp_path):
    path = write(tmp_path, "p.csv", "\nid,f,g\n")
    with pytest.raises(DataError, match=r"'p'.*header but no rows"):
        load_party_data(src(path), "p", is_active=False)


def test_float32_overflow_is_refused_at_load(tmp_path):
    path = write(tmp_path, "p.csv", "\nid,f,g\na,1,2\nb,1e300,4\nc,5,6\n")
    with pytest.raises(DataError, match=r"1 missing, infinite or float32-overflowing.*'f'") as info:
        load_party_data(src(path), "p", is_active=False)
    assert "1e" not in str(info.value) and "'b'" not in str(info.value)


def test_label_with_nearly_one_class_per_row_warns(tmp_path):
    """Whole numbers with nearly one value per row: classes or a quantity? The
    classifier stays the default, with a warning that names the way out."""
    rows = "".join(f"u{i},{i * 7}\n" for i in range(60))
    path = write(tmp_path, "a.csv", "\nid,label\n" + rows)
    with pytest.warns(
        DataWarning, match=r"60 distinct values in 60 rows.*continuous target.*task: regression"
    ):
        data = load_party_data(src(path, label_column="label"), "bank", is_active=True)
    assert data.task == "multiclass" and data.classes is not None and len(data.classes) == 60


def test_non_integer_label_is_inferred_as_regression(tmp_path):
    rows = "".join(f"u{i},{i * 0.37:.3f}\n" for i in range(60))
    path = write(tmp_path, "a.csv", "\nid,label\n" + rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = load_party_data(src(path, label_column="label"), "bank", is_active=True)
    assert data.task == "regression" and data.classes is None
    assert data.y is not None and data.y.dtype == np.float32
    assert data.y[:3].tolist() == pytest.approx([0.0, 0.37, 0.74])


def test_declared_task_decides(tmp_path):
    rows = "".join(f"u{i},{i % 3}\n" for i in range(60))
    path = write(tmp_path, "a.csv", "\nid,label\n" + rows)
    reg = load_party_data(src(path, label_column="label"), "bank", is_active=True, task="regression")
    assert reg.task == "regression" and reg.y is not None and reg.y.dtype == np.float32
    multi = load_party_data(src(path, label_column="label"), "bank", is_active=True)
    assert multi.task == "multiclass" and multi.classes == ["0", "1", "2"]
    with pytest.raises(DataError, match=r"'bank': task is binary but label column 'label' has 3 classes"):
        load_party_data(src(path, label_column="label"), "bank", is_active=True, task="binary")
    text = write(tmp_path, "t.csv", "\nid,label\na,x\nb,y\n")
    with pytest.raises(DataError, match=r"'bank': label column 'label' is not numeric"):
        load_party_data(src(text, label_column="label"), "bank", is_active=True, task="regression")


def test_label_with_few_classes_does_not_warn(tmp_path):
    rows = "".join(f"u{i},{i % 3}\n" for i in range(60))
    path = write(tmp_path, "a.csv", "\nid,label\n" + rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_party_data(src(path, label_column="label"), "bank", is_active=True)


def test_test_split_smaller_than_the_classes_is_refused():
    with pytest.raises(DataError, match=r"'bank'.*test split holds 2 rows, fewer than the 3 classes"):
        check_test_rows("bank", 2, ["a", "b", "c"])
    check_test_rows("bank", 3, ["a", "b", "c"])
    check_test_rows("shop", 1, None)  # a passive party holds no labels


@pytest.mark.parametrize(
    ("header", "repeated"),
    [
        ("id,alcohol,alcohol,ash", "['alcohol']"),
        ('id,"a",a,b,b', "['a', 'b']"),
        ("id,x,id", "['id']"),
        # a UTF-8 byte order mark (which pandas drops) does not hide a repeated first name
        ("\ufeffid,x,id", "['id']"),
        ("\ufeffalcohol,id,alcohol,ash", "['alcohol']"),
    ],
)
def test_a_header_naming_a_column_twice_is_refused(tmp_path, header, repeated):
    path = write(tmp_path, "p.csv", header + "\n" + ",".join(["1"] * header.count(",")) + ",1\n")
    for load in (
        lambda: load_party_data(src(path), "shop", is_active=False),
        lambda: load_new_records(src(path), "shop", ["ash"]),
    ):
        with pytest.raises(DataError) as info:
            load()
        assert f"party 'shop': the header of its data file names the column(s) {repeated}" in str(info.value)
