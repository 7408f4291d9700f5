"""Shared test helpers: build protocols in code, run them through the real
launcher (one OS process per rank), call the CLI as a subprocess."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
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


def short_sgd_digits(steps: int) -> dict[str, Any]:
    """``steps`` training steps of batch 32 on small digits with SGD, A tracing z and
    the loss of every step and every rank dumping its view: the run that defense
    comparisons hold step by step against an undefended one. SGD, not Adam: Adam
    divides by the root of the second moment, which turns any rounding difference in
    a near-zero gradient into a step of size lr."""
    doc = small_digits(epochs=1, batch_size=32, max_steps=steps, optimizer="sgd", lr=0.05)
    doc["runtime"] = {"trace_steps": steps, "dump_views": True}
    return doc


def run_doc(doc: dict[str, Any], out: Path, **kw: Any) -> dict[str, Any]:
    """Validate a protocol mapping and run it with the real launcher."""
    from securevfl.app.launcher import launch
    from securevfl.app.loader import load_protocol_dict

    proto = load_protocol_dict(copy.deepcopy(doc))
    return launch(proto, out, progress=False, **kw)


def cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``securevfl ARGS`` in a fresh interpreter, as ``python -m securevfl``:
    under the 'spawn' start method a rank re-runs its parent's main module first
    unless that module is a package's ``__main__`` (``python -m securevfl.cli``
    would make every rank import the whole command line again)."""
    e = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "securevfl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
        cwd=cwd or ROOT,
    )


def party_process(
    proto: Path, rank: int, port: int, out: Path, *extra: str, host: str = "127.0.0.1", cwd: Path = ROOT
) -> subprocess.Popen[str]:
    """One rank as its own ``securevfl party`` process (multi-host mode on one machine)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "securevfl", "party", str(proto), "--rank", str(rank)),
            *("--rendezvous", f"tcp://{host}:{port}", "--out", str(out), *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def training_rows(proto, data_dir: Path) -> tuple[list[Any], Any, int]:
    """Each passive party's training features and the labels, as the launcher
    derives them on a built-in dataset in which every party holds every ID (so the
    PSI order, sorted IDs, is the file order): (x per passive party, y, classes)."""
    import torch

    from securevfl.data.partition import party_source
    from securevfl.data.party_data import load_party_data, split_indices
    from securevfl.seeding import generator

    act = load_party_data(party_source(proto, "active", data_dir), "active", is_active=True)
    xs = [
        load_party_data(party_source(proto, p.name, data_dir), p.name, is_active=False)
        for p in proto.parties.passive
    ]
    assert all(x.ids == sorted(act.ids) for x in xs)
    seed = proto.training.seed
    train_idx, _ = split_indices(len(act.ids), proto.dataset.test_fraction, generator(seed, "split"))
    x_train = [torch.as_tensor(x.x[train_idx]) for x in xs]
    return x_train, torch.as_tensor(act.y[train_idx]), len(act.classes)


class ReferenceSplit:
    """The split model in one process, built with the seeds every rank uses:
    bottoms, interactive blocks W_i, bias and top model; ``logits(hs)`` is A's
    ``top(sum_i h_i W_i^T + b)`` in its order of operations."""

    def __init__(self, proto, xs: list[Any], classes: int):
        from securevfl.models import build_bias, build_bottom, build_interactive, build_top

        tr, out = proto.training, proto.interactive.out
        passive = proto.parties.passive
        self.proto = proto
        self.bottoms = [
            build_bottom(p.model, x.shape[1], seed=tr.seed, party=p.name)
            for p, x in zip(passive, xs, strict=True)
        ]
        self.blocks = [build_interactive(p.model.out, out, seed=tr.seed, party=p.name) for p in passive]
        self.bias = build_bias(out)
        self.top = build_top(proto.top, out, classes, seed=tr.seed)

    def logits(self, hs: list[Any]) -> Any:
        z = hs[0] @ self.blocks[0].weight.T
        for h, blk in zip(hs[1:], self.blocks[1:], strict=True):
            z = z + h @ blk.weight.T
        return self.top(z + self.bias)

    def state(self) -> dict[str, Any]:
        """Parameters under the names the ranks' ``state.pt`` files use (see
        :func:`split_state`)."""
        state = {f"top.{k}": v for k, v in self.top.state_dict().items()} | {"bias": self.bias.detach()}
        for p, b, blk in zip(self.proto.parties.passive, self.bottoms, self.blocks, strict=True):
            state |= {f"{p.name}.bottom.{k}": v for k, v in b.state_dict().items()}
            state[f"interactive.{p.name}"] = blk.weight.detach()
        return state


def split_state(out: Path, proto) -> dict[str, Any]:
    """Every rank's final parameters of a run, passive ones prefixed by the party."""
    import torch

    state = dict(torch.load(out / "ranks" / "rank0.state.pt", weights_only=True))
    for r, p in enumerate(proto.parties.passive, start=1):
        s = torch.load(out / "ranks" / f"rank{r}.state.pt", weights_only=True)
        state |= {f"{p.name}.{k}": v for k, v in s.items()}
    return state


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def digits_doc() -> dict[str, Any]:
    return small_digits()


#: training steps of the shared undefended run (:func:`undefended_short_run`)
SHORT_STEPS = 4


@pytest.fixture(scope="session")
def undefended_short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """``short_sgd_digits(SHORT_STEPS)`` without any defense: (result, output folder).
    The vanilla run DRAVL's and embedding_dp's identity checks compare with, launched
    once for both."""
    out = tmp_path_factory.mktemp("undefended_short")
    return run_doc(short_sgd_digits(SHORT_STEPS), out), out


@dataclass(frozen=True)
class CliRun:
    """A finished ``securevfl run``: its protocol file, the CLI process (stderr holds
    the progress lines), result.json and the output folder."""

    proto: Path
    proc: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    out: Path


@pytest.fixture(scope="session")
def small_cli_run(tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """One short undefended plain run (3 steps of small digits) through the CLI with
    progress on, shared by every test that only reads a finished run or works on a
    copy of its folder (phases, re-runs into a result folder, party commands that
    reproduce it, a run without a privacy record): one launch instead of one each.
    Tests must not write into ``out``; copy it first."""
    tmp = tmp_path_factory.mktemp("small_cli_run")
    proto = write_yaml(tmp / "p.yaml", small_digits(epochs=1, max_steps=3))
    proc = cli("run", str(proto), "--out", str(tmp / "run"))  # progress on
    assert proc.returncode == 0, proc.stderr
    return CliRun(proto, proc, json.loads((tmp / "run" / "result.json").read_text()), tmp / "run")
