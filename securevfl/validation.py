"""Load-time cross-checks of a protocol against the registries.

Runs after schema validation: names must exist, component parameters must
validate against their own options models (once: the typed options are returned
with the protocol, :mod:`securevfl.components`), and every defense and attack must
be possible under the chosen exchange backend. All errors carry a YAML path.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from securevfl.attacks import ATTACKS
from securevfl.components import Components, PartyComponents, Resolved
from securevfl.config import ComponentSpec, Protocol
from securevfl.config_errors import validation_error
from securevfl.data.catalog import DATASETS, feature_columns
from securevfl.data.columns import PartyLayout, check_standardize, party_layouts, resolve_partition
from securevfl.defenses import DEFENSES
from securevfl.errors import ConfigError, UnsupportedCombination
from securevfl.exchange import EXCHANGES
from securevfl.exchange.spec import ExchangeBackend
from securevfl.model_kinds import MODELS
from securevfl.parties.task_kinds import TASKS
from securevfl.registry import Registry
from securevfl.sizing import check_sizes


def check_protocol(proto: Protocol, *, source: str | None = None) -> Components:
    """Cross-check a schema-valid protocol against the registries; raises a
    :class:`~securevfl.errors.ConfigError` naming the offending YAML path. Returns
    the resolved components (every component's validated options), which the
    loader hands on with the protocol (:class:`~securevfl.components.CheckedProtocol`).

    One step per concern, in this order: the exchange backend, the training
    options it must support, the dataset and each party's columns and model,
    the sizes of what each party trains, the defenses and attacks resolved
    (options validated once), then the checks across components, then the task."""
    backend, options = resolve_exchange(proto, source)
    check_exchange(proto, backend, options, source)
    check_checkpoints(proto, source)
    check_dataset(proto, source)
    check_sizes(proto, input_widths(proto), source=source)
    components = resolve_components(proto, source=source, backend=backend, options=options)
    check_defenses(proto, components, source)
    check_attacks(proto, components, source)
    if proto.task is not None:
        check_task(proto, proto.task, source=source)
    return components


def _err(msg: str, path: str, source: str | None, cls: type[ConfigError] = ConfigError) -> ConfigError:
    return cls(msg, path=path, source=source)


def check_exchange(
    proto: Protocol, backend: type[ExchangeBackend], options: BaseModel, source: str | None = None
) -> None:
    """The backend's own checks of its options, and what the training asks of it
    (a CUDA device, FedBCD local steps)."""
    backend.check(proto, options)
    if proto.training.device == "cuda" and "cuda" not in backend.capabilities:
        raise _err(
            f"backend '{backend.name}' runs on CPU only", "training.device", source, UnsupportedCombination
        )
    if proto.training.local_steps > 1 and "local_steps" not in backend.capabilities:
        raise _err(
            f"local steps (FedBCD) need the active party to recompute z from a round's embeddings alone; "
            f"under backend '{backend.name}' the interactive layer is not A's in the clear, so every local "
            "step would be an interactive round (backends with local steps: "
            f"{', '.join(n for n in EXCHANGES.names() if 'local_steps' in EXCHANGES.get(n).capabilities)})",
            "training.local_steps",
            source,
            UnsupportedCombination,
        )


def check_checkpoints(proto: Protocol, source: str | None = None) -> None:
    """Checkpoints hold no adversary views: refused with attacks or a view dump."""
    if proto.training.checkpoint_every is not None and (proto.attacks or proto.runtime.dump_views):
        # the adversary views recorded before an interruption are not in a checkpoint
        raise _err(
            "checkpoints hold each rank's training state, not the views recorded for attacks or a "
            "view dump, so a resumed run would attack only part of the run: run attacks without "
            "checkpoint_every",
            "training.checkpoint_every",
            source,
            UnsupportedCombination,
        )


def check_dataset(proto: Protocol, source: str | None = None) -> None:
    """The dataset is known, each party's entry fits it (:func:`check_party`), a
    CNN's ``input_shape`` holds the party's columns, and a ``preprocess.standardize``
    list names numeric columns of its party (:func:`check_standardize_lists`)."""
    builtin = proto.dataset.name != "csv"
    if builtin and proto.dataset.name not in DATASETS:
        raise _err(
            f"unknown dataset '{proto.dataset.name}' (known: csv, {', '.join(DATASETS.names())})",
            "dataset.name",
            source,
        )
    if proto.dataset.synthetic is not None and proto.dataset.name != "synthetic":
        raise _err("only the 'synthetic' dataset takes these parameters", "dataset.synthetic", source)
    for lay in party_layouts(proto):
        check_party(lay, builtin=builtin, source=source)
    if builtin:
        check_input_shapes(proto, source)
    check_standardize_lists(proto, source)


def check_party(lay: PartyLayout, *, builtin: bool, source: str | None = None) -> None:
    """One party's entry: columns (a built-in dataset) or its own CSV source, labels
    at the active party alone, and a bottom model exactly where it has features."""
    spec = lay.spec
    if builtin:
        if spec.source is not None:
            raise _err(
                "a built-in dataset is partitioned with 'columns', not 'source'", f"{lay.path}.source", source
            )
        if not lay.is_active and spec.columns is None:
            raise _err("a passive party needs 'columns'", f"{lay.path}.columns", source)
    else:
        if spec.columns is not None:
            raise _err(
                "with dataset 'csv' each party gives its own 'source' file", f"{lay.path}.columns", source
            )
        if spec.source is None:
            raise _err("with dataset 'csv' each party needs a 'source'", f"{lay.path}.source", source)
        if lay.is_active and not spec.source.label_column:
            raise _err(
                "the active party's source needs 'label_column'", f"{lay.path}.source.label_column", source
            )
        if not lay.is_active and spec.source.label_column:
            raise _err("a passive party must not hold labels", f"{lay.path}.source.label_column", source)
    if spec.source is not None:
        # CSV: an active party's features are only those it lists explicitly
        fc = spec.source.feature_columns
        has_features = bool(fc) if lay.is_active else fc != []
    else:
        has_features = spec.columns is not None
    if not lay.is_active and spec.model is None:
        raise _err("a passive party needs a bottom 'model'", f"{lay.path}.model", source)
    if lay.is_active and has_features and spec.model is None:
        raise _err(
            "the active party holds features, so it needs a bottom 'model'", f"{lay.path}.model", source
        )
    if lay.is_active and not has_features and spec.model is not None:
        where = (
            f"list them under {lay.path}.source.feature_columns"
            if spec.source is not None
            else f"choose them under {lay.path}.columns"
        )
        raise _err(
            f"a label-only active party has no bottom model; for an active party that trains on its "
            f"own feature columns, {where}",
            f"{lay.path}.model",
            source,
        )
    if spec.model is not None and spec.model.factory is None and spec.model.kind not in MODELS:
        raise _err(
            f"unknown model '{spec.model.kind}' (known: {', '.join(MODELS.names())}; or name a factory: "
            "factory: package.module:callable)",
            f"{lay.path}.model.kind",
            source,
        )


def check_input_shapes(proto: Protocol, source: str | None = None) -> None:
    """A built-in dataset's CNN bottom model: its ``input_shape`` holds exactly the
    party's selected columns."""
    cols = feature_columns(proto.dataset.name, proto.dataset)
    if cols is None:
        return
    parts = resolve_partition(proto, cols)
    for lay in party_layouts(proto):
        m = lay.spec.model
        if m is not None and m.factory is None and m.kind == "cnn" and m.input_shape is not None:
            c, h, w = m.input_shape
            if c * h * w != len(parts[lay.name]):
                raise _err(
                    f"input_shape {list(m.input_shape)} holds {c * h * w} values but the party "
                    f"has {len(parts[lay.name])} columns",
                    f"{lay.path}.model.input_shape",
                    source,
                )


def check_standardize_lists(proto: Protocol, source: str | None = None) -> None:
    """Each party's ``preprocess.standardize`` list names numeric feature columns
    of its own (:func:`~securevfl.data.columns.check_standardize`, naming the
    party), where the protocol fixes its columns: a built-in dataset's selected
    columns or a CSV party's listed ``feature_columns``; otherwise its rank checks
    the list against its file when it reads it."""
    cols = feature_columns(proto.dataset.name, proto.dataset) if proto.dataset.name != "csv" else None
    parts = resolve_partition(proto, cols) if cols is not None else {}
    for lay in party_layouts(proto):
        pre, src = lay.spec.preprocess, lay.spec.source
        listed = parts.get(lay.name, src.feature_columns if src is not None else None)
        if pre is not None and listed is not None:
            check_standardize(pre, lay.name, listed, path=lay.path, source=source)


def check_defenses(proto: Protocol, components: Components, source: str | None = None) -> None:
    """Each resolved defense runs at its party's side, accepts the training's local
    steps, and passes its own checks (:meth:`~securevfl.defenses.base.Defense.check`)
    and those against the protocol's other components
    (:meth:`~securevfl.defenses.base.Defense.cross_check`)."""
    backend = components.exchange.cls
    for party in components.parties:
        lay_path = "parties.active" if party.index is None else f"parties.passive[{party.index}]"
        for j, d in enumerate(party.defenses):
            cls = d.cls
            if party.side not in cls.sides:
                raise _err(
                    f"defense '{d.name}' runs at the {'/'.join(sorted(cls.sides))} party, "
                    f"not the {party.side} party",
                    f"{lay_path}.defenses[{j}]",
                    source,
                    UnsupportedCombination,
                )
            if proto.training.local_steps > 1 and cls.local_steps_refusal:
                raise _err(
                    f"defense '{d.name}' cannot run with training.local_steps > 1: {cls.local_steps_refusal}",
                    f"{lay_path}.defenses[{j}]",
                    source,
                    UnsupportedCombination,
                )
            cls.check(proto, d.options, backend=backend, path=d.path, source=source)
            cls.cross_check(proto, components, d.options, path=d.path, source=source)


def check_attacks(proto: Protocol, components: Components, source: str | None = None) -> None:
    """Each resolved attack names passive parties that exist (checked now, not after
    training when it runs) and passes its own checks and those against the other
    components."""
    backend = components.exchange.cls
    passive = [p.name for p in proto.parties.passive]
    for a in components.attacks:
        for field in PARTY_FIELDS:
            name = getattr(a.options, field, None)
            if name is not None and name not in passive:
                raise _err(
                    f"attack '{a.name}': {field} '{name}' is not a passive party (passive: {passive})",
                    f"{a.path}.params.{field}",
                    source,
                )
        a.cls.check(proto, a.options, backend=backend, path=a.path, source=source)
        a.cls.cross_check(proto, components, a.options, path=a.path, source=source)


def input_widths(proto: Protocol) -> dict[str, int | None]:
    """Each party's number of input columns where the protocol fixes it: a built-in
    dataset's selected columns, or a CSV party's listed ``feature_columns`` without
    preprocessing (which may add columns); None where only its data file says."""
    cols = feature_columns(proto.dataset.name, proto.dataset) if proto.dataset.name != "csv" else None
    parts = resolve_partition(proto, cols) if cols is not None else {}
    widths: dict[str, int | None] = {}
    for lay in party_layouts(proto):
        src = lay.spec.source
        if lay.name in parts:
            widths[lay.name] = len(parts[lay.name])
        elif src is not None and src.feature_columns is not None and lay.spec.preprocess is None:
            widths[lay.name] = len(src.feature_columns)
        else:
            widths[lay.name] = None
    return widths


def check_task(proto: Protocol, task: str, *, source: str | None = None) -> None:
    """Refuse defenses and attacks that need class labels under a task without
    classes, and a regression loss under a classification task. Runs at load for a
    declared ``task`` and at the active rank once it has inferred one."""
    kind = TASKS.get(task, path="task")
    if kind.has_classes:
        if proto.training.loss is not None:
            raise ConfigError(
                f"training.loss '{proto.training.loss}' is a regression loss; task '{task}' trains with "
                "cross-entropy",
                path="training.loss",
                source=source,
            )
        return
    for lay in party_layouts(proto):
        for j, spec in enumerate(lay.spec.defenses):
            reason = DEFENSES.get(spec.name).needs_classes
            if reason:
                raise UnsupportedCombination(
                    f"defense '{spec.name}' needs class labels ({reason}); task '{task}' has none",
                    path=f"{lay.path}.defenses[{j}]",
                    source=source,
                )
    for j, spec in enumerate(proto.attacks):
        reason = ATTACKS.get(spec.name).needs_classes
        if reason:
            raise UnsupportedCombination(
                f"attack '{spec.name}' needs class labels ({reason}); task '{task}' has none",
                path=f"attacks[{j}]",
                source=source,
            )


def resolve_components(
    proto: Protocol,
    *,
    source: str | None = None,
    backend: type[ExchangeBackend] | None = None,
    options: BaseModel | None = None,
) -> Components:
    """Look up every component of a schema-valid protocol and validate its params
    with its own options model: the one place that does (docs/design.md §8). Unknown names,
    invalid params and capabilities the backend lacks are ConfigErrors naming the
    YAML path. ``backend``/``options``: the exchange, when the caller resolved it."""
    if backend is None or options is None:
        backend, options = resolve_exchange(proto, source)
    exchange = Resolved(backend.name, backend, options, "exchange")
    return Components(
        exchange, resolve_defenses(proto, backend, source), resolve_attacks(proto, backend, source)
    )


def resolve_defenses(
    proto: Protocol, backend: type[ExchangeBackend], source: str | None = None
) -> tuple[PartyComponents, ...]:
    """Every party's defenses, resolved (active party first, then the passive
    parties in order)."""
    parties = []
    passive = [p.name for p in proto.parties.passive]
    for lay in party_layouts(proto):
        resolved = tuple(
            _component("defense", DEFENSES, spec, f"{lay.path}.defenses[{j}]", backend, source)
            for j, spec in enumerate(lay.spec.defenses)
        )
        index = None if lay.is_active else passive.index(lay.name)
        parties.append(PartyComponents(lay.name, "active" if lay.is_active else "passive", index, resolved))
    return tuple(parties)


def resolve_attacks(
    proto: Protocol, backend: type[ExchangeBackend], source: str | None = None
) -> tuple[Resolved, ...]:
    """The protocol's attacks, resolved, in file order."""
    return tuple(
        _component("attack", ATTACKS, spec, f"attacks[{j}]", backend, source)
        for j, spec in enumerate(proto.attacks)
    )


def resolve_exchange(proto: Protocol, source: str | None = None) -> tuple[type[ExchangeBackend], BaseModel]:
    """The exchange backend class and its validated options."""
    try:
        backend = EXCHANGES.get(proto.exchange.backend, path="exchange.backend")
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], path="exchange.backend", source=source) from None
    try:
        options = backend.options.model_validate(proto.exchange.params)
    except ValidationError as exc:
        raise validation_error(exc, prefix="exchange.params", source=source) from None
    return backend, options


# attack options that name a passive party (the victim, or the attacking party)
PARTY_FIELDS = ("target", "party")


def _component(
    kind: str,
    registry: Registry[Any],
    spec: ComponentSpec,
    path: str,
    backend: type[ExchangeBackend],
    source: str | None,
) -> Resolved:
    """A registered defense or attack: known name, valid params, and every backend
    capability it requires."""
    if spec.name not in registry:
        raise _err(
            f"unknown {kind} '{spec.name}' (known: {', '.join(registry.names()) or 'none'})",
            f"{path}.name",
            source,
        )
    cls = registry.get(spec.name)
    try:
        params = cls.options.model_validate(spec.params)
    except ValidationError as exc:
        raise validation_error(exc, prefix=f"{path}.params", source=source) from None
    missing = cls.requires - backend.capabilities
    if missing:
        raise _err(
            f"{kind} '{spec.name}' needs {sorted(missing)}, which backend '{backend.name}' does not offer",
            path,
            source,
            UnsupportedCombination,
        )
    return Resolved(spec.name, cls, params, path)
