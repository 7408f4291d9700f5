"""Vertical-split and data-preparation rules of HashVFL's experiments (docs/methods/hashvfl.md
§3.1, §3.2, §4, §8.1 "Data and split utilities", §8.2 item 12), as pure functions.

* :func:`feature_ratios`: the official code's party ratios, round(1/N, 2) for the
  first N - 1 parties and the remainder for the last (N = 3: 0.33/0.33/0.34,
  where the paper's text says 30/30/40).
* :func:`block_sizes` / :func:`contiguous_blocks` (:mod:`securevfl.data.columns`):
  contiguous column blocks from ratios with Python's ``round`` (half to even), as
  the code's ``feature_distribute``: 95 columns at 0.5 give 48/47, 25 give 12/13.
* :func:`image_column_widths` / :func:`image_columns`: images cut into vertical
  strips of whole columns (28 -> 14/14, 32 -> 16/16, 48 -> 24/24), as index lists
  into row-major flattened (C x) H x W images.
* :func:`text_slices`: party k gets the character slice text[160k : 160(k+1)].
* :func:`smote` and :func:`split_and_smote`: SMOTE oversampling (Chawla et al.
  2002), applied to the training rows after the train/test split by default; the
  official code's order (SMOTE on the whole set, then the split) is a flag,
  because it puts synthetic neighbours of training rows into the test set
  (docs/methods/hashvfl.md §7 item 8).

SMOTE is a *centralised* preparation step, not a protocol option: a synthetic
row interpolates a minority row and one of its nearest minority neighbours in
the full feature space, and in a vertical split no party holds that space. Each
party would have to use the same (row, neighbour, u) triples, chosen from
distances only the union of all parties' columns defines; run per party on its
own columns, the parties would synthesise different, unaligned rows. It is
therefore meaningful only where one holder sees every column before the data is
partitioned, as in the paper's simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.model_selection import train_test_split

from securevfl.data.columns import block_sizes as block_sizes
from securevfl.data.columns import contiguous_blocks as contiguous_blocks
from securevfl.errors import ConfigError, DataError

# -- column splits (docs/methods/hashvfl.md §3.1, §4) --------------------------------------------------------


def feature_ratios(parties: int) -> list[float]:
    """The official code's feature ratios for N parties: round(1/N, 2) each for
    the first N - 1, the remainder (rounded to 2 decimals) for the last."""
    if parties < 1:
        raise ConfigError(f"need at least one party, got {parties}")
    head = [round(1 / parties, 2)] * (parties - 1)
    return [*head, round(1 - sum(head), 2)]


def image_column_widths(width: int, parties: int = 2) -> list[int]:
    """Widths of the vertical strips an image of ``width`` columns is cut into:
    equal halves at the centre line for two parties (docs/methods/hashvfl.md §4: 28 -> 14/14,
    32 -> 16/16, 48 -> 24/24). For more parties the paper gives no rule; we use
    the code's feature ratios (:func:`block_sizes` at :func:`feature_ratios`)."""
    return block_sizes(width, feature_ratios(parties))


def image_columns(height: int, width: int, parties: int = 2, channels: int = 1) -> list[list[int]]:
    """Per party, the indices into a flattened channels x height x width image
    (row-major, as ``x.reshape(-1)``) of its strip of whole columns."""
    if height < 1 or channels < 1:
        raise ConfigError(f"image shape must be positive, got {channels} x {height} x {width}")
    out = []
    start = 0
    for w in image_column_widths(width, parties):
        cols = range(start, start + w)
        out.append(
            [(ch * height + r) * width + c for ch in range(channels) for r in range(height) for c in cols]
        )
        start += w
    return out


def text_slices(text: str, parties: int = 2, width: int = 160) -> list[str]:
    """Party k's share of a raw text: the character slice text[width k : width (k+1)]
    (the official IMDb split, docs/methods/hashvfl.md §3.2; each slice is tokenised separately).
    A short text leaves the later parties empty strings."""
    if parties < 1 or width < 1:
        raise ConfigError(f"need parties >= 1 and width >= 1, got {parties} and {width}")
    return [text[width * k : width * (k + 1)] for k in range(parties)]


# -- SMOTE (docs/methods/hashvfl.md §4, §7 item 8) -----------------------------------------------------------


@dataclass(frozen=True)
class Smoted:
    """The oversampled set: the input rows first, then the synthetic ones.

    For synthetic row j (row ``n_original + j`` of ``x``): it is
    ``x[base[j]] + gap[j] * (x[neighbour[j]] - x[base[j]])``, with ``base`` and
    ``neighbour`` indices of original rows of the same class."""

    x: np.ndarray
    y: np.ndarray
    n_original: int
    base: np.ndarray
    neighbour: np.ndarray
    gap: np.ndarray

    @property
    def synthetic(self) -> np.ndarray:
        """Boolean mask of the synthetic rows of ``x``."""
        mask = np.zeros(len(self.x), dtype=bool)
        mask[self.n_original :] = True
        return mask


def _check_xy(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2:
        raise DataError(f"SMOTE needs a 2-D feature matrix, got shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"SMOTE needs one label per row: {len(x)} rows, labels of shape {y.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"SMOTE interpolates numeric features, got dtype {x.dtype}")
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise DataError(
            f"SMOTE needs finite features; {int(bad.sum())} NaN/inf values (first at row {row}, column {col})"
        )
    return x, y


def _nearest(points: np.ndarray, k: int, chunk: int = 1024) -> np.ndarray:
    """Indices of each row's k nearest other rows (Euclidean; ties by index),
    computed in chunks so that memory stays O(chunk x n)."""
    sq = (points**2).sum(1)
    out = np.empty((len(points), k), dtype=np.int64)
    for s in range(0, len(points), chunk):
        block = points[s : s + chunk]
        d2 = sq[s : s + chunk, None] + sq[None, :] - 2 * block @ points.T
        d2[np.arange(len(block)), np.arange(s, s + len(block))] = np.inf  # not its own neighbour
        out[s : s + chunk] = np.argsort(d2, axis=1, kind="stable")[:, :k]
    return out


def smote(x: np.ndarray, y: np.ndarray, *, k: int = 5, seed: int = 0) -> Smoted:
    """Oversample every class below the majority count up to it with SMOTE.

    For each synthetic row of class c: a row of class c drawn uniformly (with
    replacement), one of its ``k`` nearest class-c neighbours drawn uniformly, and
    a point at u ~ U(0, 1) of the way from the row to the neighbour. Seeded by
    ``seed`` (numpy's PCG64); classes are processed in sorted order. A class that
    needs synthetic rows must have more than ``k`` rows."""
    if k < 1:
        raise ConfigError(f"SMOTE's k must be at least 1, got {k}")
    x, y = _check_xy(x, y)
    if len(x) == 0:
        raise DataError("SMOTE got no rows")
    xf = x.astype(np.float64)
    classes, counts = np.unique(y, return_counts=True)
    target = int(counts.max())
    rng = np.random.default_rng(seed)
    bases, neighbours, gaps = [], [], []
    for c, n_c in zip(classes, counts, strict=True):
        need = target - int(n_c)
        if need == 0:
            continue
        if k >= n_c:
            label = c.item() if isinstance(c, np.generic) else c
            raise DataError(
                f"SMOTE with k={k} needs more than {k} rows of class {label!r} to oversample it, it has {n_c}"
            )
        members = np.flatnonzero(y == c)
        nn = _nearest(xf[members], k)
        pick = rng.integers(0, n_c, size=need)
        which = rng.integers(0, k, size=need)
        bases.append(members[pick])
        neighbours.append(members[nn[pick, which]])
        gaps.append(rng.random(need))
    if not bases:
        empty = np.zeros(0, dtype=np.int64)
        return Smoted(x.copy(), y.copy(), len(x), empty, empty, np.zeros(0))
    base = np.concatenate(bases)
    neigh = np.concatenate(neighbours)
    gap = np.concatenate(gaps)
    new = xf[base] + gap[:, None] * (xf[neigh] - xf[base])
    out_x = np.concatenate([xf, new]).astype(np.result_type(x.dtype, np.float32), copy=False)
    return Smoted(out_x, np.concatenate([y, y[base]]), len(x), base, neigh, gap)


@dataclass(frozen=True)
class SplitData:
    """Train and test rows, and which of them SMOTE synthesised."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    synthetic_train: np.ndarray
    synthetic_test: np.ndarray


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices of a stratified split (scikit-learn's
    ``train_test_split(stratify=y)``, as the official code's 70/30 split)."""
    if not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction}")
    idx = np.arange(len(y))
    try:
        tr, te = train_test_split(idx, test_size=test_fraction, stratify=y, random_state=seed % (2**32))
    except ValueError as exc:  # e.g. a class with one row
        raise DataError(f"stratified split impossible: {exc}") from exc
    return np.sort(tr), np.sort(te)


def split_and_smote(
    x: np.ndarray,
    y: np.ndarray,
    *,
    test_fraction: float = 0.3,
    seed: int = 0,
    k: int = 5,
    smote_before_split: bool = False,
) -> SplitData:
    """A stratified train/test split and SMOTE, in the sound order by default:
    split first, then oversample the training rows only, so the test rows are
    exactly the original rows of the plain split (docs/methods/hashvfl.md §8.1).

    ``smote_before_split=True`` is the official code's order (docs/methods/hashvfl.md §4): SMOTE
    on the whole set, then the split of the enlarged set, so the test set holds
    synthetic rows interpolated from training rows (a leak, docs/methods/hashvfl.md §7 item 8)
    and is class-balanced rather than of the data's own class mix."""
    x, y = _check_xy(x, y)
    if smote_before_split:
        s = smote(x, y, k=k, seed=seed)
        tr, te = stratified_split(s.y, test_fraction, seed)
        mask = s.synthetic
        return SplitData(s.x[tr], s.y[tr], s.x[te], s.y[te], mask[tr], mask[te])
    tr, te = stratified_split(y, test_fraction, seed)
    s = smote(x[tr], y[tr], k=k, seed=seed)
    return SplitData(s.x, s.y, x[te], y[te], s.synthetic, np.zeros(len(te), dtype=bool))
