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

from securevfl.errors import ConfigError, ProtocolError

#: a JSON number kept as written: an int stays an int, so a record read back and
#: written again is the same file
Real = int | float


class _Record(BaseModel):
    # an unbounded privacy loss is epsilon = inf, and stays inf: result.json spells it
    # "Infinity" (securevfl.jsonfile), not the null pydantic's JSON mode would make of it
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
    # defenses whose built-in name user code took with force=True: name -> module:qualname
    replaced_builtins: dict[str, str] | None = None
    # the active party's task, metrics and schedule (ActiveParty.run_summary)
    task: str | None = None
    positive_class: str | None = None  # a binary task's: what test_auc and a prediction's score are about
    test_accuracy: Real | None = None
    test_auc: Real | None = None
    test_majority_rate: Real | None = None  # share of the most common test label (classification)
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
    # a prediction's privacy spending (party ranks whose defenses release at prediction)
    prediction_privacy: dict[str, Any] | None = None
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


class MechanismPrivacy(_Record):
    """One DP mechanism of a party over the run: its ``(epsilon, delta)`` as the
    accountant composed its releases (``releases``: kind, parameters and count of
    each), the source method's own figure where it states one (``claim``, reported
    as given, not the sound figure) and what the figure does not cover (``notes``)."""

    name: str
    epsilon: float
    delta: float
    releases: list[dict[str, Any]]
    claim: dict[str, Any] | None = None
    notes: list[str] = []


class ClaimedEpsilon(_Record):
    """A claim's epsilon for one release of a mechanism and over the whole run."""

    per_release: float
    composed: float


class MechanismAudit(_Record):
    """The audit of one mechanism (:class:`securevfl.privacy.audit_record.AuditRecord`,
    docs/privacy.md "The audit"): the claimed epsilon (``claim``: ``sound``, the
    accountant's, or ``nominal``, the paper's), the audited lower bound on one
    release's epsilon, at which ``basis`` (declared sensitivity or released scale),
    by which ``method``, and the ``verdict``. ``scale`` is the released scale as a
    power-of-two bucket (basis ``released scale`` only; SECURITY.md §7)."""

    mechanism: str
    basis: Literal["declared sensitivity", "released scale"]
    claim: Literal["sound", "nominal"]
    epsilon_claimed: ClaimedEpsilon
    epsilon_lower: float
    delta: float
    confidence: float
    trials: int
    method: Literal["gdp", "clopper-pearson", "none"]
    verdict: Literal["consistent", "violated", "unaudited"]
    seconds: float
    reason: str | None = None
    scale: float | None = None


class PartyPrivacy(_Record):
    """The privacy one party spent: ``epsilon`` and ``delta`` of every DP mechanism
    it ran composed over the same records (what a budget bounds; ``inf`` when one
    of them is not private), each mechanism alone (``mechanisms``) and the audit
    of each mechanism as it ran (``audit``; empty when the audit was off)."""

    party: str
    epsilon: float
    delta: float
    mechanisms: dict[str, MechanismPrivacy]
    audit: list[MechanismAudit] = []

    @classmethod
    def from_account(cls, party: str, entry: Mapping[str, Any]) -> PartyPrivacy:
        """From one party's entry of the accountant's output (``result.json``'s
        ``privacy.parties.<party>``: ``mechanisms`` and ``total``)."""
        return cls(
            party=party,
            epsilon=entry["total"]["epsilon"],
            delta=entry["total"]["delta"],
            mechanisms={
                name: MechanismPrivacy(name=name, **row)
                for name, row in (entry.get("mechanisms") or {}).items()
            },
            audit=[MechanismAudit(**row) for row in entry.get("audit") or []],
        )


class PrivacyReport(_Record):
    """A run's privacy records, typed (``result.json``'s ``privacy``): every party
    that ran a DP mechanism (``parties``), the accountant and its ``delta``, the
    budget's epsilon if the protocol set one, the steps planned and run, and
    whether the budget stopped training early. ``noise_seed_pinned``: the defenses'
    noise came from a pinned seed, so the figures do not hold (SECURITY.md)."""

    accountant: str
    delta: float
    noise_seed_pinned: bool
    parties: dict[str, PartyPrivacy]
    budget_epsilon: float | None
    planned_steps: int | None
    steps_run: int | None
    stopped_by_budget: bool

    @classmethod
    def from_json(cls, privacy: Mapping[str, Any]) -> PrivacyReport | None:
        """From ``result.json``'s ``privacy`` mapping; None when it is empty (no DP
        mechanism ran)."""
        if not privacy:
            return None
        budget = privacy.get("budget") or {}
        return cls(
            accountant=privacy["accountant"],
            delta=privacy["delta"],
            noise_seed_pinned=bool(privacy.get("noise_seed_pinned")),
            parties={p: PartyPrivacy.from_account(p, e) for p, e in (privacy.get("parties") or {}).items()},
            budget_epsilon=budget.get("epsilon"),
            planned_steps=privacy.get("planned_steps"),
            steps_run=privacy.get("steps_run"),
            stopped_by_budget=bool(privacy.get("stopped_by_budget")),
        )


class EpochRecord(_Record):
    """One finished training epoch, as the active party's rank (rank 0) knows it
    at that moment: ``epoch`` of ``epochs`` (1-based), the training ``step``s run so
    far, the mean training loss of the epoch, the metrics of the evaluation run at
    its end (``metrics``, empty when ``training.eval_every`` skipped it), the
    seconds since training started (``elapsed_s``) and the privacy spent so far by
    the mechanisms rank 0 runs itself (``privacy``, its own party only: a passive
    party's accounting reaches rank 0 only with its summary at the end of the run).
    Nothing in it is new to rank 0's owner: it is what the progress line shows."""

    epoch: int
    epochs: int
    step: int
    train_loss: float | None
    metrics: dict[str, Any]  # as the run's history row holds them (a task's own metrics included)
    elapsed_s: float
    privacy: dict[str, PartyPrivacy] = {}

    @property
    def test_accuracy(self) -> float | None:
        """The epoch's test accuracy (None when not evaluated, or not a classification)."""
        value = self.metrics.get("test_accuracy")
        return None if value is None else float(value)

    def privacy_of(self, party: str) -> PartyPrivacy | None:
        """``party``'s privacy spent so far, if rank 0 accounts for it (its own)."""
        return self.privacy.get(party)


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
    # a binary task's positive class (test_auc and a prediction's score are its probability)
    positive_class: str | None = None
    test_accuracy: Real | None
    test_auc: Real | None
    # the share of the most common test label: the accuracy of predicting the majority class
    # (classification; None for regression and in a record written before it was kept)
    test_majority_rate: Real | None = None
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
    # components whose built-in name user code took with force=True (party -> name -> module:qualname;
    # an attack's under "attacks"): what securevfl documents of that name does not hold for the run
    replaced_builtins: dict[str, dict[str, str]] = {}
    digest: str
    wall_time_s: Real
    phase_s: dict[str, dict[str, Real] | Real]  # per rank, and "attacks" (the harness's seconds)
    phase_cpu_s: dict[str, dict[str, Real]]  # per rank: CPU seconds of the data, alignment and setup phases
    train_cpu_s: dict[str, Real]  # per rank: CPU seconds in training (a helper rank: its whole serving)
    peak_rss_mib: dict[str, Real | None]
    machine: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def privacy_report(self) -> PrivacyReport | None:
        """:attr:`privacy`, typed (None when no DP mechanism ran)."""
        return PrivacyReport.from_json(self.privacy)

    @property
    def party_names(self) -> list[str]:
        """The run's parties (helper ranks, such as a dealer, are not parties)."""
        return [
            r["party"]
            for _, r in sorted(self.ranks.items(), key=lambda kv: int(kv[0]))
            if r["role"] != "helper"
        ]

    def privacy_of(self, party: str) -> PartyPrivacy | None:
        """The privacy ``party`` spent: ``result.privacy_of("left").epsilon``. None
        when that party ran no DP mechanism (its releases carry no DP guarantee, so
        no epsilon describes them); a name that is no party of the run is refused."""
        if party not in self.party_names:
            raise ConfigError(
                f"no party '{party}' in this run (parties: {', '.join(self.party_names)})", path="party"
            )
        report = self.privacy_report
        return None if report is None else report.parties.get(party)


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
    def preprocess(self) -> dict[str, Any] | None:
        """The party's fitted preprocessing (a ``PreprocessState`` document), from
        which its bottom model's input layout is rebuilt; None in a view without it."""
        return self._fields.get("preprocess")

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
