"""Typed protocol schema: one YAML file describes one run.

Every model forbids unknown keys and coerces nothing (``epochs: "10"`` is an
error), and every validation error is reported with the YAML path of the offending
field (``parties.passive[1].model.out``). The validated
:class:`Protocol` object is passed down explicitly; there is no global config.
Component-specific options (a backend's or a defense's parameters) are validated
by that component's own options model, again with the full path, once, by the
checked loader, which attaches them to the protocol (:mod:`securevfl.components`).

This module is the schema alone; reading a file, applying overrides and the
cross-checks against the registries live in :mod:`securevfl.app.loader`, the
error messages with YAML paths in :mod:`securevfl.config_errors`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from securevfl.usercode import MODULE_PATTERN, REF_PATTERN


class Strict(BaseModel):
    """Base for every schema model: unknown keys are errors, values are not coerced
    from strings (``epochs: "ten"`` is an error, not a guess)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class RatioBlock(Strict):
    """Party ``part``'s contiguous block when the feature columns are cut in
    ``ratios`` (HashVFL's ``feature_distribute``, docs/methods/hashvfl.md §4): round(n r) columns,
    Python's round (half to even), for every ratio but the last, the rest for the
    last; e.g. 95 columns at [0.5, 0.5] give 48/47."""

    ratios: list[float] = Field(min_length=1)
    part: int = Field(ge=0)

    @model_validator(mode="after")
    def _valid(self) -> RatioBlock:
        if any(not r > 0 for r in self.ratios):
            raise ValueError(f"ratios must be positive, got {self.ratios}")
        if abs(sum(self.ratios) - 1) > 1e-6:
            raise ValueError(f"ratios must sum to 1, got {self.ratios}")
        if self.part >= len(self.ratios):
            raise ValueError(f"part {self.part} is out of range for {len(self.ratios)} ratios")
        return self


class ColumnSelect(Strict):
    """Which feature columns of a built-in dataset a party holds. Exactly one of
    ``names`` (explicit list), ``glob`` (fnmatch pattern over column names),
    ``index`` ([start, stop) over the dataset's feature columns) or ``block``
    (a contiguous block by feature ratios, :class:`RatioBlock`)."""

    names: list[str] | None = None
    glob: str | None = None
    index: list[int] | None = Field(default=None, min_length=2, max_length=2)
    block: RatioBlock | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ColumnSelect:
        given = [k for k in ("names", "glob", "index", "block") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'names', 'glob', 'index' or 'block'")
        if self.index is not None and not (0 <= self.index[0] < self.index[1]):
            raise ValueError("index must be [start, stop) with 0 <= start < stop")
        return self


class CsvSource(Strict):
    """A party's own CSV file: an ID column, its feature columns and, for the active
    party only, the label column."""

    path: str
    id_column: str = "id"
    label_column: str | None = None
    feature_columns: list[str] | None = Field(
        default=None,
        description="passive default: every column but the ID; active default: none (label-only)",
    )


MAX_WIDTH = 1 << 16
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
"""A layer width or tensor extent: positive and small enough to allocate."""


#: The built-in models' options, written at the top level of a model entry.
BUILTIN_OPTIONS: dict[str, tuple[str, ...]] = {"mlp": ("hidden",), "cnn": ("input_shape", "channels")}
_BUILTIN_FIELDS = frozenset(f for fields in BUILTIN_OPTIONS.values() for f in fields)


class ModelSpec(Strict):
    """A bottom model: a registered ``kind`` or a ``factory`` named by import path.

    Built in: ``mlp``, a Linear/ReLU stack of widths ``hidden`` to ``out``; ``cnn``,
    a small conv net over ``input_shape`` (channels, height, width; e.g. an image
    half) with ``channels`` filters. Plugins register more kinds
    (:mod:`securevfl.plugins`), which take their options under ``params``. A
    ``factory: "package.module:callable"`` is called in the owner's rank alone,
    and imported only where the invocation allows the module (SECURITY.md §4b;
    the loader imports it there to check its signature), as
    ``callable(in_features, out, **params)``; it returns a
    ``torch.nn.Module`` mapping a batch of the party's features (float32, one row
    per record) to ``out`` columns. ``out`` is the embedding width, the one
    contract between a bottom model and the exchange; every backend takes any
    bottom model that keeps it.

    ``init``: ``private`` (the default) draws the initial weights in the owner's
    rank from its own secret randomness, so no other party can compute them;
    ``seeded`` derives them from the protocol's shared seed, as every party can:
    for runs compared step by step (two backends, a reference model, a resumed run
    against an uninterrupted one), not for private runs (SECURITY.md §7)."""

    kind: str = Field(default="mlp", pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
    factory: str | None = Field(
        default=None,
        pattern=REF_PATTERN,
        description="package.module:callable, called as callable(in_features, out, **params)",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="a factory's or registered model's options"
    )
    out: Width = 64
    init: Literal["private", "seeded"] = "private"
    hidden: list[Width] = Field(default_factory=lambda: [64])
    input_shape: list[Width] | None = Field(default=None, min_length=3, max_length=3)
    channels: Width = 8

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        # checked on values, not on the keys written, so that a dumped entry loads again
        if self.factory is not None and self.kind != "mlp":
            raise ValueError(
                "give either 'kind' (a registered model) or 'factory' (an import path), not both"
            )
        builtin = None if self.factory is not None else BUILTIN_OPTIONS.get(self.kind)
        if builtin is None:
            defaults = ModelSpec.model_fields
            stray = [
                f
                for f in sorted(_BUILTIN_FIELDS)
                if getattr(self, f) != defaults[f].get_default(call_default_factory=True)
            ]
            if stray:
                what = f"factory '{self.factory}'" if self.factory else f"model '{self.kind}'"
                raise ValueError(
                    f"'{stray[0]}' is an option of the built-in mlp and cnn models; {what} takes its "
                    "options under 'params'"
                )
        elif self.params:
            raise ValueError(
                f"the built-in '{self.kind}' model takes its options ({', '.join(builtin)}) at the top "
                "level of the model entry, not under 'params'"
            )
        if self.kind == "cnn" and self.factory is None and self.input_shape is None:
            raise ValueError("a cnn bottom model needs input_shape: [channels, height, width]")
        return self

    def builtin_params(self) -> dict[str, Any] | None:
        """The keyword arguments of a built-in model (its top-level options), or
        None for a factory or a registered model (which take ``params``)."""
        names = None if self.factory is not None else BUILTIN_OPTIONS.get(self.kind)
        return None if names is None else {n: getattr(self, n) for n in names}


class ComponentSpec(Strict):
    """A registered component (defense, attack) by name plus its own parameters,
    which the component validates with its own options model."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class CategoricalSpec(Strict):
    """One-hot encoding of a party's categorical columns (scikit-learn's
    ``OneHotEncoder``). A missing value is a category of its own (``missing``).

    ``other: true`` (default): categories seen on fewer than ``min_frequency``
    training rows share one "other" column, and a category never seen in training
    is encoded into that column (or, when no training category was that rare, as
    no category at all: every one-hot column 0). ``other: false``: a category not
    seen in training is an error naming the party and the column."""

    columns: list[str] = Field(min_length=1)
    min_frequency: int = Field(
        default=1, ge=1, description="training rows a category needs for its own column"
    )
    max_categories: int | None = Field(
        default=None,
        ge=1,
        description="keep only this many most frequent categories of each column (the training rows' "
        "top-k), the rest sharing the 'other' column",
    )
    other: bool = True

    @model_validator(mode="after")
    def _other_bucket(self) -> CategoricalSpec:
        for field, grouped in (
            ("min_frequency > 1", self.min_frequency > 1),
            ("max_categories", self.max_categories is not None),
        ):
            if grouped and not self.other:
                raise ValueError(f"{field} groups categories into the 'other' bucket: set other: true")
        return self


class ImputeSpec(Strict):
    """Numeric imputation (scikit-learn's ``SimpleImputer``) with, by default, a
    0/1 missing-indicator column for every column that had missing training values."""

    strategy: Literal["mean", "median", "constant"] = "mean"
    fill_value: float = Field(default=0.0, description="the value 'constant' fills in")
    indicator: bool = True
    columns: list[str] | None = Field(
        default=None, description="the numeric columns that may hold missing values; default: all"
    )


class PreprocessSpec(Strict):
    """A party's own preprocessing (docs/design.md §12), fitted on its aligned training
    rows only and applied unchanged to its test rows. Numeric columns go through
    ``log1p`` or ``signed_log1p`` (if listed), imputation (if declared) and
    standardization (if on), in that order; categorical columns are one-hot encoded. Without a ``preprocess``
    entry a party's data must be numeric and complete, as before."""

    categorical: CategoricalSpec | None = None
    impute: ImputeSpec | None = None
    log1p: list[str] = Field(default_factory=list, description="numeric columns replaced by log(1 + x)")
    signed_log1p: list[str] = Field(
        default_factory=list,
        description="numeric columns replaced by sign(x) log(1 + |x|) (heavy-tailed counts that can be "
        "negative, e.g. Criteo's I2)",
    )
    standardize: bool | list[str] = Field(
        default=True,
        description="z-score the numeric columns: true (all), false (none) or a list of the numeric "
        "columns to z-score (this replaces dataset.standardize)",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> PreprocessSpec:
        cats = set(self.categorical.columns) if self.categorical else set()
        imputed = set(self.impute.columns or [] if self.impute else [])
        numeric = set(self.log1p) | set(self.signed_log1p) | imputed
        both = sorted(cats & numeric)
        if both:
            raise ValueError(f"columns {both[:5]} are declared both categorical and numeric")
        twice = sorted(set(self.log1p) & set(self.signed_log1p))
        if twice:
            raise ValueError(f"columns {twice[:5]} are listed under both log1p and signed_log1p")
        if isinstance(self.standardize, list):
            scaled_cats = sorted(cats & set(self.standardize))
            if scaled_cats:
                raise ValueError(
                    f"standardize lists categorical columns {scaled_cats[:5]}: it z-scores numeric columns"
                )
            repeated = sorted({c for c in self.standardize if self.standardize.count(c) > 1})
            if repeated:
                raise ValueError(f"standardize lists columns {repeated[:5]} more than once")
        return self

    def standardized(self, numeric: list[str]) -> list[str]:
        """The columns of ``numeric`` (a party's numeric feature columns) that are z-scored."""
        if isinstance(self.standardize, bool):
            return list(numeric) if self.standardize else []
        chosen = set(self.standardize)
        return [c for c in numeric if c in chosen]


PIN_PATTERN = r"^(ed25519|sha256):[0-9a-f]{64}$"
"""A pinned identity: the party's Ed25519 public key (``ed25519:<hex>``) or its
fingerprint (``sha256:<hex>``), as ``securevfl keygen`` prints them."""


class PredictionBudgetSpec(Strict):
    """A party's own limit on what ``securevfl predict`` may release about its
    records: the composed eps (at ``privacy.delta``) of every prediction of one
    saved model. A prediction that would take the total above it is refused
    before any rank releases anything."""

    epsilon: float = Field(
        gt=0, description="refuse a prediction that would take the composed eps above this"
    )


class PartySpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
    key: str | None = Field(
        default=None,
        pattern=PIN_PATTERN,
        description="the party's pinned identity key or fingerprint (securevfl keygen); its rank "
        "must present this key at start-up",
    )
    columns: ColumnSelect | None = None
    source: CsvSource | None = None
    model: ModelSpec | None = None
    defenses: list[ComponentSpec] = Field(default_factory=list)
    preprocess: PreprocessSpec | None = None
    prediction_budget: PredictionBudgetSpec | None = Field(
        default=None,
        description="the most this party's predictions from a saved model may spend, composed over "
        "every prediction of that model (docs/privacy.md, 'Predictions spend privacy')",
    )


MAX_PASSIVE = 32
"""The most passive parties a protocol holds: every party is its own process (a
local run starts them all on one machine) and runs a key exchange with every
other rank at start-up."""


class PartiesSpec(Strict):
    active: PartySpec = Field(default_factory=lambda: PartySpec(name="active"))
    passive: list[PartySpec] = Field(min_length=1, max_length=MAX_PASSIVE)


MAX_SYNTHETIC_ROWS = 50_000_000
MAX_SYNTHETIC_VALUES = 1 << 30
"""A synthetic table is generated in float64 in one process: at most 8 GiB of it."""


class SyntheticParams(Strict):
    rows: int = Field(default=2000, gt=10, le=MAX_SYNTHETIC_ROWS)
    features: int = Field(default=20, gt=1, le=MAX_WIDTH)
    classes: int = Field(default=2, ge=2, le=MAX_WIDTH)
    informative: int | None = None
    label_noise: float = Field(
        default=0.01, ge=0.0, lt=1.0, description="fraction of labels drawn at random (over-fitting studies)"
    )

    @model_validator(mode="after")
    def _fits(self) -> SyntheticParams:
        if self.rows * self.features > MAX_SYNTHETIC_VALUES:
            raise ValueError(
                f"rows x features = {self.rows * self.features:,} values: a synthetic table holds at "
                f"most {MAX_SYNTHETIC_VALUES:,} (8 GiB in float64)"
            )
        return self


class DatasetSpec(Strict):
    name: str
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    standardize: bool | None = Field(
        default=None, description="z-score each party's columns on its training rows"
    )
    synthetic: SyntheticParams | None = None


class ExchangeSpec(Strict):
    backend: str = "plain"
    params: dict[str, Any] = Field(default_factory=dict)


class InteractiveSpec(Strict):
    """z = sum_i h'_i W_i (+ h_0 W_0) + b, then the top model.

    The passive parties' blocks W_i are updated by SGD with momentum under every
    backend: under the crypto backends W_i exists only as shares, and the update
    must be linear to stay inside the secure computation. Using the same rule for
    ``plain`` keeps every backend comparable to it.
    """

    out: Width = 64
    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)


class TopSpec(Strict):
    """The active party's top model g(z), from the interactive layer's output z
    (``interactive.out`` columns) to the task's outputs (the classes, or one value
    for a regression). Built in: ReLU on z, then Linear/ReLU layers of widths
    ``hidden``, then the output layer. A ``factory: "package.module:callable"`` is
    imported and called in the active party's rank alone, where its invocation
    allows the module (SECURITY.md §4b), as ``callable(in_features, outputs,
    **params)``; its module gets z as it is (no ReLU first). The top model's
    initial weights come from the shared seed (SECURITY.md §7)."""

    hidden: list[Width] = Field(default_factory=list)
    factory: str | None = Field(
        default=None,
        pattern=REF_PATTERN,
        description="package.module:callable, called as callable(in_features, outputs, **params)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the factory's options")

    @model_validator(mode="after")
    def _one_source(self) -> TopSpec:
        if self.factory is not None and self.hidden:
            raise ValueError("'hidden' is an option of the built-in top model; a factory takes 'params'")
        if self.factory is None and self.params:
            raise ValueError("'params' are a factory's options: the built-in top model takes 'hidden'")
        return self


class TrainingSpec(Strict):
    epochs: int = Field(default=10, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=0.01, gt=0)
    optimizer: Literal["sgd", "adam"] = "adam"
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = 0
    eval_every: int = Field(default=1, ge=1, description="evaluate every N epochs")
    max_steps: int | None = Field(
        default=None, ge=1, description="stop after this many training steps (benchmarks)"
    )
    loss: Literal["mse", "huber"] | None = Field(
        default=None,
        description="regression loss, mse by default (regression only; huber: delta 1 on the scaled target)",
    )
    checkpoint_every: int | None = Field(
        default=None,
        ge=1,
        description="every N epochs each rank saves its own state under OUT/ranks/rank<R>/checkpoints/ "
        "(securevfl run --resume continues from the newest one every rank holds); default: off",
    )
    local_steps: int = Field(
        default=1,
        ge=1,
        description="FedBCD local steps R: the parties exchange once per R batches (the embeddings "
        "of all R, then their gradients) and each takes R local steps on what the others sent; "
        "needs a backend with capability 'local_steps'",
    )


class RuntimeSpec(Strict):
    startup_timeout_s: float = Field(default=60.0, gt=0)
    peer_timeout_s: float = Field(default=15.0, gt=0, description="a peer silent this long is declared lost")
    op_timeout_s: float = Field(default=900.0, gt=0, description="one send/recv at most")
    user_code_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="one call into the rank's user code (a model factory, a defense hook) at most: past "
        "it the run stops, naming the rank and the call, instead of its peers waiting op_timeout_s",
    )
    record_views: bool = Field(default=True, description="keep received tensors for attacks")
    dump_views: bool = Field(
        default=False,
        description="each rank saves what it received (and passive parties their embeddings) "
        "to ranks/rank<R>.view.pt, for wire audits",
    )
    trace_steps: int = Field(
        default=0, ge=0, description="A saves z and the loss of the first N training steps (tests)"
    )
    view_memory_mib: float = Field(
        default=256.0,
        gt=0,
        description="received tensors a rank keeps in memory for the attacks or the view dump; "
        "beyond this they are spilled, as raw bytes, to ranks/rank<R>.received.bin until the view is saved",
    )


class BudgetSpec(Strict):
    epsilon: float = Field(gt=0, description="stop training before any party's composed eps exceeds this")


class AuditSpec(Strict):
    """The privacy audit every party runs on its own DP mechanisms after training
    (docs/privacy.md, "The audit"): ``trials`` runs of each mechanism's hook on canaries
    at its declared boundary (half choose the test's threshold, half are counted), and the
    ``confidence`` of the lower bound on epsilon it reports."""

    enabled: bool = True
    trials: int = Field(default=20_000, ge=200, le=10_000_000, description="canary trials per mechanism")
    confidence: float = Field(default=0.95, ge=0.5, lt=1, description="confidence of the audited lower bound")


class PrivacySpec(Strict):
    """Accounting settings (docs/design.md §7): the delta every (eps, delta) is reported at,
    an optional budget that truncates training before it is exceeded, and the audit of
    each DP mechanism as it ran (``audit``)."""

    delta: float = Field(default=1e-5, gt=0, lt=1)
    budget: BudgetSpec | None = None
    noise_seed: int | None = Field(
        default=None,
        description="pin the defenses' private noise for a reproducible experiment; anyone who knows "
        "it can remove the noise, so leave it unset (fresh OS entropy per party) in a real run",
    )
    audit: AuditSpec = Field(default_factory=AuditSpec)


class SecuritySpec(Strict):
    """Identities of the ranks (SECURITY.md §7). Parties pin their keys
    under their own entries (``parties.*.key``); helper ranks a backend adds (the
    ``mpc`` backend's TTP ``dealer``) pin theirs here by helper name.
    ``require_pinned_keys``: ``auto`` (the default) requires a pinned key for every
    rank whenever the run spans hosts (a rendezvous that is not a loopback
    address, or ranks reporting different hosts) and not for ranks that all run
    on one machine over loopback; ``true`` always requires them; ``false`` accepts
    a rank whose key is not pinned with whatever key it presents (its frames are
    still sealed, but it is not authenticated), with a warning when the run spans
    hosts (SECURITY.md §4a)."""

    require_pinned_keys: Literal["auto"] | bool = Field(
        default="auto",
        description="auto: pinned keys required when the run spans hosts; true: always; false: never "
        "(unpinned ranks are not authenticated)",
    )
    helper_keys: dict[str, Annotated[str, Field(pattern=PIN_PATTERN)]] = Field(
        default_factory=dict, description="helper name (e.g. 'dealer') -> pinned key or fingerprint"
    )


#: A task by its registered name: built in ``binary``, ``multiclass``, ``regression``;
#: plugins register more (:func:`securevfl.plugins.register_task`).
TaskKind = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.=,+-]{0,99}$"
"""A protocol name: it names the run's default output folder (``runs/<name>``,
``runs/<name>-rank<R>``), so it cannot hold a path separator or start with a dot."""


class Protocol(Strict):
    name: str = Field(description="names the default output folder runs/<name>")
    description: str = ""
    task: TaskKind | None = Field(
        default=None,
        description="what the label column is (binary, multiclass, regression, or a task a plugin "
        "registers); default: inferred from it at the active party "
        "(non-integer numbers: regression; else binary or multiclass by the number of classes)",
    )
    plugins: list[Annotated[str, Field(pattern=MODULE_PATTERN)]] = Field(
        default_factory=list,
        description="modules imported in every rank, and by validate, before the protocol is checked: they "
        "register defenses, attacks, datasets, tasks or models (securevfl.plugins); a party imports only "
        "those its invocation allows (SECURITY.md §4b)",
    )
    dataset: DatasetSpec
    parties: PartiesSpec
    exchange: ExchangeSpec = Field(default_factory=ExchangeSpec)
    interactive: InteractiveSpec = Field(default_factory=InteractiveSpec)
    top: TopSpec = Field(default_factory=TopSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    attacks: list[ComponentSpec] = Field(default_factory=list)
    privacy: PrivacySpec = Field(default_factory=PrivacySpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    # the folder of the protocol file it was read from, where the file's own modules
    # lie (set by securevfl.app.loader); not part of the document, its dump or its digest
    _folder: str | None = PrivateAttr(default=None)

    @property
    def folder(self) -> str | None:
        """The folder of the protocol file this was read from (None for a protocol
        given as a mapping): the API checks a protocol given back to it again,
        finding the file's own modules there (:mod:`securevfl.usercode`)."""
        return self._folder

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str) -> str:
        if not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(
                "a protocol name names its output folder (runs/<name>): a letter or digit, then at most "
                "99 letters, digits or . _ - + = , (no path separator, no leading dot)"
            )
        return name

    @model_validator(mode="after")
    def _unique_names(self) -> Protocol:
        names = [self.parties.active.name] + [p.name for p in self.parties.passive]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"party names must be unique, repeated: {sorted(dup)}")
        if self.security.require_pinned_keys is True:
            unpinned = [p.name for p in [self.parties.active, *self.parties.passive] if p.key is None]
            if unpinned:
                raise ValueError(
                    f"security.require_pinned_keys is on but parties {unpinned} pin no key "
                    "(add key: ed25519:... under each party entry; securevfl keygen prints it)"
                )
        return self

    # -- derived layout ------------------------------------------------------
    @property
    def n_passive(self) -> int:
        return len(self.parties.passive)

    def digest(self) -> str:
        """Stable hash of what the parties must agree on; every rank checks it at
        start-up so that ranks started on different hosts run the same protocol,
        and a checkpoint or a saved model is used only under the protocol it was
        written for.

        It covers the protocol as the user gave it: every field that differs from
        its schema default (pydantic's ``exclude_defaults``), so a later securevfl
        that adds a field whose default keeps the old behaviour reads the same
        digest, and saved runs stay usable. The schema's version
        (:data:`SCHEMA_VERSION`) is part of it (``v<N>-<hex>``): a change that makes
        a saved run mean something else bumps it, and such a run is then refused
        as saved by an incompatible securevfl (:meth:`digest_mismatch`).

        Where each party keeps its own file (``source.path``) is that party's
        business, not something to agree on: it is left out, so identical
        protocol files kept in different folders (relative paths resolve per
        host) agree. So is a party's ``prediction_budget``: its own limit, which it
        alone enforces, and which it may change without retraining."""
        doc = self.model_dump(mode="json", exclude_defaults=True)
        parties = doc.get("parties", {})
        for entry in [parties.get("active") or {}, *(parties.get("passive") or [])]:
            if entry.get("source"):
                entry["source"].pop("path", None)
            entry.pop("prediction_budget", None)
        blob = json.dumps(doc, sort_keys=True).encode()
        return f"v{SCHEMA_VERSION}-{hashlib.sha256(blob).hexdigest()[:16]}"

    def legacy_digest(self) -> str:
        """The digest securevfl wrote before :data:`SCHEMA_VERSION` (16 hex digits
        over every field, defaults included, but for the few listed below). A run
        saved then is still used when this matches: the protocol has not changed
        and this securevfl's schema has no field that securevfl lacked."""
        doc = self.model_dump(mode="json")
        for entry in [doc["parties"]["active"], *doc["parties"]["passive"]]:
            if entry.get("source"):
                entry["source"].pop("path", None)
            if entry.get("key") is None:  # unset: digests of protocols without keys stay as they were
                entry.pop("key", None)
            # each party's own policy, checked by that party alone: a new budget keeps its saved models usable
            entry.pop("prediction_budget", None)
            _drop_defaults(entry.get("model"), MODEL_DEFAULTS)
        _drop_defaults(doc["top"], MODEL_DEFAULTS)
        if not doc["plugins"]:
            doc.pop("plugins")
        if doc["security"] == SecuritySpec().model_dump(mode="json"):
            doc.pop("security")
        doc["runtime"].pop("user_code_timeout_s", None)  # each rank's bound on its own code
        if doc["privacy"].get("audit") == AuditSpec().model_dump(mode="json"):
            doc["privacy"].pop("audit")  # the default audit leaves digests as they were
        blob = json.dumps(doc, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def digest_mismatch(self, saved: str) -> str | None:
        """Why a run whose files carry the protocol digest ``saved`` may not be used
        under this protocol, in words for the user; None when it may."""
        return digest_mismatch(saved, self.digest(), self.legacy_digest)


#: The protocol schema's version, part of every digest (:meth:`Protocol.digest`). Bump it
#: when a change makes a run saved under the old schema mean something else under the new
#: one: a default changed, a field's meaning changed, a field removed or renamed. A new
#: field whose default keeps the old behaviour needs no bump (the digest leaves defaults out).
SCHEMA_VERSION = 2


def digest_mismatch(saved: str, current: str, legacy: Callable[[], str]) -> str | None:
    """Why a saved digest ``saved`` does not vouch for the protocol whose digest is
    ``current`` (``legacy``: its digest as securevfl wrote it before the schema
    version), or None when it does."""
    if saved == current:
        return None
    version = re.fullmatch(r"v(\d+)-[0-9a-f]{16}", saved)
    if version is None:
        if re.fullmatch(r"[0-9a-f]{16}", saved) and saved == legacy():
            return None
        return (
            "saved by an older securevfl, whose digest covers every protocol field: the protocol was "
            "changed after the run, or this securevfl's protocol schema is incompatible with the one "
            "that saved it"
        )
    if int(version.group(1)) != SCHEMA_VERSION:
        return (
            f"saved by a securevfl with protocol schema v{version.group(1)}, incompatible with this "
            f"one's v{SCHEMA_VERSION}: train again, or use the securevfl that saved it"
        )
    return "written for a different protocol (the protocol was changed after the run)"


#: Model fields whose default leaves a protocol's digest as it was before they existed.
MODEL_DEFAULTS: dict[str, Any] = {"factory": None, "params": {}, "init": "private"}


def _drop_defaults(entry: dict[str, Any] | None, defaults: Mapping[str, Any]) -> None:
    for key, value in defaults.items():
        if entry is not None and key in entry and entry[key] == value:
            del entry[key]
