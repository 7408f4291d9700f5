"""Typed records of a run: what each rank reports (:class:`RankSummary`), the
result record rank 0 assembles from them (:class:`ResultRecord`, ``result.json``),
what each party keeps for itself (:class:`OwnReport`) and what each party
legitimately holds for attacks (:class:`OwnView`).

Both are pydantic models so that a field is read as a field, a misspelt one is an
error where it is written, and a summary another rank sent is validated before
it is used (a malformed one is refused, not half-read). Their JSON forms are the
files securevfl has always written: ``ranks/rank<R>.summary.json`` holds the
fields the rank set, and ``result.json`` every field of the record in the order
below (``securevfl compare`` and other readers keep reading it as JSON).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from securevfl.errors import ProtocolError

#: a JSON number kept as written: an int stays an int, so a record read back and
#: written again is the same file
Real = int | float


class _Record(BaseModel):
    # an unbounded privacy loss is epsilon = inf, and stays inf in result.json
    # (Python's json writes and reads it as Infinity), not the null pydantic's
    # JSON mode would make of it
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class RankSummary(_Record):
    """One rank's account of its run, as it is sent to rank 0 (SECURITY.md §7,
    "Metadata to rank 0"): every rank sets the identity, ledger and timing fields;
    party ranks add training, privacy and data fields; the active rank its metrics
    (``Party.run`` and the side's ``run_summary``). ``defense_report`` holds only
    what the defenses declared public (``Defense.public_report``); their
    statistics of the data are in each party's :class:`OwnReport`."""

    rank: int
    party: str
    role: Literal["active", "passive", "helper"]
    pid: int
    # training (party ranks; Party.run)
    train_steps: int | None = None
    n_train: int | None = None
    planned_steps: int | None = None
    allowed_steps: int | None = None
    privacy: dict[str, Any] | None = None
    defense_report: dict[str, Any] | None = None
    # the active party's task, metrics and schedule (ActiveParty.run_summary)
    task: str | None = None
    test_accuracy: Real | None = None
    test_auc: Real | None = None
    test_rmse: Real | None = None
    test_mae: Real | None = None
    test_r2: Real | None = None
    history: list[dict[str, Any]] | None = None
    time_per_step_s: Real | None = None
    step_time_s: dict[str, Real | None] | None = None
    n_test: int | None = None
    n_aligned: int | None = None
    classes: int | None = None
    # what the party loaded and aligned (n_records: rows of its file, at prediction)
    n_records: int | None = None
    loaded_columns: list[str] | None = None
    has_labels: bool | None = None
    aligned_digest: str | None = None
    view_tags: list[str] | None = None
    # every rank
    ledger: dict[str, Any] | None = None
    opened_files: list[str] | None = None
    phase_s: dict[str, Real] | None = None
    phase_cpu_s: dict[str, Real] | None = None
    train_cpu_s: Real | None = None  # CPU seconds training (a helper: serving), for benchmarks
    peak_rss_mib: Real | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields this rank set (a passive rank has no test accuracy, not a null one)."""
        return self.model_dump(mode="json", exclude_unset=True)


class OwnReport(_Record):
    """``ranks/rank<R>.defense_report.json``: what a party keeps for itself after a
    run, written by its own rank and sent nowhere (``Party.own_report``): its
    defenses' run statistics (``Defense.report``: selection scores, rescaling
    factors, probabilities, computed from its data) and its model's input column
    count after their feature selection."""

    rank: int
    party: str
    columns: int | None = None
    defenses: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class ResultRecord(_Record):
    """``result.json``: one run, as rank 0 assembles it from every rank's summary
    (:func:`securevfl.report.result.build_result`); the attack harness fills
    ``attacks`` and adds its time to ``phase_s`` afterwards."""

    protocol: str
    description: str
    backend: str
    backend_params: dict[str, Any]
    dataset: str
    n_parties: int
    n_passive: int
    world_size: int
    task: str | None
    test_accuracy: Real | None
    test_auc: Real | None
    test_rmse: Real | None  # regression tasks (None otherwise)
    test_mae: Real | None
    test_r2: Real | None
    epochs: int
    batch_size: int
    seed: int
    device: str
    train_steps: int
    time_per_step_s: Real | None
    step_time_s: dict[str, Real | None] | None
    bytes_per_step: Real | None
    party_pids: dict[str, int]
    ranks: dict[str, dict[str, str]]
    rows: dict[str, int | None]
    history: list[dict[str, Any]]
    ledger: dict[str, Any]
    privacy: dict[str, Any]
    attacks: dict[str, Any]
    defense_report: dict[str, Any]
    defenses: dict[str, list[str]]
    # privacy.noise_seed was pinned: every defense noise is reproducible by anyone who
    # knows the seed, so the run is not private (an experiment; SECURITY.md)
    noise_seed_pinned: bool = False
    digest: str
    wall_time_s: Real
    phase_s: dict[str, dict[str, Real] | Real]  # per rank, and "attacks" (the harness's seconds)
    phase_cpu_s: dict[str, dict[str, Real]]  # per rank: CPU seconds of the data, alignment and setup phases
    train_cpu_s: dict[str, Real]  # per rank: CPU seconds in training (a helper rank: its whole serving)
    peak_rss_mib: dict[str, Real | None]
    machine: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class OwnView(Mapping[str, Any]):
    """What one party legitimately holds after a run (``Party.own_view``), read by
    attacks and wire audits field by field.

    The active party's: the exchange's parameters it held before training
    (``held_at_start``), the aligned IDs and split, its true labels and class
    count, the schedule of exchange forwards (``forwards``: phase, round, row
    positions) with the z revealed at each (``z``), its final top model and bias,
    the interactive blocks it holds in the clear (``interactive``) and its own
    part of z on the test rows (``own_z_test``). A passive party's: what it sent
    (``embeddings``, per round), the IDs, split and column names, its raw and
    model-input features, the gradient revealed at each training forward
    (``grads``), its final bottom model and defense modules' states, and its final
    bottom outputs before (``h_*``) and after (``sent_*``) its defenses.

    On disk (``ranks/rank<R>.view.pt``) a view is the plain mapping of these
    fields (:meth:`to_dict`), loaded back without unpickling any class; a view
    built for a test may hold only the fields it needs. Reading a field the
    party did not keep is a :class:`~securevfl.errors.ProtocolError`.
    """

    def __init__(self, fields: Mapping[str, Any] | None = None):
        self._fields = dict(fields or {})

    def _get(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise ProtocolError(
                f"this party's own view holds no '{name}' (views are kept only when attacks run or "
                "runtime.dump_views is set, and runtime.record_views is on)"
            ) from None

    # -- the mapping (the on-disk form) --------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    # -- both sides --------------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        return self._get("ids")

    @property
    def train_idx(self) -> np.ndarray:
        return self._get("train_idx")

    @property
    def test_idx(self) -> np.ndarray:
        return self._get("test_idx")

    @property
    def forwards(self) -> list[dict[str, Any]]:
        return self._get("forwards")

    # -- the active party --------------------------------------------------------------
    @property
    def held_at_start(self) -> dict[str, torch.Tensor]:
        return self._get("held_at_start")

    @property
    def y_train(self) -> torch.Tensor:
        return self._get("y_train")

    @property
    def y_test(self) -> torch.Tensor:
        return self._get("y_test")

    @property
    def classes(self) -> int:
        return int(self._get("classes"))

    @property
    def z(self) -> list[torch.Tensor]:
        return self._get("z")

    @property
    def top(self) -> dict[str, torch.Tensor]:
        return self._get("top")

    @property
    def bias(self) -> torch.Tensor:
        return self._get("bias")

    @property
    def interactive(self) -> dict[str, torch.Tensor]:
        """Blocks W_i the active party holds in the clear (empty under a backend
        that shares or encrypts them)."""
        return self._fields.get("interactive") or {}

    @property
    def own_z_test(self) -> torch.Tensor | None:
        """The active party's own part of z on the test rows (None when label-only)."""
        return self._fields.get("own_z_test")

    # -- a passive party ---------------------------------------------------------------
    @property
    def embeddings(self) -> list[tuple[int, torch.Tensor]]:
        return self._get("embeddings")

    @property
    def columns(self) -> list[str]:
        return self._get("columns")

    @property
    def x_raw(self) -> torch.Tensor:
        return self._get("x_raw")

    @property
    def grads(self) -> list[torch.Tensor]:
        return self._get("grads")

    @property
    def x_train(self) -> torch.Tensor:
        return self._get("x_train")

    @property
    def x_test(self) -> torch.Tensor:
        return self._get("x_test")

    @property
    def bottom(self) -> dict[str, torch.Tensor]:
        return self._get("bottom")

    @property
    def defense_modules(self) -> list[dict[str, torch.Tensor]]:
        return self._get("defense_modules")

    @property
    def h_train(self) -> torch.Tensor:
        return self._get("h_train")

    @property
    def h_test(self) -> torch.Tensor:
        return self._get("h_test")

    @property
    def sent_train(self) -> torch.Tensor:
        return self._get("sent_train")

    @property
    def sent_test(self) -> torch.Tensor:
        return self._get("sent_test")
