"""Shared test helpers: build protocols in code, run them through the real
launcher (one OS process per rank), call the CLI as a subprocess."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ROOT / "protocols"


def load_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load((PROTOCOLS / name).read_text())


def small_digits(**training: Any) -> dict[str, Any]:
    """plain.yaml shrunk for fast tests (MLP bottoms, few epochs)."""
    doc = load_yaml("plain.yaml")
    for p in doc["parties"]["passive"]:
        p["model"] = {"kind": "mlp", "hidden": [32], "out": 16}
    doc["interactive"] = {"out": 16}
    doc["training"].update({"epochs": 2, "batch_size": 128, **training})
    # tests compare runs and use fixed seeds: pin the defenses' private noise too
    doc["privacy"] = {"noise_seed": 0}
    return doc


def run_doc(doc: dict[str, Any], out: Path, **kw: Any) -> dict[str, Any]:
    """Validate a protocol mapping and run it with the real launcher."""
    from securevfl.config import load_protocol_dict
    from securevfl.runtime.launcher import launch

    proto = load_protocol_dict(copy.deepcopy(doc))
    return launch(proto, out, progress=False, **kw)


def cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``securevfl ARGS`` in a fresh interpreter."""
    e = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "securevfl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
        cwd=cwd or ROOT,
    )


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def digits_doc() -> dict[str, Any]:
    return small_digits()
