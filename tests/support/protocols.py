"""Protocol documents and files for tests: the repository's protocols, small
and fast variants of them, and YAML in and out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

PROTOCOLS = ROOT / "protocols"


def load_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load((PROTOCOLS / name).read_text())


def small_digits(**training: Any) -> dict[str, Any]:
    """plain.yaml shrunk for fast tests (MLP bottoms, few epochs)."""
    doc = load_yaml("plain.yaml")
    # tests compare runs and use fixed seeds: the bottom models start from the
    # shared seed (init: seeded) and the defenses' private noise is pinned too
    for p in doc["parties"]["passive"]:
        p["model"] = {"kind": "mlp", "hidden": [32], "out": 16, "init": "seeded"}
    doc["interactive"] = {"out": 16}
    doc["training"].update({"epochs": 2, "batch_size": 128, **training})
    doc["privacy"] = {"noise_seed": 0}
    return doc


def short_sgd_digits(steps: int) -> dict[str, Any]:
    """``steps`` training steps of batch 32 on small digits with SGD, A tracing z and
    the loss of every step and every rank dumping its view: the run that defense
    comparisons hold step by step against an undefended one. SGD, not Adam: Adam
    divides by the root of the second moment, which turns any rounding difference in
    a near-zero gradient into a step of size lr."""
    doc = small_digits(epochs=1, batch_size=32, max_steps=steps, optimizer="sgd", lr=0.05)
    doc["runtime"] = {"trace_steps": steps, "dump_views": True}
    return doc


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


#: training steps of the shared undefended run (:func:`undefended_short_run`)
SHORT_STEPS = 4
