"""An embedding-bag bottom model over categorical columns (a model factory).

Each feature column is a categorical field whose value is an integer code; the
model looks up one learned vector per (column, code) pair and averages a row's
vectors (``torch.nn.EmbeddingBag``, one bag per row), then maps the average to
``out`` columns. This is the usual first layer of a click-through-rate model over
hashed or dictionary-coded fields. Named in a protocol file as::

    model: {factory: "embedding_bag:bottom", params: {levels: 17, scale: 16}, out: 16}

A party's features arrive as float32 rows; a column's code is
``round(value * scale)``, clamped to ``0 .. levels - 1``. For integer-coded
columns use ``scale: 1``. In examples/plugins the codes are the built-in
``digits`` dataset's pixel intensities (0..16, which the dataset scales to [0, 1],
hence ``scale: 16``): each pixel is a field with 17 levels.

``per_category`` is the same idea over a CSV party's one-hot preprocessed
categorical columns: it declares ``layout``, so securevfl passes it the party's
:class:`~securevfl.plugins.FeatureLayout`, and it builds one ``nn.Embedding``
per categorical column from the column's one-hot block (docs/extending.md,
"What a factory receives").
"""

from __future__ import annotations

import torch
from torch import nn

from securevfl.plugins import FeatureLayout


def codes(x: torch.Tensor, levels: int, scale: float) -> torch.Tensor:
    """Token ids of a batch: column ``j``'s code ``c`` becomes ``j * levels + c``."""
    c = torch.round(x * scale).long().clamp(0, levels - 1)
    return c + torch.arange(x.shape[1], device=x.device) * levels


class EmbeddingBagBottom(nn.Module):
    def __init__(self, in_features: int, out: int, levels: int, scale: float, dim: int):
        super().__init__()
        self.levels, self.scale = levels, scale
        self.bag = nn.EmbeddingBag(in_features * levels, dim, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(dim, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(codes(x, self.levels, self.scale)))


def bottom(in_features: int, out: int, *, levels: int = 17, scale: float = 1.0, dim: int = 32) -> nn.Module:
    """The factory: an :class:`EmbeddingBagBottom` with ``levels`` codes per column."""
    return EmbeddingBagBottom(in_features, out, levels, scale, dim)


class PerCategoryEmbedding(nn.Module):
    """One learned embedding per categorical column, over one-hot preprocessed
    input: each categorical column's one-hot block (``layout.categorical``)
    becomes the index of its 1 (``argmax``), looked up in that column's own
    ``nn.Embedding``; the vectors are concatenated with the remaining (numeric)
    columns and mapped to ``out`` columns. A block with no 1 (a category unseen
    in training, when the column has no "other" bucket) gets the extra row
    ``cardinality`` of its table, so it never poses as the first category."""

    numeric: torch.Tensor  # the indices of the columns outside every block (a buffer)

    def __init__(self, layout: FeatureLayout, out: int, dim: int, hidden: int):
        super().__init__()
        self.blocks = [(b.start, b.stop) for b in layout.categorical]
        self.register_buffer("numeric", torch.tensor(layout.numeric, dtype=torch.long), persistent=False)
        self.tables = nn.ModuleList(nn.Embedding(b.cardinality + 1, dim) for b in layout.categorical)
        width = len(layout.numeric) + dim * len(self.tables)
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, self.numeric]]
        for (start, stop), table in zip(self.blocks, self.tables, strict=True):
            block = x[:, start:stop]
            empty = block.max(dim=1).values <= 0
            index = torch.where(empty, stop - start, block.argmax(dim=1))
            parts.append(table(index))
        return self.head(torch.cat(parts, dim=1))


def per_category(
    in_features: int, out: int, *, layout: FeatureLayout, dim: int = 4, hidden: int = 32
) -> nn.Module:
    """The factory: securevfl passes the party's ``layout`` because this
    signature declares it. Named in a protocol file as::

        model: {factory: "embedding_bag:per_category", params: {dim: 4}, out: 8}

    for a party whose ``preprocess`` entry declares categorical columns."""
    if layout.width != in_features:
        raise ValueError(f"a layout of {layout.width} columns for {in_features} inputs")
    return PerCategoryEmbedding(layout, out, dim, hidden)
