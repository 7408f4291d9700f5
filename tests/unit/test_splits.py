"""Split and data-preparation rules of HashVFL's experiments (docs/methods/hashvfl.md §4, §8.1
"Data and split utilities", §8.2 item 12): image column strips, the code's
feature ratios and contiguous blocks with Python's round, the text character
slices, SMOTE, and its order relative to the train/test split (§7 item 8)."""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.app.loader import load_protocol_dict
from securevfl.data import splits
from securevfl.data.catalog import feature_columns
from securevfl.data.partition import resolve_partition
from securevfl.errors import ConfigError, DataError
from tests.support.protocols import load_yaml

# -- docs/methods/hashvfl.md §8.2 item 12 --------------------------------------------------------------------


@pytest.mark.parametrize("width, halves", [(28, [14, 14]), (32, [16, 16]), (48, [24, 24])])
def test_image_column_split_widths(width, halves):
    assert splits.image_column_widths(width) == halves


def test_tabular_blocks_use_pythons_half_to_even_round():
    assert splits.block_sizes(95, [0.5, 0.5]) == [48, 47]  # round(47.5) = 48
    assert splits.block_sizes(25, [0.5, 0.5]) == [12, 13]  # round(12.5) = 12
    assert splits.block_sizes(28, [0.5, 0.5]) == [14, 14]
    assert splits.contiguous_blocks(95, [0.5, 0.5]) == [(0, 48), (48, 95)]
    assert splits.contiguous_blocks(25, [0.5, 0.5]) == [(0, 12), (12, 25)]


def test_feature_ratios_for_n_parties():
    assert splits.feature_ratios(3) == [0.33, 0.33, 0.34]
    assert splits.feature_ratios(2) == [0.5, 0.5]
    assert splits.feature_ratios(4) == [0.25, 0.25, 0.25, 0.25]
    assert splits.feature_ratios(1) == [1.0]
    assert splits.block_sizes(100, splits.feature_ratios(3)) == [33, 33, 34]


# -- the other split helpers --------------------------------------------------------------------


def test_image_columns_index_whole_columns_of_a_flattened_image():
    img = np.arange(3 * 4 * 6).reshape(3, 4, 6)  # channels x height x width
    left, right = splits.image_columns(4, 6, channels=3)
    flat = img.reshape(-1)
    assert np.array_equal(flat[left].reshape(3, 4, 3), img[:, :, :3])
    assert np.array_equal(flat[right].reshape(3, 4, 3), img[:, :, 3:])
    assert sorted(left + right) == list(range(flat.size))
    # MNIST-like 28 x 28: 14 whole columns each
    a, b = splits.image_columns(28, 28)
    assert len(a) == len(b) == 28 * 14 and a[:15] == [*range(14), 28]


def test_text_slices_are_160_character_windows():
    text = "".join(chr(ord("a") + i % 26) for i in range(400))
    first, second = splits.text_slices(text)
    assert first == text[:160] and second == text[160:320]
    assert splits.text_slices("short", 3, width=3) == ["sho", "rt", ""]


@pytest.mark.parametrize(
    "n, ratios, word",
    [
        (10, [0.5, 0.6], "sum to 1"),
        (10, [1.0, 0.0], "positive"),
        (3, [0.1, 0.9], "without columns"),
        (5, [], "empty"),
    ],
)
def test_bad_ratios_are_refused(n, ratios, word):
    with pytest.raises(ConfigError, match=word):
        splits.block_sizes(n, ratios)


def test_protocol_block_selects_the_ratio_blocks():
    doc = load_yaml("breast_cancer.yaml")
    assert len(doc["parties"]["passive"]) == 3
    for k, p in enumerate(doc["parties"]["passive"]):
        p["columns"] = {"block": {"ratios": [0.25, 0.25, 0.5], "part": k}}
    proto = load_protocol_dict(doc)
    cols = feature_columns("breast_cancer", proto.dataset)
    assert len(cols) == 30
    got = [resolve_partition(proto, cols)[p.name] for p in proto.parties.passive]
    assert got == [cols[:8], cols[8:16], cols[16:]]  # round(7.5) = 8 twice, the rest 14
    doc["parties"]["passive"][0]["columns"] = {"block": {"ratios": [0.5, 0.6], "part": 0}}
    with pytest.raises(ConfigError, match="sum to 1") as exc:
        load_protocol_dict(doc)
    assert exc.value.path.startswith("parties.passive[0].columns")
    doc["parties"]["passive"][0]["columns"] = {"block": {"ratios": [0.25, 0.25, 0.5], "part": 1}}
    with pytest.raises(ConfigError, match="given to both"):  # two parties hold block 1
        load_protocol_dict(doc)


# -- SMOTE ---------------------------------------------------------------------------------------


def _imbalanced(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(0, 1, (60, 3)), rng.normal(3, 1, (15, 3)), rng.normal(-3, 1, (9, 3))])
    y = np.array([0] * 60 + [1] * 15 + [2] * 9)
    return x, y


def test_smote_balances_every_class_to_the_majority_count():
    x, y = _imbalanced()
    s = splits.smote(x, y, k=5, seed=0)
    assert np.bincount(s.y).tolist() == [60, 60, 60]
    assert np.array_equal(s.x[:84], x) and np.array_equal(s.y[:84], y)  # originals kept, first
    assert s.synthetic.sum() == 45 + 51 and not s.synthetic[:84].any()


def test_synthetic_rows_lie_between_a_row_and_one_of_its_k_nearest_same_class_neighbours():
    x, y = _imbalanced()
    k = 5
    s = splits.smote(x, y, k=k, seed=1)
    new = s.x[s.n_original :]
    assert np.allclose(new, x[s.base] + s.gap[:, None] * (x[s.neighbour] - x[s.base]))
    assert ((s.gap >= 0) & (s.gap < 1)).all()
    assert (y[s.base] == y[s.neighbour]).all() and (s.y[s.n_original :] == y[s.base]).all()
    assert (s.base != s.neighbour).all()
    # the neighbour is among the base row's k nearest rows of its class (brute force)
    for b, n in zip(s.base, s.neighbour, strict=True):
        same = np.flatnonzero((y == y[b]) & (np.arange(len(y)) != b))
        dist = np.linalg.norm(x[same] - x[b], axis=1)
        assert n in same[np.argsort(dist, kind="stable")[:k]]
    # and on the segment: collinear with, and between, its two ends
    for j in range(len(new)):
        a, c = x[s.base[j]], x[s.neighbour[j]]
        assert np.linalg.norm(new[j] - a) + np.linalg.norm(c - new[j]) == pytest.approx(np.linalg.norm(c - a))


def test_smote_is_seeded():
    x, y = _imbalanced()
    a, b = splits.smote(x, y, seed=3), splits.smote(x, y, seed=3)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, splits.smote(x, y, seed=4).x)


def test_smote_leaves_a_balanced_set_alone():
    x = np.arange(12, dtype=float).reshape(6, 2)
    s = splits.smote(x, np.array([0, 1, 0, 1, 0, 1]), k=5)  # nothing to synthesise, so k > class size is fine
    assert np.array_equal(s.x, x) and len(s.base) == 0


def test_smote_after_the_split_leaves_the_test_rows_untouched():
    x, y = _imbalanced()
    tr, te = splits.stratified_split(y, 0.3, seed=0)
    out = splits.split_and_smote(x, y, test_fraction=0.3, seed=0)
    assert np.array_equal(out.x_test, x[te]) and np.array_equal(out.y_test, y[te])
    assert not out.synthetic_test.any()
    assert np.bincount(out.y_train).tolist() == [np.bincount(y[tr]).max()] * 3
    # every synthetic training row is built from training rows only
    s = splits.smote(x[tr], y[tr], seed=0)
    assert np.array_equal(out.x_train, s.x)


def test_smote_before_the_split_puts_synthetic_rows_into_the_test_set():
    x, y = _imbalanced()
    _, te = splits.stratified_split(y, 0.3, seed=0)
    out = splits.split_and_smote(x, y, test_fraction=0.3, seed=0, smote_before_split=True)
    assert out.synthetic_test.any() and out.synthetic_train.any()
    assert len(out.x_test) != len(te) or not np.array_equal(out.x_test, x[te])
    # the test set is class-balanced, not the data's 60/15/9 mix
    assert np.bincount(out.y_test).tolist() == [18, 18, 18]
    # and its synthetic rows interpolate rows that are also (as originals) in training
    whole = splits.smote(x, y, seed=0)
    test_syn = {tuple(r) for r in out.x_test[out.synthetic_test]}
    used = [b for j, b in enumerate(whole.base) if tuple(whole.x[whole.n_original + j]) in test_syn]
    train_orig = {tuple(r) for r in out.x_train[~out.synthetic_train]}
    assert any(tuple(x[b]) in train_orig for b in used)


def test_smote_errors():
    x, y = _imbalanced()
    with pytest.raises(DataError, match="more than 9 rows of class 2"):
        splits.smote(x, y, k=9)
    bad = x.copy()
    bad[4, 1] = np.nan
    with pytest.raises(DataError, match=r"NaN/inf.*row 4, column 1"):
        splits.smote(bad, y)
    with pytest.raises(DataError, match="one label per row"):
        splits.smote(x, y[:-1])
    with pytest.raises(DataError, match="2-D"):
        splits.smote(x[:, 0], y)
    with pytest.raises(ConfigError, match="at least 1"):
        splits.smote(x, y, k=0)
    with pytest.raises(ConfigError, match="test_fraction"):
        splits.split_and_smote(x, y, test_fraction=1.5)
