"""The Python API's arguments: each checked once, a wrong type the caller's
:class:`~securevfl.errors.ConfigError` naming the argument (not a TypeError from
deep inside a run)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from securevfl.app.loader import override_expr
from securevfl.errors import ConfigError

#: Overrides, as ``--set`` takes them: ``{"training.epochs": 3}`` (values as Python
#: objects) or ``["training.epochs=3"]`` (values as YAML text).
Overrides = Mapping[str, Any] | Sequence[str]


def kind_of(value: object) -> str:
    return type(value).__name__


#: what a file system allows where it does not say (Linux's NAME_MAX and PATH_MAX)
NAME_MAX, PATH_MAX = 255, 4096


def _limit(path: Path, which: str, default: int) -> int:
    """``pathconf``'s limit for the nearest existing folder of ``path``."""
    for folder in (path.absolute(), *path.absolute().parents):
        try:
            if folder.is_dir():
                return os.pathconf(folder, which)
        except (OSError, ValueError):
            break
    return default


def check_path_fits(path: Path, name: str) -> None:
    """Refuse a path its file system cannot hold (a name longer than ``NAME_MAX``
    bytes, the whole longer than ``PATH_MAX``) with a ConfigError naming the
    argument, not a raw "File name too long" from deep inside a run."""
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)), default="")
    name_max = _limit(path, "PC_NAME_MAX", NAME_MAX)
    if len(os.fsencode(longest)) > name_max:
        raise ConfigError(
            f"the path holds a name of {len(os.fsencode(longest))} bytes ({longest[:40]}...); its file "
            f"system allows names of at most {name_max} bytes: choose a shorter path",
            path=name,
        )
    whole = len(os.fsencode(str(path.absolute())))
    path_max = _limit(path, "PC_PATH_MAX", PATH_MAX)
    if whole >= path_max:
        raise ConfigError(
            f"the path is {whole} bytes long ({str(path)[:40]}...); its file system allows at most "
            f"{path_max - 1}: choose a shorter path",
            path=name,
        )


def path_arg(value: object, name: str) -> Path:
    """A path argument: a string or an ``os.PathLike`` without a NUL character (no file
    system takes one; ``open`` would raise a bare ValueError) that its file system can
    hold (:func:`check_path_fits`)."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        text = os.fspath(value)
        if isinstance(text, str) and "\0" in text:
            raise ConfigError(f"{name} holds a NUL character, which no path may hold", path=name)
        if isinstance(text, str):
            path = Path(text)
            check_path_fits(path, name)
            return path
    raise ConfigError(f"{name} is a path (a string or a pathlib.Path), not {kind_of(value)}", path=name)


def optional_path(value: object, name: str) -> Path | None:
    return None if value is None else path_arg(value, name)


def check_flags(**flags: object) -> None:
    """Boolean keyword options (``overwrite``, ``resume``, ``progress``)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name} is True or False, not {kind_of(value)}", path=name)


def callback_arg(value: object, name: str) -> None:
    """An optional callback argument (``on_epoch``): None or a callable, checked
    before the run starts rather than when the first epoch ends."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name} is a function (or None), not {kind_of(value)}", path=name)


def seed_list(seeds: object) -> list[int] | None:
    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Sequence):
        raise ConfigError(f"seeds is a list of integers, not {kind_of(seeds)}", path="seeds")
    bad = [s for s in seeds if not isinstance(s, int) or isinstance(s, bool)]
    if bad:
        raise ConfigError(f"seeds are integers; got {bad[0]!r} ({kind_of(bad[0])})", path="seeds")
    return list(seeds)


def set_list(overrides: Overrides | None) -> list[str]:
    """Overrides as ``--set`` expressions."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(
            "overrides are a mapping or a list of KEY=VALUE strings, not one string", path="overrides"
        )
    if isinstance(overrides, Mapping):
        keys = [k for k in overrides if not isinstance(k, str)]
        if keys:
            raise ConfigError(f"an override's key is a string, not {kind_of(keys[0])}", path="overrides")
        return [override_expr(key, value) for key, value in overrides.items()]
    return _strings(
        overrides,
        shape="overrides are a mapping or a list of KEY=VALUE strings",
        item="an override is a KEY=VALUE string",
        path="overrides",
    )


def data_list(data: Mapping[str, str | os.PathLike[str]] | Sequence[str] | None) -> list[str]:
    """``--data`` items from a mapping party -> file (or the items themselves)."""
    if data is None:
        return []
    if isinstance(data, str):
        raise ConfigError("data is a mapping party -> file or a list of PARTY=PATH strings", path="--data")
    if isinstance(data, Mapping):
        return [f"{party}={path_arg(path, f'data[{party!r}]')}" for party, path in data.items()]
    return _strings(
        data,
        shape="data is a mapping party -> file or a list of PARTY=PATH strings",
        item="a data item is a PARTY=PATH string",
        path="--data",
    )


def plugin_list(plugins: object) -> list[str]:
    """``plugins``: the caller's own modules, as ``--plugin`` takes them (names,
    paths, ``NAME=sha256:HEX``); one string is refused, not read letter by letter."""
    shape = "plugins is a list of module names or paths"
    if isinstance(plugins, str):
        raise ConfigError(f"{shape}, not one string (write [{plugins!r}])", path="plugins")
    return _strings(plugins, shape=shape, item="each plugin is a module name or a path", path="plugins")


def _strings(value: object, *, shape: str, item: str, path: str) -> list[str]:
    """``value`` as a list of strings; else a ConfigError at ``path`` that says the
    ``shape`` expected of it, or what ``item`` each element must be."""
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise ConfigError(f"{shape}, not {kind_of(value)}", path=path)
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{item}, not {kind_of(bad[0])}", path=path)
    return list(value)
