"""securevfl from Python: load a protocol, run it, compare several, predict,
attack a finished run again.

The same code the command line runs (``securevfl run | compare | predict |
party`` are thin layers over these functions), so a script gets the same checks,
the same output folders and the same results::

    from securevfl import api

    proto = api.load_protocol("protocols/ckks.yaml", overrides={"training.max_steps": 20})
    result = api.run(proto, out="runs/ckks")          # a RunResult: result.json, typed
    print(result.test_accuracy, result.bytes_per_step)
    table = api.compare(["protocols/ckks.yaml", "protocols/vfl_afe_ckks.yaml"], seeds=[0, 1])
    print(table.frame)                                 # one row per protocol (pandas)
    pred = api.predict("runs/ckks", out="runs/ckks-pred")
    print(pred.frame.head())
    again = api.attack("runs/ckks", "label_norm", params={"party": "left"})
    print(again.score)                                 # RUN/attacks/<key>.json

Every party is still its own OS process: :func:`run`, :func:`compare` and
:func:`predict` start one process per rank (as ``securevfl run`` does) and wait for
them. A script that calls them at its top level needs an
``if __name__ == "__main__":`` guard, because each rank re-imports the script's main
module when it starts; without one the ranks refuse to launch again and the call
raises :class:`~securevfl.errors.SecureVFLError`.

Errors are :mod:`securevfl.errors`' exceptions (a bad protocol or override raises
:class:`~securevfl.errors.ConfigError` naming the field; a failed rank
:class:`~securevfl.errors.PartyFailure` or the error class of its root cause);
nothing here exits the interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from securevfl.api.arguments import (
    Overrides,
    callback_arg,
    check_flags,
    data_list,
    kind_of,
    optional_path,
    path_arg,
    plugin_list,
    seed_list,
    set_list,
)
from securevfl.api.results import AttackRerun, Comparison, ComparisonRow, Prediction, RunResult, run_result
from securevfl.app.attack_run import attack_run
from securevfl.app.compare_runs import execute
from securevfl.app.comparison import folder_name, say_stderr, sources_from_paths
from securevfl.app.comparison import plan as make_plan
from securevfl.app.grid import Axis, make_axis, parse_axis
from securevfl.app.launcher import launch
from securevfl.app.loader import OWN, Allow, allowed_modules, load_checked, load_checked_dict, needed_code
from securevfl.app.objects import Converted, Registration, convert, registered
from securevfl.app.party import run_party
from securevfl.app.predict import predict_local
from securevfl.attacks.base import Attack
from securevfl.components import CheckedProtocol
from securevfl.config import Protocol
from securevfl.errors import ConfigError
from securevfl.records import EpochRecord, MechanismPrivacy, PartyPrivacy, PrivacyReport
from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.compare import write_comparison
from securevfl.usercode import policy_of

__all__ = [
    "AttackRerun",
    "Comparison",
    "ComparisonRow",
    "EpochRecord",
    "MechanismPrivacy",
    "Overrides",
    "PartyPrivacy",
    "Prediction",
    "PrivacyReport",
    "ProtocolLike",
    "RunResult",
    "attack",
    "compare",
    "load_protocol",
    "party",
    "predict",
    "run",
]

#: What the functions below accept as a protocol: a protocol file's path, a parsed
#: protocol document (a mapping, as the YAML file would read; :func:`run` and
#: :func:`compare` also take classes and callables in it, see :func:`run`), or a
#: loaded protocol.
ProtocolLike = str | os.PathLike[str] | Mapping[str, Any] | Protocol


# -- protocols --------------------------------------------------------------------------------


def load_protocol(
    source: ProtocolLike,
    overrides: Overrides | None = None,
    *,
    allow_plugins: Sequence[str] | None = None,
    rank: int | None = None,
) -> Protocol:
    """Load and check a protocol, as ``securevfl run FILE --set ...`` does.

    ``source`` is a protocol file (YAML), a protocol document as a mapping, or a
    :class:`~securevfl.config.Protocol` already loaded. ``overrides`` change fields
    first, as ``--set`` does: ``{"training.max_steps": 20, "parties.passive[0].model.out": 32}``
    (list indices allowed) or ``["training.max_steps=20"]``. The protocol is then
    validated against the schema, the registries and its components' options;
    anything wrong raises :class:`~securevfl.errors.ConfigError` naming the field.
    CSV paths in a file are taken relative to the file's folder, in a mapping
    relative to the working directory.

    User code (SECURITY.md §4b): ``allow_plugins`` None (the default) allows the
    modules the protocol names itself (its ``plugins`` and model factories, found
    first beside the file), as ``securevfl run`` does for its author; a list
    allows those modules alone, as ``securevfl party --allow-plugin`` does, and
    any other module the protocol would make this process import is refused
    before anything is imported. ``rank``: the rank this process will run, whose
    model factories are checked with the plugins.

    A :class:`~securevfl.config.Protocol` given to this or any function below is
    checked again, as given (its own modules still found beside the file it was
    read from): what a function runs is always what it checked itself."""
    allow: Allow = OWN if allow_plugins is None else allowed_modules(allow_plugins)
    return _check(source, overrides, allow, rank).protocol


def _check(
    source: ProtocolLike, overrides: Overrides | None, allow: Allow, rank: int | None
) -> CheckedProtocol:
    """The one check at the API's boundary: whatever the caller gave (a file, a
    mapping, a Protocol), loaded and checked by the checked loader, with its
    resolved components (:class:`~securevfl.components.CheckedProtocol`), which
    the function that called this passes down."""
    sets = set_list(overrides)
    if isinstance(source, Mapping):
        converted = convert(source)
        if converted.registrations:
            r = converted.registrations[0]
            raise ConfigError(
                f"load_protocol takes {r.kind}s by name; a {r.kind} class ({r.reference}) goes to run() or "
                "compare(), which register it for their runs",
                path=r.kind + "s",
            )
        source = converted.doc
    if isinstance(source, Protocol):
        return load_checked_dict(
            source.model_dump(mode="json"),
            overrides=sets,
            allow=allow,
            rank=rank,
            beside=Path(source.folder) if source.folder else None,
        )
    if isinstance(source, Mapping):
        return load_checked_dict(dict(source), overrides=sets, allow=allow, rank=rank)
    if isinstance(source, (str, os.PathLike)):
        return load_checked(path_arg(source, "protocol"), sets, allow=allow, rank=rank)
    raise ConfigError(
        f"a protocol is a file path, a mapping or a Protocol, not {type(source).__name__}", path="protocol"
    )


def _converted(protocol: ProtocolLike) -> tuple[ProtocolLike, Converted]:
    """A protocol mapping with its classes and callables replaced by names and
    references (:func:`securevfl.app.objects.convert`); anything else as it is."""
    if isinstance(protocol, Mapping):
        conv = convert(protocol)
        return conv.doc, conv
    return protocol, Converted({})


def _load(protocol: ProtocolLike, overrides: Overrides | None) -> CheckedProtocol:
    """:func:`_check` of what :func:`_converted` gave (its classes registered)."""
    if isinstance(protocol, Mapping):  # the caller's own: its modules are allowed (OWN)
        return load_checked_dict(dict(protocol), overrides=set_list(overrides), allow=OWN)
    return _check(protocol, overrides, OWN, None)


# -- running ----------------------------------------------------------------------------------


def run(
    protocol: ProtocolLike,
    *,
    out: str | os.PathLike[str] | None = None,
    overrides: Overrides | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> RunResult:
    """Run every rank of a protocol on this machine, one OS process each, then the
    protocol's attacks (``securevfl run``); return the run's result record.

    ``out``: the output folder (default ``runs/<protocol name>``); a folder that
    already holds results is refused unless ``overwrite``, and then the earlier
    result is replaced only once the new run has finished (a failed run leaves it
    untouched and its own files in ``OUT/failed-run``). ``resume``: continue the
    interrupted run in ``out`` from the newest checkpoint every rank holds.
    ``data_dir``: where built-in datasets are materialized (default ``OUT/data``).
    ``progress``: the active party's progress display on stderr (``--quiet`` is
    ``progress=False``). ``overrides`` as for :func:`load_protocol`.

    ``on_epoch``: called in this process with an :class:`EpochRecord` (epoch, steps,
    training loss, the epoch's evaluation metrics, seconds so far, and the privacy
    the active party's own mechanisms spent so far) as each epoch ends; the record
    is what the active party's progress line shows, sent by its rank to this
    process. If it raises, every rank is stopped, the run ends as a failed run does
    (an earlier result in ``out`` stays) and the exception propagates unchanged.

    A protocol given as a mapping may hold Python objects where a file names
    something (:mod:`securevfl.app.objects`): a ``Defense`` or ``Attack`` subclass
    for a defense's or an attack's ``name`` (or as the whole entry), registered
    under its ``name`` for this run, in this process and in every rank; a
    callable for a model's ``factory``. Each must be defined at the top level of a
    module the ranks can import (the running script counts when it is run as a
    file or with ``-m``); a lambda, a local function or class, or an object of an
    interactive session is refused with a ConfigError naming the field.

    Raises :class:`~securevfl.errors.ConfigError` for a bad protocol or folder, and
    for a failed run the error of its root cause, naming the rank."""
    out_path, data_path = optional_path(out, "out"), optional_path(data_dir, "data_dir")
    check_flags(overwrite=overwrite, resume=resume, progress=progress)
    callback_arg(on_epoch, "on_epoch")
    given, conv = _converted(protocol)
    with registered(conv.registrations):
        checked = _load(given, overrides)
        folder = out_path if out_path is not None else Path("runs") / checked.protocol.name
        result = launch(
            checked,
            folder,
            data_dir=data_path,
            progress=progress,
            overwrite=overwrite,
            resume=resume,
            on_epoch=on_epoch,
            registrations=conv.registrations,
        )
    return run_result(result, folder)


def _axes(grid: Mapping[str, Sequence[Any]] | Sequence[str] | None) -> list[Axis]:
    if grid is None:
        return []
    if isinstance(grid, str):
        raise ConfigError(
            "a grid is a mapping or a list of KEY=V1,V2,... strings, not one string", path="--grid"
        )
    if not isinstance(grid, (Mapping, Sequence)) or isinstance(grid, bytes):
        raise ConfigError(
            f"a grid is a mapping or a list of KEY=V1,V2,... strings, not {kind_of(grid)}", path="--grid"
        )
    if isinstance(grid, Mapping):
        axes = []
        for key, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ConfigError(f"the grid's values for {key} must be a list", path="--grid")
            axes.append(make_axis(str(key), list(values)))
        return axes
    items = [g for g in grid if not isinstance(g, str)]
    if items:
        raise ConfigError(f"a grid axis is a KEY=V1,V2,... string, not {kind_of(items[0])}", path="--grid")
    return [parse_axis(g) for g in grid]


def _items(sources: ProtocolLike | Sequence[ProtocolLike]) -> list[ProtocolLike]:
    if isinstance(sources, (str, os.PathLike, Mapping, Protocol)) and not isinstance(sources, bytes):
        return [sources]
    if not isinstance(sources, Sequence) or isinstance(sources, bytes):
        raise ConfigError(
            "sources are protocol files, folders or protocols (a path, a mapping, a Protocol or a list "
            f"of them), not {kind_of(sources)}",
            path="sources",
        )
    kinds = (str, os.PathLike, Mapping, Protocol)
    bad = [s for s in sources if not isinstance(s, kinds) or isinstance(s, bytes)]
    if bad:
        raise ConfigError(
            f"a source is a protocol file or folder, a mapping or a Protocol, not {kind_of(bad[0])}",
            path="sources",
        )
    if not sources:
        raise ConfigError("sources name no protocol to compare", path="sources")
    return list(sources)


def _registrations(converted: Sequence[Converted]) -> tuple[Registration, ...]:
    """The classes of every protocol of a comparison, each name once."""
    found: dict[tuple[str, str], Registration] = {}
    for conv in converted:
        for r in conv.registrations:
            earlier = found.setdefault((r.kind, r.name), r)
            if earlier.reference != r.reference:
                raise ConfigError(
                    f"two different {r.kind} classes are named '{r.name}' ({earlier.reference}, "
                    f"{r.reference})",
                    path=r.kind + "s",
                )
    return tuple(found.values())


def _silent(msg: str) -> None:
    """A ``say`` that says nothing (``progress=False``)."""


def _own_classes_header(registrations: Sequence[Registration]) -> str:
    """A protocol file's opening comment when it names the script's own classes: the
    command line knows them only once a plugin module registers them under those names."""
    if not registrations:
        return ""
    lines = [
        "# This protocol names classes a script registered for one call; `securevfl` on the command",
        "# line knows them only once a plugin module registers them (docs/extending.md): decorate",
        "# each with securevfl.plugins' register_<kind> in an importable module and list that module",
        "# under plugins:. The classes:",
    ]
    lines += [f"#   {r.kind} '{r.name}': {r.reference}" for r in registrations]
    return "\n".join(lines) + "\n"


def _source_paths(
    items: Sequence[ProtocolLike], folder: Path, registrations: Sequence[Registration] = ()
) -> list[Path]:
    """Files to compare: paths as given; a protocol given as a mapping or a
    :class:`Protocol` is checked, then written to ``folder/protocols/<name>.yaml``
    (CSV paths made absolute) and compared from there, so the comparison folder
    keeps what it compared."""
    paths: list[Path] = []
    written: set[str] = set()
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            paths.append(path_arg(item, "sources"))
            continue
        proto = _load(item, None).protocol
        if proto.name in written:
            raise ConfigError(
                f"two protocols are both named '{proto.name}': protocol names must be distinct to "
                "compare them",
                path="name",
            )
        written.add(proto.name)
        doc = proto.model_dump(mode="json")
        for entry in [doc["parties"]["active"], *doc["parties"]["passive"]]:
            src = entry.get("source")
            if src and not Path(src["path"]).is_absolute():
                src["path"] = str(Path(src["path"]).resolve())
        path = folder / "protocols" / f"{folder_name(proto.name)}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = _own_classes_header(registrations)
        path.write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths


def compare(
    sources: ProtocolLike | Sequence[ProtocolLike],
    *,
    seeds: Sequence[int] | None = None,
    grid: Mapping[str, Sequence[Any]] | Sequence[str] | None = None,
    overrides: Overrides | None = None,
    out: str | os.PathLike[str] = "runs/compare",
    overwrite: bool = False,
    progress: bool = True,
    title: str | None = None,
    status: bool | None = None,
) -> Comparison:
    """Run several protocols, per seed and grid point, and summarize them
    (``securevfl compare``); return the :class:`Comparison` (``.frame`` is the
    table, one row per protocol).

    ``sources``: protocol files, folders of protocol files, or one comparison file
    (a YAML file with a ``comparison:`` title, listing protocol files with their
    own overrides and grids, and the seeds); protocols may also be given as
    mappings or loaded :class:`~securevfl.config.Protocol` objects, which are
    written to ``OUT/protocols/<name>.yaml`` and compared from there. ``seeds``: run each protocol once per
    seed (``training.seed``; default: a comparison file's seeds, else each
    protocol's own); the table gives each metric's mean and 95% interval over
    them. ``grid``: expand every protocol into one run per value and combination,
    ``{"parties.active.defenses[0].params.epsilon": [0.5, 1, 2]}`` or
    ``["parties.active.defenses[0].params.epsilon=0.5,1,2"]``. ``overrides`` apply
    to every protocol, as ``--set``.

    ``out`` is a cache: run ``r`` of seed ``s`` lives in ``OUT/<protocol>[/<grid
    point>]/seed<s>``, and a run already finished there with the same protocol is
    reused (``overwrite`` runs everything again), so an interrupted comparison
    continues where it stopped. Every run is validated before any starts. The
    comparison files (compare.json, compare.csv, runs.csv, report.md and figures)
    are written to ``out``, under ``title`` (default: a comparison file's title,
    else "securevfl compare"). ``progress``: each run's progress display; ``status``: the
    comparison's status lines on stderr (how many runs, which one runs now; default: as
    ``progress``, so ``progress=False`` prints nothing but a warning that a cached run is not
    reused; ``securevfl compare --quiet`` keeps them).

    Protocols given as mappings may hold classes and callables as for :func:`run`;
    their classes are registered for the comparison's runs (the protocol files
    written to ``OUT/protocols`` name them by their ``name``). The table typed:
    :attr:`Comparison.rows`, with each party's privacy as for a run
    (``table.rows[0].privacy_of("left").epsilon``)."""
    folder = path_arg(out, "out")
    check_flags(overwrite=overwrite, progress=progress)
    if status is not None:
        check_flags(status=status)
    if title is not None and not isinstance(title, str):
        raise ConfigError(f"title is a string, not {kind_of(title)}", path="title")
    wanted = seed_list(seeds)
    sets = set_list(overrides)
    pairs = [_converted(item) for item in _items(sources)]
    regs = _registrations([conv for _, conv in pairs])
    with registered(regs):
        paths = _source_paths([given for given, _ in pairs], folder, regs)
        file_title, found, file_seeds = sources_from_paths(paths, sets, _axes(grid))
        title = title or file_title
        chosen = wanted if wanted is not None else file_seeds
        say = say_stderr if (progress if status is None else status) else _silent
        plan = make_plan(title, found, chosen, folder, say=say)  # every run validated before any starts
        done = execute(plan, folder, rerun=overwrite, progress=progress, say=say, registrations=regs)
        records = [
            RunRecord(
                label=r.label, base=r.base, seed=r.seed, result=res, point=r.point, folder=str(r.folder)
            )
            for r, res in done
        ]
        files = write_comparison(folder, records, plan.axes, title=title)
    return Comparison(title, folder, records, summarize(records), files)


def predict(
    run: str | os.PathLike[str] | RunResult,
    *,
    out: str | os.PathLike[str],
    data: Mapping[str, str | os.PathLike[str]] | Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> Prediction:
    """Apply a trained model to new records, every rank on this machine, one OS
    process each (``securevfl predict``); return the :class:`Prediction`.

    ``run``: the training run's output folder (or its :class:`RunResult`). Every
    party loads its own saved model from there and its own file of new records:
    the file its party entry names, or the one ``data`` gives (``{"left":
    "new_left.csv"}``); the parties align the IDs by PSI and the run's exchange
    backend computes the scores, so the active party still sees no embedding under
    a crypto backend. ``out``: the folder for predictions.csv and prediction.json
    (not the run's own folder; a folder holding results is refused unless
    ``overwrite``). ``data_dir``: where built-in datasets are materialized
    (default: ``RUN/data`` where the training run left them, else a temporary
    folder removed when the prediction ends; the run's folder is only read)."""
    if isinstance(run, RunResult):
        run_dir = run.folder
    elif isinstance(run, (str, os.PathLike)):
        run_dir = path_arg(run, "run")
    else:
        raise ConfigError(
            f"run is a training run's folder (a path) or its RunResult, not {kind_of(run)}", path="run"
        )
    out_path, data_path = path_arg(out, "out"), optional_path(data_dir, "data_dir")
    check_flags(overwrite=overwrite)
    record, path = predict_local(
        run_dir,
        out_path,
        data=data_list(data),
        data_dir=data_path,
        overwrite=overwrite,
    )
    return Prediction.model_validate({**record.model_dump(), "folder": path.parent})


def attack(
    run: str | os.PathLike[str] | RunResult,
    attack: str | type[Attack],
    *,
    params: Mapping[str, Any] | None = None,
    plugins: Sequence[str] = (),
) -> AttackRerun:
    """Run an attack again on a finished run's saved views, in this process
    (``securevfl attack RUN --attack NAME``; docs/attacks.md, "Attacking a finished
    run"); return its :class:`AttackRerun`.

    ``run``: the run's output folder (or its :class:`RunResult`); it must have saved
    its views (its protocol listed attacks or set ``runtime.dump_views``). ``attack``:
    a registered attack's name, or an :class:`~securevfl.attacks.base.Attack`
    subclass of the caller's own (registered under its ``name`` for this call only,
    as :func:`run` registers one). ``params``: the attack's options, validated as in
    a protocol file. ``plugins``: modules of the caller's own to import first, each
    allowed as ``--plugin`` allows it (an installed module by name, a file by its
    path, ``NAME=sha256:HEX``). Nothing is trained; the views are loaded with
    ``weights_only=True``; the run's ``result.json`` is left as it was and the
    attack's entry goes to ``RUN/attacks/<key>.json``.

    Raises :class:`~securevfl.errors.ConfigError` naming the field for an unknown
    attack, a bad option or a run without saved views."""
    if isinstance(run, RunResult):
        run_dir = run.folder
    elif isinstance(run, (str, os.PathLike)):
        run_dir = path_arg(run, "run")
    else:
        raise ConfigError(
            f"run is a finished run's folder (a path) or its RunResult, not {kind_of(run)}", path="run"
        )
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(
            f"params is a mapping of the attack's options, not {kind_of(params)}", path="params"
        )
    given = plugin_list(plugins)
    if isinstance(attack, type):  # the caller's own class: registered under its name for this call
        conv = convert({"attacks": [{"name": attack}]})
        name: str = conv.doc["attacks"][0]["name"]
    elif isinstance(attack, str):
        conv, name = None, attack
    else:
        raise ConfigError(
            f"attack is a registered attack's name or an Attack subclass, not {kind_of(attack)}",
            path="attack",
        )
    with registered(conv.registrations if conv is not None else ()):
        key, entry, path = attack_run(run_dir, name, dict(params or {}), given)
    return AttackRerun(key, entry, path)


def party(
    protocol: ProtocolLike,
    *,
    rank: int,
    rendezvous: str,
    out: str | os.PathLike[str] | None = None,
    overrides: Overrides | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
    predict: str | os.PathLike[str] | None = None,
    data: Mapping[str, str | os.PathLike[str]] | Sequence[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    allow_plugins: Sequence[str] = (),
) -> Path:
    """Run one rank of a protocol in this process (``securevfl party``): the way
    each organization runs its own party when the parties are on different hosts.
    Returns its output folder.

    ``rendezvous``: ``tcp://HOST:PORT``, hosted by rank 0; every rank is started
    with the same protocol and address. ``key``: this party's secret key file
    (``securevfl keygen``); required when the protocol pins this rank's key,
    otherwise a throw-away key is used and the peers cannot authenticate this rank.
    ``predict``: predict with this rank's model saved in that training run's
    folder instead of training (every rank of the prediction is started so), with
    ``data`` naming this party's file of new records. ``out``: default
    ``runs/<name>-rank<R>`` (``runs/<name>-predict-rank<R>`` for a prediction).
    Other options as for :func:`run`.

    ``allow_plugins``: the modules this party may import for the protocol (a
    plugin it names, this party's model factory; a name allows its submodules).
    The protocol file may come from another organization: naming a module in it
    never makes this process import it (SECURITY.md §4b). Anything the rank
    would import that is not allowed is refused before anything is imported,
    with :class:`~securevfl.errors.UserCodeError` naming each. A
    :class:`~securevfl.config.Protocol` given loaded is checked again under
    ``allow_plugins``, as a file would be.

    This process becomes the rank: it runs until the protocol ends. A failed rank
    reports its error itself (stderr, its error file, its peers) and this raises
    :class:`~securevfl.errors.RankFailed` with the rank's exit code."""
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ConfigError(f"rank is an integer, not {kind_of(rank)}", path="rank")
    if not isinstance(rendezvous, str):
        raise ConfigError(
            f"rendezvous is a string tcp://HOST:PORT, not {kind_of(rendezvous)}", path="rendezvous"
        )
    check_flags(overwrite=overwrite, resume=resume, progress=progress)
    allowed = allowed_modules(allow_plugins)
    checked = _check(protocol, overrides, allowed, rank)
    code = policy_of(allowed, checked.code.beside)
    code.check(needed_code(checked.protocol, rank))
    return run_party(
        checked.with_code(code),
        rank,
        rendezvous,
        out=optional_path(out, "out"),
        data_dir=optional_path(data_dir, "data_dir"),
        key=optional_path(key, "key"),
        predict=optional_path(predict, "predict"),
        data=data_list(data),
        overwrite=overwrite,
        resume=resume,
        progress=progress,
    )
