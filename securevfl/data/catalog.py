"""The built-in datasets by name, and their columns, without building them.

:data:`DATASETS` maps a dataset name to its builder (:mod:`securevfl.data.datasets`,
with scikit-learn and pandas), registered by path and imported only where a
dataset is materialized; plugins register more. :func:`feature_columns` gives a
built-in dataset's column names from what is known of it statically, so a
protocol's column selections are checked at load without importing either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from securevfl.config import DatasetSpec, SyntheticParams
from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.data.datasets import DatasetBuilder

DATASETS: Registry[DatasetBuilder] = Registry("dataset")
DATASETS.add_path("digits", "securevfl.data.datasets:digits")
DATASETS.add_path("breast_cancer", "securevfl.data.datasets:breast_cancer")
DATASETS.add_path("diabetes", "securevfl.data.datasets:diabetes")
DATASETS.add_path("synthetic", "securevfl.data.datasets:synthetic")

#: scikit-learn's breast cancer feature names, spaces as underscores: the builder's
#: columns, in its order (tests/unit/test_datasets.py compares them with scikit-learn's)
BREAST_CANCER_COLUMNS: tuple[str, ...] = (
    "mean_radius",
    "mean_texture",
    "mean_perimeter",
    "mean_area",
    "mean_smoothness",
    "mean_compactness",
    "mean_concavity",
    "mean_concave_points",
    "mean_symmetry",
    "mean_fractal_dimension",
    "radius_error",
    "texture_error",
    "perimeter_error",
    "area_error",
    "smoothness_error",
    "compactness_error",
    "concavity_error",
    "concave_points_error",
    "symmetry_error",
    "fractal_dimension_error",
    "worst_radius",
    "worst_texture",
    "worst_perimeter",
    "worst_area",
    "worst_smoothness",
    "worst_compactness",
    "worst_concavity",
    "worst_concave_points",
    "worst_symmetry",
    "worst_fractal_dimension",
)


def feature_columns(name: str, spec: DatasetSpec) -> list[str] | None:
    """Column names of a built-in dataset without building it, where that is static
    (used to validate column selections at load time); None if unknown."""
    if name == "digits":
        return [f"px_{r}_{c}" for r in range(8) for c in range(8)]
    if name == "synthetic":
        p = spec.synthetic or SyntheticParams()
        return [f"f{i}" for i in range(p.features)]
    if name == "diabetes":
        return ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
    if name == "breast_cancer":
        return list(BREAST_CANCER_COLUMNS)
    return None
