"""``securevfl attack RUN --attack NAME``: run an attack again on a finished run's saved views
(imported when the command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from securevfl.app.attack_run import attack_run
from securevfl.errors import ConfigError


def _params(items: list[str]) -> dict[str, Any]:
    """``--param KEY=VALUE`` (repeatable), values read as YAML scalars (``0.2``, ``left``, ``[1, 2]``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"'{item}' must look like KEY=VALUE", path="--param")
        try:
            out[key] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"'{item}': the value is not YAML ({exc})", path="--param") from None
    return out


def cmd_attack(args: argparse.Namespace) -> int:
    """Print the attack's metrics and where they were written."""
    key, entry, path = attack_run(Path(args.run_dir), args.attack, _params(args.params), args.plugins)
    shown = {k: v for k, v in entry.items() if k not in ("used",) and not isinstance(v, (dict, list))}
    width = max(map(len, shown))
    print(f"securevfl attack: {key} on {args.run_dir}")
    for k, v in shown.items():
        print(f"  {k:<{width}}  {v:.4f}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    print(f"written to {path}")
    return 0
