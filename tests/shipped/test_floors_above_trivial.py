"""Default suite: every classification floor of protocols/floors.toml lies above the
trivial predictor's score on that run's test rows, so the shipped-protocol tier can
tell a model that learned from one that always answers the majority class.

The trivial score is the majority-class rate of the test labels, computed from the
data the way a run splits them: the built-in dataset materialized into the parties'
files (:func:`securevfl.data.partition.materialize`), the active party's file read
as :func:`securevfl.parties.common.prepare` reads it, in the agreed order (sorted
IDs: every party of a built-in dataset holds every ID, so the PSI order is the file
order) and split by :func:`securevfl.data.party_data.split_indices` under the
protocol's own seed and test fraction. The comparison file's grid points are
checked with the protocol each of them runs.

A floor at or below its trivial score is allowed only for the entries in
:data:`EXCEPTIONS`, each a run whose documented purpose is to end at or near chance;
floors.toml must write that trivial score beside it (``trivial 0.xxx``), and an
exception whose floor has risen above it fails here as stale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from securevfl.app.comparison import plan, read_comparison_file, sources_from_paths
from securevfl.app.loader import load_protocol
from securevfl.config import Protocol
from securevfl.data.partition import materialize, party_source
from securevfl.data.party_data import load_party_data, split_indices
from securevfl.parties.task_kinds import TASKS
from securevfl.seeding import generator
from tests.shipped.test_shipped_protocols import FILES, FLOORS_FILE, Floor, key, read_floors
from tests.support.protocols import PROTOCOLS

#: the metric whose trivial score is the majority-class rate
ACCURACY = "test_accuracy"

#: floors that may lie at or below the trivial score, and why (floors.toml says more)
EXCEPTIONS = {
    "hashvfl_greedyhash_plain.yaml": "reproduces GreedyHash's collapse in VFL (docs/methods/hashvfl.md)",
    "demo/comparison.yaml demo_mpc_embedding_dp[epsilon=2]": "shows that embedding DP at eps 2 leaves chance",
    "demo/comparison.yaml bc_mpc_label_dp[epsilon=0.25]": "label DP at eps 0.25 keeps a true label w.p. 0.56",
}


def trivial_accuracy(proto: Protocol, data_dir: Path) -> float:
    """The majority-class rate of the test labels of a run of ``proto``."""
    materialize(proto, data_dir)
    active = proto.parties.active.name
    data = load_party_data(
        party_source(proto, active, data_dir),
        active,
        is_active=True,
        preprocess=proto.parties.active.preprocess,
        task=proto.task,
        task_has_classes=TASKS.get(proto.task).has_classes if proto.task else None,
    )
    assert data.ids == sorted(data.ids), f"{proto.name}: a built-in dataset's IDs are written sorted"
    _, test_idx = split_indices(
        len(data.ids), proto.dataset.test_fraction, generator(proto.training.seed, "split")
    )
    _, counts = np.unique(data.y[test_idx], return_counts=True)
    return float(counts.max() / len(test_idx))


def accuracy_floors(tmp: Path) -> list[tuple[str, Protocol, Floor]]:
    """(label, protocol, floor) of every accuracy floor: one per protocol file, one
    per grid point of a comparison file (the runs its floor table names)."""
    floors = read_floors()
    cases = []
    for path in FILES:
        entry = floors[key(path)]
        if read_comparison_file(path) is None:
            assert isinstance(entry, Floor)
            if entry.metric == ACCURACY:
                cases.append((key(path), load_protocol(path), entry))
            continue
        assert isinstance(entry, dict), f"{key(path)}: a comparison file's floors are a table"
        runs = plan(*sources_from_paths([path], [], []), tmp / "plan", say=lambda _: None).runs
        protos = {r.label: r.proto for r in runs}
        for label, floor in entry.items():
            if floor.metric == ACCURACY:
                cases.append((f"{key(path)} {label}", protos[label], floor))
    return cases


def documented_line(label: str, lines: list[str]) -> str:
    """floors.toml's line of an entry: its table's header ``["file"]`` for a file,
    the comment line naming a comparison's grid point for one of those."""
    file, _, point = label.partition(" ")
    if point:
        found = [ln for ln in lines if ln.startswith("#") and point in ln]
    else:
        found = [ln for ln in lines if ln.startswith(f'["{file}"]')]
    assert len(found) == 1, f"protocols/{FLOORS_FILE.name} has {len(found)} lines for {label}, not one"
    return found[0]


def test_every_accuracy_floor_lies_above_the_majority_rate(tmp_path: Path):
    lines = FLOORS_FILE.read_text().splitlines()
    cases = accuracy_floors(tmp_path)
    assert len(cases) > 30, f"only {len(cases)} accuracy floors found"
    assert set(EXCEPTIONS) <= {label for label, _, _ in cases}, "an exception names no floor"
    below, stale, undocumented = [], [], []
    for label, proto, floor in cases:
        trivial = trivial_accuracy(proto, tmp_path / "data")
        assert 0 < trivial < 1
        if label in EXCEPTIONS:
            if floor.bound > trivial:
                stale.append(f"{label}: floor {floor.bound} > trivial {trivial:.3f}")
            if f"trivial {trivial:.3f}" not in documented_line(label, lines):
                undocumented.append(f"{label}: trivial {trivial:.3f}")
        elif floor.bound <= trivial:
            below.append(f"{label}: floor {floor.bound} <= trivial {trivial:.3f}")
    assert not below, f"floors at or below the majority-class rate of their test rows: {below}"
    assert not stale, f"exceptions whose floor now lies above the trivial score (remove them): {stale}"
    assert not undocumented, (
        f"protocols/{FLOORS_FILE.name} must write these beside the exception: {undocumented}"
    )


def test_the_trivial_score_is_the_majority_rate_of_the_test_split(tmp_path: Path):
    """breast cancer: 212 malignant and 357 benign rows, and a run's 142 test rows
    of seed 0 hold 90 benign ones (0.634, where the crdp files used to end)."""
    proto = load_protocol(PROTOCOLS / "crdp_plain.yaml")
    assert round(trivial_accuracy(proto, tmp_path), 3) == 0.634
