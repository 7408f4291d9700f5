"""Built-in datasets, generated offline: ``digits``, ``breast_cancer``, ``diabetes``, ``synthetic``.

A built-in dataset is a :class:`Table` (IDs, named feature columns, labels). It is
only ever materialized into per-party CSV files (see :mod:`securevfl.data.partition`);
party processes read their own file and nothing else. The builders are
registered by path in :data:`securevfl.data.catalog.DATASETS`, which also knows
their columns without building them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, make_classification

from securevfl.config import DatasetSpec, SyntheticParams


@dataclass(frozen=True)
class Table:
    """A whole (centralized) dataset; exists only in the materializing process."""

    ids: list[str]
    features: pd.DataFrame
    labels: np.ndarray
    standardize: bool  # the dataset's default for party-side z-scoring


DatasetBuilder = Callable[[DatasetSpec, int], Table]


def _ids(n: int) -> list[str]:
    return [f"r{i:06d}" for i in range(n)]


def digits(spec: DatasetSpec, seed: int) -> Table:
    """scikit-learn's 8x8 digits, pixels scaled to [0, 1]; columns ``px_R_C``.
    Split left/right with ``glob: "px_?_[0-3]"`` and ``"px_?_[4-7]"``."""
    d = load_digits()
    cols = [f"px_{r}_{c}" for r in range(8) for c in range(8)]
    x = pd.DataFrame((d.data / 16.0).astype(np.float32), columns=cols)
    return Table(_ids(len(x)), x, d.target.astype(np.int64), standardize=False)


def breast_cancer(spec: DatasetSpec, seed: int) -> Table:
    """scikit-learn's Wisconsin breast cancer set: 569 rows, 30 features, binary."""
    d = load_breast_cancer()
    cols = [str(c).replace(" ", "_") for c in d.feature_names]
    x = pd.DataFrame(d.data.astype(np.float64), columns=cols)
    return Table(_ids(len(x)), x, d.target.astype(np.int64), standardize=True)


def diabetes(spec: DatasetSpec, seed: int) -> Table:
    """scikit-learn's diabetes set (Efron et al. 2004): 442 rows, 10 numeric
    features, a continuous target (disease progression after one year, 25-346);
    a regression task (declare ``task: regression``: the target's values are whole
    numbers, so it would otherwise read as 214 classes)."""
    d = load_diabetes()
    x = pd.DataFrame(d.data.astype(np.float64), columns=list(d.feature_names))
    return Table(_ids(len(x)), x, d.target.astype(np.float64), standardize=True)


def synthetic(spec: DatasetSpec, seed: int) -> Table:
    """Gaussian-cluster classification rows (scikit-learn's make_classification),
    for scale tests: ``synthetic: {rows, features, classes, informative,
    label_noise}``; columns ``f0..``. ``label_noise`` is the share of rows whose
    label is drawn at random (scikit-learn's ``flip_y``): a model that fits those
    rows has memorised them, the set-up membership inference needs."""
    p = spec.synthetic or SyntheticParams()
    informative = p.informative or max(2, min(p.features, p.features // 2))
    x, y = make_classification(
        n_samples=p.rows,
        n_features=p.features,
        n_informative=informative,
        n_redundant=0,
        n_classes=p.classes,
        n_clusters_per_class=1,
        flip_y=p.label_noise,
        random_state=seed % (2**31),
    )
    cols = [f"f{i}" for i in range(p.features)]
    return Table(_ids(p.rows), pd.DataFrame(x, columns=cols), y.astype(np.int64), True)
