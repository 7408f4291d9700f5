"""Which feature columns each party holds, as pure functions of the protocol
and a dataset's column names: the parties in order (:func:`party_layouts`), a
column selection resolved (:func:`select_columns`), the whole partition checked
for overlaps (:func:`resolve_partition`), a ``preprocess.standardize`` list
checked against them (:func:`check_standardize`), and contiguous blocks from ratios as
HashVFL's code cuts them (:func:`block_sizes`, docs/methods/hashvfl.md §3.1).
Used at load to check a protocol, before any data is read; materializing the
per-party files is :mod:`securevfl.data.partition`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from securevfl.config import ColumnSelect, PartySpec, PreprocessSpec, Protocol
from securevfl.errors import ConfigError


def block_sizes(n: int, ratios: Sequence[float]) -> list[int]:
    """Sizes of contiguous blocks of ``n`` columns: round(n * r) (Python's
    round, half to even) for every ratio but the last, the remainder for the
    last (the official ``feature_distribute``). Every block must get at least one
    column."""
    if not ratios:
        raise ConfigError("ratios must not be empty")
    if any(not r > 0 for r in ratios):
        raise ConfigError(f"ratios must be positive, got {list(ratios)}")
    if abs(sum(ratios) - 1) > 1e-6:
        raise ConfigError(f"ratios must sum to 1, got {list(ratios)} (sum {sum(ratios):g})")
    head = [round(n * r) for r in ratios[:-1]]
    sizes = [*head, n - sum(head)]
    if any(s < 1 for s in sizes):
        raise ConfigError(f"{n} columns at ratios {list(ratios)} leave a party without columns: {sizes}")
    return sizes


def contiguous_blocks(n: int, ratios: Sequence[float]) -> list[tuple[int, int]]:
    """[start, stop) of each party's contiguous block of ``n`` columns (see
    :func:`block_sizes`): 95 at [0.5, 0.5] -> (0, 48), (48, 95)."""
    out: list[tuple[int, int]] = []
    start = 0
    for size in block_sizes(n, ratios):
        out.append((start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class PartyLayout:
    name: str
    is_active: bool
    spec: PartySpec
    path: str  # YAML path of this party's spec, for error messages


def party_layouts(proto: Protocol) -> list[PartyLayout]:
    """Active party first, then passive parties in file order."""
    out = [PartyLayout(proto.parties.active.name, True, proto.parties.active, "parties.active")]
    for i, p in enumerate(proto.parties.passive):
        out.append(PartyLayout(p.name, False, p, f"parties.passive[{i}]"))
    return out


def select_columns(all_cols: list[str], sel: ColumnSelect, *, path: str) -> list[str]:
    """Resolve a ColumnSelect against a dataset's feature columns, keeping dataset
    order. Empty or unknown selections are errors naming the YAML path."""
    if sel.names is not None:
        missing = [c for c in sel.names if c not in all_cols]
        if missing:
            raise ConfigError(f"unknown columns {missing[:5]}", path=f"{path}.columns.names")
        chosen = set(sel.names)
        cols = [c for c in all_cols if c in chosen]
    elif sel.glob is not None:
        cols = [c for c in all_cols if fnmatch.fnmatchcase(c, sel.glob)]
    elif sel.block is not None:
        try:
            start, stop = contiguous_blocks(len(all_cols), sel.block.ratios)[sel.block.part]
        except ConfigError as exc:
            raise ConfigError(str(exc), path=f"{path}.columns.block") from exc
        cols = all_cols[start:stop]
    else:
        start, stop = sel.index  # type: ignore[misc]
        if stop > len(all_cols):
            raise ConfigError(
                f"index [{start}, {stop}) exceeds the {len(all_cols)} feature columns",
                path=f"{path}.columns.index",
            )
        cols = all_cols[start:stop]
    if not cols:
        raise ConfigError("column selection matches no column", path=f"{path}.columns")
    return cols


def resolve_partition(proto: Protocol, all_cols: list[str]) -> dict[str, list[str]]:
    """Feature columns per party for a built-in dataset; disjointness is checked."""
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for lay in party_layouts(proto):
        if lay.spec.columns is None:
            out[lay.name] = []
            continue
        cols = select_columns(all_cols, lay.spec.columns, path=lay.path)
        for c in cols:
            if c in owner:
                raise ConfigError(
                    f"column '{c}' is given to both '{owner[c]}' and '{lay.name}'",
                    path=f"{lay.path}.columns",
                )
            owner[c] = lay.name
        out[lay.name] = cols
    return out


def check_standardize(
    spec: PreprocessSpec,
    party: str,
    columns: Sequence[str],
    *,
    path: str | None = None,
    source: str | None = None,
) -> None:
    """A ``preprocess.standardize`` list must name numeric feature columns of the
    party (``columns``: its feature columns; the categorical ones are not
    numeric). Checked at load where the protocol fixes the party's columns (a
    built-in dataset, or a CSV party's listed ``feature_columns``), else when its
    rank reads its file. The message names the columns the protocol lists, never
    another column of the party's."""
    if not isinstance(spec.standardize, list):
        return
    cats = set(spec.categorical.columns) if spec.categorical is not None else set()
    numeric = {c for c in columns if c not in cats}
    unknown = [c for c in spec.standardize if c not in numeric]
    if unknown:
        raise ConfigError(
            f"party '{party}': preprocess.standardize names {unknown[:5]}, which are not among its numeric "
            "feature columns",
            path=None if path is None else f"{path}.preprocess.standardize",
            source=source,
        )
