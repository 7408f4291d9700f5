"""Parameter grids for ``securevfl compare --grid KEY=v1,v2,...``.

A grid axis names one protocol field the way ``--set`` does (dotted keys, list
indices such as ``parties.active.defenses[0].params.epsilon``, ``[*]`` for every
element of a list, so ``parties.passive[*].defenses[0].params.epsilon`` varies
every passive party's at once; the key is parsed by
:func:`securevfl.app.loader.split_override`, so both flags accept the same keys)
and lists its values, each read as YAML. A protocol with axes expands into the
product of their values, one grid point per combination, in the order the axes
and values were given.

**A protocol without the key.** A grid axis whose key goes through a list
element a protocol does not have (``parties.active.defenses[0].params.epsilon``
for a protocol with no defense) does not apply to it (:func:`missing_element`):
that protocol is expanded by the other axes only, and one that no axis applies
to runs once, as the comparison's reference row (the undefended protocol a
defense's sweep is measured against). A mapping key on the way may be missing
(an override creates it: a grid over ``training.lr`` applies to a file that
leaves the learning rate at its default), and an axis no compared protocol has
is refused when the points are loaded, as before.

Checks made here, before anything runs: the values of one axis are of one kind
(numbers, strings, booleans, lists or mappings; ``null`` goes with any kind) and of
the kind the protocol file already holds at that key; a list index must exist.
Unknown keys and values the schema refuses are refused when each point is
loaded (:func:`securevfl.app.loader.load_protocol_dict`), with the key's path.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

import yaml

from securevfl.app.loader import EVERY, apply_override, split_override
from securevfl.app.yamldoc import parse_value
from securevfl.errors import ConfigError

#: keys a grid may not vary: the seed is what ``--seeds`` varies, the name labels the runs
RESERVED: dict[tuple[str | int, ...], str] = {
    ("training", "seed"): "vary seeds with --seeds (or `seeds:` in a comparison file)",
    ("name",): "the name labels the runs",
}


@dataclass(frozen=True)
class Axis:
    """One grid key (``key`` as written, ``path`` parsed) and its values."""

    key: str
    path: tuple[str | int, ...]
    values: tuple[Any, ...]

    @property
    def short(self) -> str:
        """The key's last field name (``epsilon`` for ``...params.epsilon``)."""
        names = [p for p in self.path if isinstance(p, str) and p != EVERY]
        return names[-1] if names else self.key


def split_values(raw: str) -> list[str]:
    """Split ``v1,v2,...`` at the commas outside brackets, braces and quotes, so a
    value may itself be a YAML list (``[16,8],[32]``) or a quoted string."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return [v.strip() for v in out]


def kind(value: Any) -> str | None:
    """The kind a grid checks values by (None for null, which fits any kind)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def parse_axis(expr: str) -> Axis:
    """``KEY=v1,v2,...`` -> :class:`Axis`; refuses an empty or repeated value, mixed
    kinds, and the reserved keys (:data:`RESERVED`)."""
    _, key, raw = split_override(expr, flag="--grid")
    texts = split_values(raw)
    if any(not t for t in texts):
        raise ConfigError(f"grid axis '{expr}' has an empty value", path=key)
    values = [parse_value(t, path=key, what=f"grid value '{t}'") for t in texts]
    return make_axis(key, values)


def make_axis(key: str, values: list[Any]) -> Axis:
    """An axis from a key (as ``--set`` writes it) and already parsed values (a
    comparison file's ``grid:`` mapping gives them so)."""
    path, key, _ = split_override(f"{key}=", flag="--grid")
    why = RESERVED.get(tuple(path))
    if why:
        raise ConfigError(f"a grid cannot vary '{key}': {why}", path=key)
    if not values:
        raise ConfigError("a grid axis needs at least one value", path=key)
    shown = ",".join(show_value(v) for v in values)
    kinds = {k for v in values if (k := kind(v)) is not None}
    if len(kinds) > 1:
        raise ConfigError(f"grid values mix kinds ({', '.join(sorted(kinds))}): {shown}", path=key)
    if len({yaml.safe_dump(v) for v in values}) != len(values):
        raise ConfigError(f"grid values repeat: {shown}", path=key)
    return Axis(key, tuple(path), tuple(values))


def current(doc: Any, path: tuple[str | int, ...]) -> list[Any]:
    """The values a protocol document holds at ``path``: none when it holds none
    there, one per list element under :data:`~securevfl.app.loader.EVERY`."""
    nodes = [doc]
    for part in path:
        found = []
        for node in nodes:
            if part == EVERY:
                found += node if isinstance(node, list) else []
            elif isinstance(part, int):
                if isinstance(node, list) and part < len(node):
                    found.append(node[part])
            elif isinstance(node, dict) and part in node:
                found.append(node[part])
        nodes = found
    return nodes


def missing_element(doc: Any, path: tuple[str | int, ...]) -> str | None:
    """The first list element ``path`` goes through that ``doc`` lacks, as written
    in a key (``parties.active.defenses[0]``; ``[*]`` over a missing or empty
    list), or None when the path reaches: a mapping key on the way may be missing,
    since an override creates it."""
    nodes, shown = [doc], ""
    for part in path:
        if isinstance(part, int) or part == EVERY:
            shown += f"[{part}]" if isinstance(part, int) else EVERY
            found = []
            for node in nodes:
                if not isinstance(node, list) or not node:
                    return shown
                if isinstance(part, int):
                    if part >= len(node):
                        return shown
                    found.append(node[part])
                else:
                    found += node
            nodes = found
        else:
            shown += ("." if shown else "") + part
            nodes = [n.get(part, {}) if isinstance(n, dict) else n for n in nodes]
    return None


def check_axis(doc: dict[str, Any], axis: Axis, *, source: str | None = None) -> None:
    """The axis's values are of the kind the document holds at its key (when it
    holds one): a grid of strings over a number is refused before anything runs."""
    for value in current(doc, axis.path):
        have = kind(value)
        for v in axis.values:
            k = kind(v)
            if have is not None and k is not None and k != have:
                raise ConfigError(
                    f"grid value {v!r} is a {k}, the protocol holds a {have} ({value!r}) here",
                    path=axis.key,
                    source=source,
                )


def points(axes: list[Axis]) -> list[tuple[tuple[Axis, Any], ...]]:
    """Every combination of the axes' values (one point with no axes)."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"a grid key is given twice: {keys}", path="--grid")
    return [tuple(zip(axes, combo, strict=True)) for combo in itertools.product(*(a.values for a in axes))]


def apply_point(doc: dict[str, Any], point: tuple[tuple[Axis, Any], ...]) -> dict[str, Any]:
    """A copy of ``doc`` with the point's values set."""
    out = copy.deepcopy(doc)
    for axis, value in point:
        apply_override(out, list(axis.path), value)
    return out


def show_value(value: Any) -> str:
    """A grid value as written in labels and folder names."""
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


def point_label(point: tuple[tuple[Axis, Any], ...]) -> str:
    """``epsilon=0.5,lr=0.01``: each axis by its last field name, or by its whole
    key where two axes share a last name."""
    shorts = [a.short for a, _ in point]
    return ",".join(f"{a.short if shorts.count(a.short) == 1 else a.key}={show_value(v)}" for a, v in point)
