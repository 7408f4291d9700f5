"""What a party's bottom model receives: its input columns, in order, and where
each comes from (:class:`FeatureLayout`), derived from the party's fitted
preprocessing (docs/extending.md, "What a factory receives").

A party's model input is the matrix its preprocessing makes of its raw columns
(:mod:`securevfl.data.preprocess`; replayed from the saved parameters by
:mod:`securevfl.data.fitted`), then any feature selection of its defenses. Its
columns come in the fitted transformer's order of groups:

* numeric groups, in this order: ``log1p`` (imputed, then complete columns),
  ``signed_log1p`` (likewise), untransformed (likewise), each split again into
  standardized then unstandardized columns when ``standardize`` lists some
  columns; within a group the party's file order, then the missing-indicator
  columns of the group's columns that had missing values in the training rows;
* then the categorical columns, in the order ``preprocess.categorical.columns``
  lists them, each a block of one-hot columns: its categories in sorted order
  (``missing`` among them when the training rows had missing values), then,
  when it has one, the shared "other" column (rare and unseen categories).

Without a ``preprocess`` entry every column is numeric, in the file's (or the
dataset's) order, standardized when the run z-scored them.

Everything here is pure: the layout is a function of what is saved with the
party's model (:class:`~securevfl.parties.state.PreprocessState`), so training
and prediction build the same one. It names the party's own columns and
categories, so it is built and used in its owner's rank alone and sent nowhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from securevfl.data.fitted import CategoricalGroup, FittedTransform, NumericGroup
from securevfl.errors import DataError

InputKind = Literal["numeric", "missing_indicator", "category", "other", "derived"]
"""What an input column holds: a ``numeric`` column of the party's file
(transformed as its flags say); a ``missing_indicator`` (1 where its source was
missing, before any standardization); a one-hot ``category`` column of a
categorical column (1 where it holds ``category``); the ``other`` column of a
categorical column (1 for a rare or unseen category); or a ``derived`` column a
defense's feature selection made that preprocessing does not name."""


@dataclass(frozen=True)
class InputColumn:
    """One column of the model's input."""

    index: int  # its position in the input row
    name: str  # its name (the preprocessing's output name)
    kind: InputKind
    source: str | None  # the party's raw column it comes from (None: a derived column)
    category: str | None = None  # kind "category": the category it is 1 for
    log: Literal["log1p", "signed_log1p"] | None = None  # the log transform applied first
    standardized: bool = False  # z-scored with the training rows' mean and scale


@dataclass(frozen=True)
class CategoricalBlock:
    """The one-hot columns of one categorical column: input columns
    ``start .. stop - 1``. A row has at most one 1 in the block: none for a
    category unseen in training when the block has no "other" column."""

    column: str  # the party's raw categorical column
    start: int
    stop: int
    categories: tuple[str, ...]  # the categories of the block's columns, in order ("other" apart)
    has_other: bool  # the block's last column is the shared "other" bucket

    @property
    def cardinality(self) -> int:
        """The number of one-hot columns (the categories, plus "other" when it has one)."""
        return self.stop - self.start

    @property
    def columns(self) -> slice:
        """The block as a slice of the input columns, ``x[:, block.columns]``."""
        return slice(self.start, self.stop)


@dataclass(frozen=True)
class FeatureLayout:
    """A party's model input, column by column, and its categorical blocks.

    A bottom-model factory that declares a keyword parameter ``layout`` is
    called with it (``factory(in_features, out, *, layout, **params)``; one
    without it is called as before). It is built in the owner's rank alone,
    from its fitted preprocessing, the same at training and at prediction; it
    names the party's own columns and categories, so a factory keeps it in
    that rank: it is never sent, and a ``ConfigError`` a factory raises (which
    reaches the other parties) must not quote it."""

    party: str
    columns: tuple[InputColumn, ...]
    categorical: tuple[CategoricalBlock, ...]

    @property
    def width(self) -> int:
        """The number of input columns (``in_features``)."""
        return len(self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def numeric(self) -> tuple[int, ...]:
        """Indices of the input columns outside every categorical block."""
        inside = {j for b in self.categorical for j in range(b.start, b.stop)}
        return tuple(c.index for c in self.columns if c.index not in inside)

    def block(self, column: str) -> CategoricalBlock:
        """The block of the raw categorical ``column``."""
        for b in self.categorical:
            if b.column == column:
                return b
        raise KeyError(column)


def fitted_columns(fitted: FittedTransform) -> list[InputColumn]:
    """Every output column of a fitted transform, in its order (the party's
    preprocessing before any feature selection), named as ``fitted.outputs``."""
    out: list[tuple[InputKind, str, str | None, str | None, bool]] = []  # kind, source, category, log, std
    for g in fitted.groups:
        if isinstance(g, NumericGroup):
            std = g.scale is not None
            out += [("numeric", c, None, g.log, std) for c in g.columns]
            if g.impute is not None:
                out += [("missing_indicator", g.columns[j], None, None, std) for j in g.impute.indicator]
        else:
            out += _categorical_columns(g)
    if len(out) != len(fitted.outputs):
        raise DataError(
            f"its saved preprocessing describes {len(out)} columns but names {len(fitted.outputs)}"
        )
    return [
        InputColumn(i, name, kind, source, category, log, std)  # type: ignore[arg-type]
        for i, (name, (kind, source, category, log, std)) in enumerate(zip(fitted.outputs, out, strict=True))
    ]


def _categorical_columns(g: CategoricalGroup) -> list[tuple[InputKind, str, str | None, str | None, bool]]:
    out: list[tuple[InputKind, str, str | None, str | None, bool]] = []
    for c, cats, rare in zip(g.columns, g.categories, g.infrequent, strict=True):
        rare_set = set(rare or [])
        out += [("category", c, v, None, False) for v in cats if v not in rare_set]
        if rare_set:
            out.append(("other", c, None, None, False))
    return out


def categorical_blocks(columns: Sequence[InputColumn]) -> tuple[CategoricalBlock, ...]:
    """The one-hot blocks of ``columns``: each maximal run of ``category`` and
    ``other`` columns of one source. A source whose one-hot columns a feature
    selection split into several runs gets no block (its columns stay described
    one by one)."""
    runs: list[list[InputColumn]] = []
    for c in columns:
        if c.kind not in ("category", "other"):
            continue
        if runs and runs[-1][-1].source == c.source and runs[-1][-1].index == c.index - 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    split = {r[0].source for r in runs if sum(1 for s in runs if s[0].source == r[0].source) > 1}
    return tuple(
        CategoricalBlock(
            column=str(r[0].source),
            start=r[0].index,
            stop=r[-1].index + 1,
            categories=tuple(str(c.category) for c in r if c.kind == "category"),
            has_other=r[-1].kind == "other",
        )
        for r in runs
        if r[0].source not in split
    )


def select_columns(party: str, full: Sequence[InputColumn], names: Sequence[str]) -> FeatureLayout:
    """The layout of the input columns ``names`` (the model's inputs, after any
    feature selection), described from the preprocessing's columns ``full``; a
    name the preprocessing does not make is a ``derived`` column."""
    by_name = {c.name: c for c in full}
    cols = []
    for i, n in enumerate(names):
        c = by_name.get(n)
        cols.append(
            InputColumn(i, n, "derived", None)
            if c is None
            else InputColumn(i, n, c.kind, c.source, c.category, c.log, c.standardized)
        )
    return FeatureLayout(party, tuple(cols), categorical_blocks(cols))


def plain_layout(party: str, names: Sequence[str], *, standardized: bool) -> FeatureLayout:
    """The layout of a party without a ``preprocess`` entry: its numeric
    columns as they are, z-scored or not."""
    cols = tuple(InputColumn(i, n, "numeric", n, standardized=standardized) for i, n in enumerate(names))
    return FeatureLayout(party, cols, ())


def feature_layout(
    party: str, columns: Sequence[str], fitted: FittedTransform | None, *, standardized: bool
) -> FeatureLayout:
    """A party's :class:`FeatureLayout`: its model input ``columns`` described
    from its fitted preprocessing ``fitted`` (``standardized``: whether a party
    without one z-scored its columns)."""
    if fitted is None:
        return plain_layout(party, columns, standardized=standardized)
    try:
        full = fitted_columns(fitted)
    except DataError as exc:
        raise DataError(f"party '{party}': {exc}") from None
    return select_columns(party, full, columns)
