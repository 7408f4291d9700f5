"""A holds no statistic a passive party's defenses computed from its data (SECURITY.md §7).

Threat: at the end of a run every rank sends rank 0 (the active party A) a
summary, and A writes ``result.json``. A passive party's defenses compute
statistics of its private data: ``crdp`` its stability scores, the candidates'
sensitivities, the MCD and the exponential mechanism's probabilities (an exact
function of the private utilities, which would void eps2 against A);
``embedding_dp`` in paper mode the quantiles of its data-dependent rescaling
factor, and with it the effective noise multiplier. None of it may reach A.

The test runs a real three-party ``plain`` run as three ``securevfl party``
processes, each with its own output folder, 'left' under ``crdp`` and 'right'
under ``embedding_dp`` (paper-mode rescaling). Rank 0 runs through the transport
tap (:mod:`tests.threat_model.wire_tap`), which keeps every summary it gathers as
it opened it. Playing A with everything A holds (its whole output folder,
``result.json`` included, and those summaries), it looks for the defenses'
statistics by name and by value: every value of the passive parties' own reports
(written to their own folders), searched as JSON numbers and as raw float64 bytes
in every file A has. It also checks that what A learns of the parties' privacy
follows from the protocol alone: the accounting A receives equals the one
computed from the protocol file and the step count, without any data.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from securevfl import jsonfile
from securevfl.app.launcher import free_port
from securevfl.app.loader import load_checked
from securevfl.defenses.base import build_stack
from securevfl.privacy.accountant import account
from securevfl.privacy.step_budget import plan_for
from tests.support.protocols import ROOT, write_yaml

pytestmark = pytest.mark.timeout(300)

PARTIES = ("active", "left", "right")
ROWS, STEPS = 160, 3
# names of statistics of the data in the two defenses' own reports
CRDP_STATS = (
    "stability_scores",
    "candidate_delta_cs_p",
    "em_probabilities",
    "mcd",
    "delta_cs_p",
    "laplace_scale",
)
AUDIT_KEYS = {
    "mechanism", "basis", "claim", "epsilon_claimed", "epsilon_lower", "delta", "confidence", "trials",
    "method", "verdict", "seconds", "reason", "scale",
}  # fmt: skip
AFE_STATS = ("s_train", "s_eval", "delta_tilde_train", "effective_epsilon_at_s_max", "kl_mean")


def _write_data(folder: Path) -> None:
    """160 shared IDs; 'left' and 'right' each hold six correlated columns, the
    label follows their sum (test data, drawn once from a fixed seed)."""
    rng = np.random.default_rng(2024)
    base = rng.normal(size=(ROWS, 3))
    left = np.hstack([base, base @ rng.normal(size=(3, 3)) + 0.3 * rng.normal(size=(ROWS, 3))])
    right = np.hstack([base[:, ::-1], rng.normal(size=(ROWS, 3))])
    label = (base.sum(axis=1) > 0).astype(int)
    ids = [f"id-{i:04d}" for i in range(ROWS)]

    def write(name: str, header: list[str], rows: list[list[object]]) -> None:
        lines = [",".join(["id", *header])] + [
            ",".join(map(str, [i, *r])) for i, r in zip(ids, rows, strict=True)
        ]
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")

    write("active", ["label"], [[int(v)] for v in label])
    write("left", [f"l{j}" for j in range(6)], [[f"{v:.6f}" for v in r] for r in left])
    write("right", [f"r{j}" for j in range(6)], [[f"{v:.6f}" for v in r] for r in right])


def _protocol(folder: Path) -> Path:
    _write_data(folder)
    model = {"kind": "mlp", "hidden": [8], "out": 4}
    crdp = {"name": "crdp", "params": {"eps1": 1.0, "eps2": 1.0, "eps3": 1.0, "theta_per": 0.9, "w0": 0.4}}
    afe = {
        "name": "embedding_dp",
        "params": {
            "variant": "R",
            "epsilon": 4.0,
            "delta": 0.01,
            "calibration": "analytic",
            "clip": 1.0,
            "rescale_mode": "paper",
        },
    }
    doc: dict[str, Any] = {
        "name": "reports",
        "dataset": {"name": "csv", "test_fraction": 0.25},
        "parties": {
            "active": {
                "name": "active",
                "source": {"path": str(folder / "active.csv"), "label_column": "label"},
            },
            "passive": [
                {
                    "name": "left",
                    "source": {"path": str(folder / "left.csv")},
                    "model": model,
                    "defenses": [crdp],
                },
                {
                    "name": "right",
                    "source": {"path": str(folder / "right.csv")},
                    "model": model,
                    "defenses": [afe],
                },
            ],
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 32, "max_steps": STEPS},
        "privacy": {"delta": 0.01},
        "runtime": {"startup_timeout_s": 120},
    }
    return write_yaml(folder / "reports.yaml", doc)


def _rank(proto: Path, rank: int, port: int, out: Path, tap: Path) -> subprocess.Popen[str]:
    module = "tests.threat_model.wire_tap" if rank == 0 else "securevfl"
    args = [sys.executable, "-m", module, "party", str(proto), "--rank", str(rank)]
    args += ["--rendezvous", f"tcp://127.0.0.1:{port}", "--out", str(out), "--quiet"]
    env = {**os.environ, "TAP_DIR": str(tap)}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run, each party with its own output folder ``host<R>``; rank 0 tapped."""
    root = tmp_path_factory.mktemp("reports")
    proto = _protocol(root)
    tap, port = root / "tap", free_port()
    procs = {r: _rank(proto, r, port, root / f"host{r}", tap) for r in range(3)}
    for r, p in procs.items():
        try:
            so, se = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        assert p.returncode == 0, f"rank {r}: {(so + se)[-3000:]}"
    return {"root": root, "proto": proto, "tap": tap}


def _walk(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every (path, leaf) of a JSON document, dict keys included as leaves."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((f"{path}/{k}", k))
            out += _walk(v, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _walk(v, f"{path}[{i}]")
    else:
        out.append((path, obj))
    return out


def _a_holds(run: dict[str, Any]) -> dict[str, bytes]:
    """Every file A holds after the run: its output folder and the summaries it gathered."""
    host0 = run["root"] / "host0"
    files = {str(p.relative_to(host0)): p.read_bytes() for p in sorted(host0.rglob("*")) if p.is_file()}
    files["(gathered summaries)"] = (run["tap"] / "rank0.summaries.json").read_bytes()
    return files


def _json_docs(files: dict[str, bytes]) -> dict[str, Any]:
    docs = {}
    for name, data in files.items():
        if name.endswith(".jsonl"):
            docs[name] = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        elif name.endswith(".json") or name == "(gathered summaries)":
            docs[name] = json.loads(data)
    return docs


def _distinctive(values: list[Any]) -> set[float]:
    """The float values of a report that no setting or count could explain: not a
    round number (a value with six decimals or fewer is left out)."""
    return {float(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != round(v, 6)}


def test_a_receives_no_defense_statistic_of_a_passive_party(run: dict[str, Any]):
    files = _a_holds(run)
    docs = _json_docs(files)
    assert "result.json" in docs and len(docs["(gathered summaries)"]) == 3
    stats = {"left": CRDP_STATS, "right": AFE_STATS}
    named = sorted(
        {
            f"{doc} {path}"
            for doc, content in docs.items()
            for path, leaf in _walk(content)
            if isinstance(leaf, str) and any(leaf in names for names in stats.values())
        }
    )
    assert not named, "A holds the passive parties' defense statistics by name:\n" + "\n".join(named[:20])

    # each passive party's own report, in its own folder: its statistics, by value (less
    # the constants its options give, which the protocol declares to everyone)
    checked = load_checked(run["proto"])
    for rank, party in ((1, "left"), (2, "right")):
        own = json.loads(
            (run["root"] / f"host{rank}" / "ranks" / f"rank{rank}.defense_report.json").read_text()
        )
        assert own["party"] == party
        report = next(iter(own["defenses"].values()))
        assert set(stats[party]) <= set(report), (party, sorted(report))
        declared = build_stack(checked.protocol, checked.components, party, "passive").public_report()
        secret = _distinctive([leaf for _, leaf in _walk(report)]) - _distinctive(
            [leaf for _, leaf in _walk(declared)]
        )
        # the search below is over real values: every non-round value of the named
        # statistics, none of them explained by the declared options (how many there are
        # varies: crdp's exponential-mechanism probabilities take one value per distinct
        # candidate sensitivity, and a run may draw as few as two)
        private = _distinctive([leaf for k in stats[party] if k in report for _, leaf in _walk(report[k])])
        assert private and private <= secret, (party, sorted(private), sorted(private - secret))
        in_json = {
            f"{doc} {path} = {leaf!r}"
            for doc, content in docs.items()
            for path, leaf in _walk(content)
            if isinstance(leaf, float) and leaf in secret
        }
        assert not in_json, f"A holds {party}'s own statistics by value:\n" + "\n".join(sorted(in_json)[:20])
        as_bytes = {
            f"{name}: {v!r}"
            for v in secret
            for name, data in files.items()
            if struct.pack("<d", v) in data or repr(v).encode() in data
        }
        assert not as_bytes, f"A's files carry {party}'s own statistics:\n" + "\n".join(sorted(as_bytes)[:20])


def test_what_a_learns_of_the_parties_privacy_follows_from_the_protocol(run: dict[str, Any]):
    """The accounting and the declared reports A receives are what the protocol file
    and the step count give, computed here without any party's data."""
    result = jsonfile.loads((run["root"] / "host0" / "result.json").read_text())  # "Infinity": inf
    checked = load_checked(run["proto"])
    proto = checked.protocol
    assert result["train_steps"] == STEPS
    n_train = result["rows"]["train"]
    stacks = {
        spec.name: build_stack(proto, checked.components, spec.name, "passive", spec.defenses)
        for spec in proto.parties.passive
    }
    for party, stack in stacks.items():
        plan = plan_for(STEPS, n_train, proto.training)
        expected = account({party: stack.mechanisms(plan)}, proto.privacy.delta)[party]
        got = dict(result["privacy"]["parties"][party])
        audit = got.pop("audit")
        assert json.loads(json.dumps(got)) == json.loads(json.dumps(expected)), party
        # the audit of the party's mechanisms: counts of its own canary trials, the claims, and
        # at most one statistic of the data, a released scale as a power of two (SECURITY.md §7)
        assert {r["mechanism"] for r in audit} == set(expected["mechanisms"]), party
        for r in audit:
            assert set(r) <= AUDIT_KEYS, (party, sorted(set(r) - AUDIT_KEYS))
            if "scale" in r:  # a power of two
                assert r["basis"] == "released scale" and math.log2(r["scale"]).is_integer()
    for party, stack in stacks.items():
        assert result["defense_report"][party] == json.loads(json.dumps(stack.public_report())), party
    # uncapped paper-mode rescaling has no bound the options give: no finite figure
    assert math.isinf(result["privacy"]["parties"]["right"]["total"]["epsilon"])


def test_each_party_keeps_its_own_report(run: dict[str, Any]):
    """The owners' copies: each passive party's statistics in its own folder, and
    nowhere else (A's folder holds only A's own report)."""
    root = run["root"]
    for rank in (1, 2):
        found = sorted(p.name for p in (root / f"host{rank}" / "ranks").glob("*.defense_report.json"))
        assert found == [f"rank{rank}.defense_report.json"]
    left = json.loads((root / "host1" / "ranks" / "rank1.defense_report.json").read_text())
    rep = left["defenses"]["crdp"]
    assert 0 < left["columns"] == rep["columns_kept"] <= 6
    assert sum(rep["em_probabilities"]) == pytest.approx(1.0)
    right = json.loads((root / "host2" / "ranks" / "rank2.defense_report.json").read_text())
    rep = right["defenses"]["embedding_dp"]
    assert rep["steps"] == STEPS and rep["s_train"]["count"] == STEPS
    assert rep["noise_multiplier_at_s_max"] == pytest.approx(
        rep["sigma"] / max(1.0, rep["s_train"]["max"], rep["s_eval"]["max"])
    )
    assert sorted(p.name for p in (root / "host0" / "ranks").glob("*.defense_report.json")) == [
        "rank0.defense_report.json"
    ]
