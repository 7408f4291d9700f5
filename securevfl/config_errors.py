"""Errors with YAML paths: a pydantic validation error as a
:class:`~securevfl.errors.ConfigError` naming the offending field the way the
protocol file spells it (``parties.passive[1].model.out``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from securevfl.errors import ConfigError


def format_loc(loc: tuple[Any, ...]) -> str:
    """('parties', 'passive', 0, 'model') -> 'parties.passive[0].model'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def _explain(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required field is missing"
    got = err.get("input")
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if isinstance(got, (str, int, float, bool)) or got is None:
        return f"{msg} (got {got!r})"
    return msg


def validation_error(exc: ValidationError, *, prefix: str = "", source: str | None = None) -> ConfigError:
    """Turn a pydantic error into a ConfigError naming the first bad YAML path and
    listing the rest."""
    errs = exc.errors()
    lines = []
    for e in errs:
        path = format_loc(tuple(e["loc"]))
        if prefix:
            path = prefix if path == "<root>" else f"{prefix}.{path}"
        lines.append((path, _explain(e)))
    first_path, first_msg = lines[0]
    more = "".join(f"; also at '{p}': {m}" for p, m in lines[1:5])
    return ConfigError(first_msg + more, path=first_path, source=source)
