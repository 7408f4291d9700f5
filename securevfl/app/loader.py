"""The checked protocol loader: a YAML file (or a parsed mapping) plus ``--set``
overrides, both read by :mod:`securevfl.app.yamldoc`, validated against the
schema (:mod:`securevfl.config`) and then cross-checked against the registries
(:mod:`securevfl.validation`), which validates every component's options once.
The result is a :class:`~securevfl.components.CheckedProtocol`: the protocol with
its resolved components, which the caller passes down to whatever needs them
(:func:`load_checked`, :func:`load_checked_dict`, :func:`resolve_protocol`);
:func:`load_protocol` and :func:`load_protocol_dict` run the same checks and
return the bare protocol, for a caller that needs only the schema's fields.

Between the two, the protocol's ``plugins`` are imported, under the user code
policy of the process (:mod:`securevfl.usercode`): ``allow`` names what its
invocation allows (``securevfl party`` and ``validate``: ``--allow-plugin``, an
installed module by name, a file by path or by pinned digest), or is
:data:`OWN`, every module the file names itself (the local launcher, run by the
file's author: those beside the file by path). Every module the process would import for the protocol (its
plugins and, given ``rank``, the model factories that rank runs) is checked
before any is imported. Once the file is checked, each model factory the
process may import (every party's its policy allows, or given ``rank`` that
rank's own) is imported and its signature matched against the call securevfl
makes (:func:`check_factories`), so that a misspelt factory or option is
refused at load, exit code 2, before any rank starts. The policy travels with the components
(:attr:`~securevfl.components.Components.code`), so the ranks import each
party's factory under it later.

It sits above every registry (exchange backends, defenses, attacks, datasets), so
that the schema below them never imports them back.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from securevfl.app.yamldoc import load_yaml, parse_value
from securevfl.components import CheckedProtocol
from securevfl.config import Protocol
from securevfl.config_errors import format_loc, validation_error
from securevfl.errors import ConfigError, UserCodeError
from securevfl.regular_files import what_is
from securevfl.usercode import (
    CodePolicy,
    Needed,
    check_factory,
    is_allowance,
    own_policy,
    policy_of,
    split_ref,
)
from securevfl.validation import check_protocol, resolve_components

#: a path element ``[*]``: every element of the list at that point (``--set`` and
#: ``--grid`` keys such as ``parties.passive[*].defenses[0].params.epsilon``)
EVERY = "[*]"

_TOKEN = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")

#: ``allow``: every module the protocol names itself (the local launcher's rule).
OWN: Literal["own"] = "own"
Allow = Literal["own"] | Iterable[str]


def allowed_modules(names: Sequence[str]) -> list[str]:
    """What a process allows (``--allow-plugin``, ``allow_plugins``): installed
    module names, files by path, files beside the protocol by pinned digest
    (:func:`securevfl.usercode.policy_of`), each checked to read as one."""
    if isinstance(names, str):
        raise ConfigError("allow_plugins is a list of module names, not one string", path="allow_plugins")
    out = []
    for n in names:
        if not isinstance(n, str) or not is_allowance(n):
            raise ConfigError(
                f"{n!r} is not a module name (package.module), a file path (./mylab.py) or a pinned "
                "file (mylab=sha256:DIGEST)",
                path="--allow-plugin",
            )
        out.append(n)
    return out


def split_override(expr: str, flag: str = "--set") -> tuple[list[str | int], str, str]:
    """``a.b[0].c=raw`` -> (['a', 'b', 0, 'c'], 'a.b[0].c', 'raw'): the key path of an
    override (``--set``, and each ``--grid`` axis) and its unparsed value text.
    ``[*]`` stands for every element of a list (:data:`EVERY`)."""
    what = "override" if flag == "--set" else "grid axis"
    if "=" not in expr:
        raise ConfigError(f"{what} '{expr}' must look like key.path=value", path=flag)
    key, raw = expr.split("=", 1)
    path: list[str | int] = []
    for index, name in _TOKEN.findall(key):
        token = index or name
        if not token:
            continue
        if index and token == "*":
            path.append(EVERY)
        else:
            path.append(int(token) if token.isdigit() else token)
    if not path:
        raise ConfigError(f"{what} '{expr}' has an empty key", path=flag)
    return path, key, raw


def override_expr(key: str, value: Any) -> str:
    """``key=value`` as ``--set`` takes it, for a value given as Python data: the
    value is written as YAML, which :func:`parse_override` reads back as the same
    value (JSON would not do: ``1e-05`` is a string to YAML 1.1, ``1.0e-05`` a float)."""
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True)
    except yaml.YAMLError:
        raise ConfigError(
            f"{value!r} is not plain data (numbers, strings, lists, mappings)", path=key
        ) from None
    text = text.removesuffix("\n").removesuffix("\n...")  # a bare scalar's end-of-document mark
    return f"{key}={text}"


def parse_override(expr: str) -> tuple[list[str | int], Any]:
    """``a.b[0].c=value`` -> (['a', 'b', 0, 'c'], parsed value). Values are YAML."""
    path, key, raw = split_override(expr)
    return path, parse_value(raw, path=key)


def apply_override(doc: dict[str, Any], path: list[str | int], value: Any) -> None:
    """Set ``value`` at ``path`` in ``doc``: mappings on the way are created, a list
    index must exist, and :data:`EVERY` sets it in every element of a non-empty list."""
    _set(doc, path, value, "")


def _set(node: Any, path: list[str | int], value: Any, shown: str) -> None:
    part, rest = path[0], path[1:]
    if part == EVERY:
        if not isinstance(node, list) or not node:
            raise ConfigError("[*] needs a non-empty list here", path=shown + EVERY)
        for j in range(len(node)):
            _set(node, [j, *rest], copy.deepcopy(value), shown)
        return
    shown += f"[{part}]" if isinstance(part, int) else ("." if shown else "") + part
    if isinstance(part, int):
        if not isinstance(node, list) or part >= len(node):
            raise ConfigError("no such list element to override", path=shown)
    elif not isinstance(node, dict):
        raise ConfigError("cannot set a key inside a non-mapping", path=shown)
    if not rest:
        node[part] = value
    elif isinstance(part, int):
        _set(node[part], rest, value, shown)
    else:
        _set(node.setdefault(part, {}), rest, value, shown)


FLOAT32_MAX = 3.4028234663852886e38
INT64_MAX = (1 << 63) - 1


def check_numbers(node: Any, loc: tuple[Any, ...] = (), *, source: str | None = None) -> None:
    """Refuse, anywhere in a protocol document (component ``params`` included),
    a float that is NaN, infinite or beyond float32's range (training runs in
    float32, so such a value becomes inf or NaN on the first step and is then
    blamed on a peer), and an integer beyond int64."""
    if isinstance(node, dict):
        for k, v in node.items():
            check_numbers(v, (*loc, k), source=source)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_numbers(v, (*loc, i), source=source)
    elif isinstance(node, float) and not (math.isfinite(node) and abs(node) <= FLOAT32_MAX):
        what = "not a finite number" if not math.isfinite(node) else "beyond float32's range (3.4e38)"
        if node == math.inf:
            what += "; a privacy budget without noise is written null"
        raise ConfigError(f"{what} (got {node!r})", path=format_loc(loc), source=source)
    elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > INT64_MAX:
        raise ConfigError(f"integer beyond int64's range (got {node})", path=format_loc(loc), source=source)


def load_checked_dict(
    doc: Any,
    *,
    source: str | None = None,
    overrides: list[str] | None = None,
    allow: Allow = (),
    rank: int | None = None,
    beside: Path | None = None,
) -> CheckedProtocol:
    """Validate a protocol given as a parsed mapping (plus ``--set`` overrides) and
    resolve its components. ``allow``: the modules this process may import for it
    (:data:`OWN`: the ones it names); ``rank``: the rank this process runs, whose
    model factories are checked with the plugins before anything is imported;
    ``beside``: the protocol file's folder, where its own modules are found."""
    if not isinstance(doc, dict):
        raise ConfigError("a protocol file must be a YAML mapping", source=source)
    doc = copy.deepcopy(doc)
    for expr in overrides or []:
        path, value = parse_override(expr)
        apply_override(doc, path, value)
    check_numbers(doc, source=source)
    try:
        proto = Protocol.model_validate(doc)
    except ValidationError as exc:
        raise validation_error(exc, source=source) from None
    if beside is not None:
        proto._folder = str(Path(beside).resolve())
    code = code_policy(proto, allow, beside)
    import_plugins(proto, code, rank=rank, source=source)
    # component-level checks (registries, capabilities, column layout); returns the
    # components with their validated options
    components = check_protocol(proto, source=source)
    check_factories(proto, code, rank=rank, source=source)
    check_data_files(proto, beside or Path.cwd(), rank=rank, source=source)
    return CheckedProtocol(proto, dataclasses.replace(components, code=code))


def load_protocol_dict(
    doc: Any,
    *,
    source: str | None = None,
    overrides: list[str] | None = None,
    allow: Allow = (),
    rank: int | None = None,
    beside: Path | None = None,
) -> Protocol:
    """:func:`load_checked_dict`'s protocol alone (every check run), for a caller
    that reads the schema's fields only."""
    return load_checked_dict(
        doc, source=source, overrides=overrides, allow=allow, rank=rank, beside=beside
    ).protocol


def check_data_files(proto: Protocol, base: Path, *, rank: int | None, source: str | None = None) -> None:
    """Refuse a party's CSV path (relative ones under ``base``) that leads to
    anything but a regular file, before any rank starts: ``/dev/zero`` would be
    read without end, a named pipe block the rank until its timeout. Given
    ``rank``, the file of that rank's party only (another party's path names a
    file on its own host); a path that does not exist is left to the rank, which
    says so."""
    entries = [("parties.active", proto.parties.active)] + [
        (f"parties.passive[{i}]", p) for i, p in enumerate(proto.parties.passive)
    ]
    for i, (where, party) in enumerate(entries):
        if party.source is None or (rank is not None and rank != i):
            continue
        path = Path(party.source.path)
        kind = what_is(path if path.is_absolute() else base / path)
        if kind is not None:
            raise ConfigError(
                f"party '{party.name}': {party.source.path} is {kind}, not a CSV file",
                path=f"{where}.source.path",
                source=source,
            )


def code_policy(proto: Protocol, allow: Allow, beside: Path | None) -> CodePolicy:
    """The user code policy of a process loading ``proto``: what ``allow`` names
    (:func:`~securevfl.usercode.policy_of`), or with :data:`OWN` every module the
    protocol names, those beside its file by path
    (:func:`~securevfl.usercode.own_policy`)."""
    where = str(Path(beside).resolve()) if beside is not None else None
    if isinstance(allow, str):
        if allow != OWN:
            raise ValueError(f"allow is {OWN!r} or a list of module names, not {allow!r}")
        return own_policy({n.module for n in needed_code(proto, None, factories=True)}, where)
    return policy_of(allow, where)


@dataclass(frozen=True)
class FactoryEntry:
    """A model entry that names a factory: its reference, ``params``, the party
    that runs it, whether it is the top model, and its YAML path."""

    ref: str
    params: dict[str, Any]
    party: str
    top: bool
    path: str

    @property
    def what(self) -> str:
        """How messages name it (as :mod:`securevfl.models` does when it builds it)."""
        return f"{'top' if self.top else 'bottom'} model of party '{self.party}': factory '{self.ref}'"


def factory_entries(proto: Protocol, rank: int | None, *, every: bool = False) -> list[FactoryEntry]:
    """The model factories the party of ``rank`` runs (rank 0 the active party
    with its top model, then the passive parties; a helper rank has none); with
    ``every``, every party's."""
    out = []
    active = proto.parties.active
    if (every or rank == 0) and active.model is not None and active.model.factory is not None:
        out.append(
            FactoryEntry(
                active.model.factory, active.model.params, active.name, False, "parties.active.model"
            )
        )
    if (every or rank == 0) and proto.top.factory is not None:
        out.append(FactoryEntry(proto.top.factory, proto.top.params, active.name, True, "top"))
    for i, p in enumerate(proto.parties.passive):
        if (every or rank == i + 1) and p.model is not None and p.model.factory is not None:
            out.append(
                FactoryEntry(p.model.factory, p.model.params, p.name, False, f"parties.passive[{i}].model")
            )
    return out


def needed_code(proto: Protocol, rank: int | None, *, factories: bool = False) -> list[Needed]:
    """The modules a process imports for ``proto``: its plugins (every process
    does), and the model factories of the party of ``rank`` (rank 0 the active
    party with its top model, then the passive parties; a helper rank has none);
    with ``factories``, every party's."""
    out = [Needed(m, f"plugin '{m}'", f"plugins[{i}]") for i, m in enumerate(proto.plugins)]
    for e in factory_entries(proto, rank, every=factories):
        what = f"model factory '{e.ref}' of party '{e.party}'"
        out.append(Needed(split_ref(e.ref)[0], what, f"{e.path}.factory"))
    return out


def check_factories(proto: Protocol, code: CodePolicy, *, rank: int | None, source: str | None) -> None:
    """Check, at load, the model factories this process may import: every
    party's whose module ``code`` allows (the local launcher: the file's own;
    ``validate``: what ``--allow-plugin`` allows), or with ``rank`` its own
    party's. Each is imported, found, and its signature matched against
    ``factory(in_features, out, **params)`` (:func:`~securevfl.usercode.check_factory`).
    A factory whose module this process may not import is a peer's, checked
    in its owner's rank."""
    for e in factory_entries(proto, rank, every=rank is None):
        if not code.allows(split_ref(e.ref)[0]):
            continue
        try:
            check_factory(code, e.ref, e.params, what=e.what, path=f"{e.path}.factory", layout=not e.top)
        except UserCodeError as exc:
            if source is None:
                raise
            raise UserCodeError(exc.message, path=exc.path, source=source, detail=exc.detail) from None


def import_plugins(proto: Protocol, code: CodePolicy, *, rank: int | None, source: str | None) -> None:
    """Check every module this process would import for ``proto`` (its plugins,
    and the factories of ``rank``'s party) against ``code``, then import the
    plugins, which register their components as they are imported."""
    try:
        code.check(needed_code(proto, rank))
        for i, module in enumerate(proto.plugins):
            code.import_module(module, what=f"plugin '{module}'", path=f"plugins[{i}]")
    except UserCodeError as exc:
        if source is None:
            raise
        raise UserCodeError(exc.message, path=exc.path, source=source, detail=exc.detail) from None


def resolve_protocol(
    proto: Protocol, code: CodePolicy | None = None, *, rank: int | None = None
) -> CheckedProtocol:
    """Resolve the components of a protocol that was checked elsewhere (a rank
    spawned by the local launcher receives it as JSON from the launcher, which
    loaded and checked the file, with the launcher's ``code`` policy): the
    plugins are imported under ``code`` (checked with ``rank``'s factories
    first), then every component's options are validated, once in that process."""
    code = code or CodePolicy()
    import_plugins(proto, code, rank=rank, source=None)
    return CheckedProtocol(proto, dataclasses.replace(resolve_components(proto), code=code))


def read_protocol_file(p: Path) -> Any:
    """The YAML document of the protocol file ``p``, refusing what is missing,
    unreadable or not UTF-8 text (a ConfigError naming the file). Reads and
    parses only: :func:`load_checked_dict` checks the document."""
    try:
        found = p.is_file()
    except OSError as exc:  # a name longer than its file system allows
        raise ConfigError(f"cannot read the file: {exc.strerror}", source=str(p)) from None
    if not found:
        raise ConfigError(f"protocol file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not a text file (protocol files are UTF-8 YAML)", source=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", source=str(p)) from None
    if "\x00" in text:
        raise ConfigError("not a text file (it contains NUL bytes)", source=str(p))
    return load_yaml(text, source=str(p))


def load_protocol(
    path: str | Path, overrides: list[str] | None = None, *, allow: Allow = (), rank: int | None = None
) -> Protocol:
    """:func:`load_checked`'s protocol alone (every check run), for a caller that
    reads the schema's fields only."""
    return load_checked(path, overrides, allow=allow, rank=rank).protocol


def load_checked(
    path: str | Path, overrides: list[str] | None = None, *, allow: Allow = (), rank: int | None = None
) -> CheckedProtocol:
    """Read, validate and cross-check one protocol file and resolve its components;
    its own modules are looked up in its folder (``allow`` and ``rank`` as for
    :func:`load_checked_dict`)."""
    p = Path(path)
    doc = read_protocol_file(p)
    checked = load_checked_dict(
        doc, source=str(p), overrides=overrides, allow=allow, rank=rank, beside=p.parent
    )
    return _resolve_paths(checked, p.parent)


def _resolve_paths(checked: CheckedProtocol, base: Path) -> CheckedProtocol:
    """Make CSV source paths absolute relative to the protocol file's folder."""
    proto = checked.protocol
    parties = [proto.parties.active, *proto.parties.passive]
    if not any(p.source for p in parties):
        return checked
    doc = proto.model_dump(mode="json")
    for entry in [doc["parties"]["active"], *doc["parties"]["passive"]]:
        src = entry.get("source")
        if src and not Path(src["path"]).is_absolute():
            src["path"] = str((base / src["path"]).resolve())
    # where a file lies changes no component's options: keep the ones validated above
    moved = Protocol.model_validate(doc)
    moved._folder = proto.folder
    return CheckedProtocol(moved, checked.components)
