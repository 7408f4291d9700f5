"""Python objects where a protocol file names a path or a name: the half of
``securevfl.api`` that takes a script's own classes and callables.

A protocol mapping given to :func:`securevfl.api.run` or
:func:`securevfl.api.compare` may hold

* a :class:`~securevfl.defenses.base.Defense` subclass where a defense entry's
  ``name`` goes, or as the whole entry (``defenses: [TopK]``);
* an :class:`~securevfl.attacks.base.Attack` subclass likewise, in ``attacks``;
* a callable (a function or a class) where a model's ``factory`` goes
  (``parties.passive[i].model.factory``, ``parties.active.model.factory``,
  ``top.factory``).

Every rank is its own OS process, so an object cannot travel to it: it travels as
its reference, ``"package.module:name"`` (:func:`reference_of`), which each rank
imports. An object qualifies when that reference leads back to it: a class or
function defined at the top level of an importable module. Refused, with a
:class:`~securevfl.errors.ConfigError` naming the field: a lambda, anything
defined inside a function, a nested class, a callable object (an instance), a
``functools.partial``, and an object whose module does not hold it under its name.

Objects of the script being run (module ``__main__``). Every rank re-imports the
script's main module when it starts (``spawn`` and ``forkserver`` alike, as
``__mp_main__``), but ``__main__`` is no name a rank, a later command or another
host can import by. A script run as a file (``python exp.py``) or as a module
(``python -m pkg.exp``) is importable by its module name (``exp``, ``pkg.exp``:
its folder is on the ranks' ``sys.path``, which they take from the caller), so
its objects are referred to under that name; each rank then imports the script
once more under it, which runs its top level again (behind the ``if __name__ ==
"__main__":`` guard a script that launches runs needs anyway). A main module
with no such name (an interactive session, a notebook, ``python -c``, a file
whose name is not a Python identifier) is refused: put the object in a module
beside the script.

Who may run the code a reference names (SECURITY.md §4b, :mod:`securevfl.usercode`):
the caller of the local launcher is the author of the protocol and runs every
party, so the modules of the objects it passed are allowed for that launch and
for nothing else. A factory's reference is written into the protocol, whose own
modules the local launch allows (:data:`~securevfl.app.loader.OWN`); the modules
of defense and attack classes are added to the launcher's policy
(:meth:`~securevfl.usercode.CodePolicy.allowing`), under which every rank loads
them. The classes are registered under their ``name`` for the call
(:func:`registered`, in the calling process) and in every rank it starts
(:func:`register_in_rank`, loaded by reference under the rank's policy as the
rank starts), never beyond. A ``securevfl party`` process is not the caller's: a
reference in its protocol is held to its own ``--allow-plugin`` like any other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from securevfl.attacks.base import ATTACKS, Attack
from securevfl.defenses.base import DEFENSES, Defense
from securevfl.errors import ConfigError
from securevfl.registry import PATH, Registry
from securevfl.usercode import CodePolicy

Kind = Literal["defense", "attack"]

#: what each kind of component is, and the registry a name goes into
KINDS: dict[Kind, tuple[type, Registry[Any]]] = {"defense": (Defense, DEFENSES), "attack": (Attack, ATTACKS)}


@dataclass(frozen=True)
class Registration:
    """A component class registered under ``name`` for one call: the class itself
    in the calling process (``cls``), its ``reference`` in the ranks."""

    kind: Kind
    name: str
    reference: str
    cls: Any = field(default=None, compare=False, repr=False)

    @property
    def module(self) -> str:
        """The module the class is imported from in a rank."""
        return self.reference.partition(":")[0]

    def for_rank(self) -> tuple[str, str, str]:
        """What a rank is given: kind, name and reference (plain data)."""
        return (self.kind, self.name, self.reference)


@dataclass(frozen=True)
class Converted:
    """A protocol mapping with its objects replaced (``doc``: plain data, as a
    file would hold), the classes to register for the call, and the modules the
    references name (allowed for the call's own launch)."""

    doc: dict[str, Any]
    registrations: tuple[Registration, ...] = ()
    modules: tuple[str, ...] = ()


def _main_module_name() -> str | None:
    """The name the running script is importable by (None: it has none)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name.removesuffix(".__main__"))  # python -m pkg.exp (or -m pkg)
    file = getattr(main, "__file__", None)
    if not file:
        return None  # an interactive session, python -c, a notebook
    stem = Path(file).stem
    if not stem.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    if origin is None or Path(origin).resolve() != Path(file).resolve():
        return None  # the folder is not on sys.path, or another module has that name
    return stem


def reference_of(obj: Any, *, field: str) -> str:
    """``"package.module:name"`` of a top-level class or function, which every
    rank can import; anything else is refused with a ConfigError at ``field``."""
    what = getattr(obj, "__name__", None) or type(obj).__name__
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not module or not qualname:
        raise ConfigError(
            f"{what!r} is not a class or a function defined at the top level of a module; every party "
            "runs in its own process and imports what the protocol names, so give a module-level "
            "class or function",
            path=field,
        )
    if qualname == "<lambda>":
        raise ConfigError(
            "a lambda has no name a party's process can import it by; define a function at the top "
            "level of a module",
            path=field,
        )
    if "<locals>" in qualname or "." in qualname:
        raise ConfigError(
            f"{qualname} is defined inside a function or a class; a party's process can import only "
            "what a module defines at its top level",
            path=field,
        )
    if module == "__main__":
        name = _main_module_name()
        main = sys.modules.get("__main__")
        if name is None or getattr(main, qualname, None) is not obj:
            raise ConfigError(
                f"{qualname} is defined in a main module that cannot be imported by name (an "
                "interactive session, a notebook, python -c, or a script whose folder is not on "
                "sys.path); put it in a module beside the script and import it from there",
                path=field,
            )
        module = name
    else:
        held = getattr(sys.modules.get(module), qualname, None)
        if held is not obj:
            raise ConfigError(
                f"{module}:{qualname} does not lead back to the object given (its module holds "
                "something else under that name); give the object its module defines",
                path=field,
            )
    reference = f"{module}:{qualname}"
    if not PATH.match(reference):
        raise ConfigError(f"{reference!r} is not a 'package.module:name' reference", path=field)
    return reference


def _component_class(obj: Any, kind: Kind, field: str) -> str:
    """A component class's registered name (checked: the kind's subclass with a name)."""
    base, _ = KINDS[kind]
    if not (inspect.isclass(obj) and issubclass(obj, base)):
        raise ConfigError(f"expected a {kind} name or a {base.__name__} subclass, got {obj!r}", path=field)
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{obj.__qualname__} has no `name` (a class attribute) to register it under", path=field
        )
    return name


def _is_object(value: Any) -> bool:
    return inspect.isclass(value) or callable(value)


def _refuse_objects(node: Any, path: str) -> None:
    """A class or callable anywhere else is refused, naming where it is."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _refuse_objects(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _refuse_objects(v, f"{path}[{i}]")
    elif _is_object(node):
        raise ConfigError(
            f"a Python object ({getattr(node, '__qualname__', type(node).__name__)}) where the protocol "
            "takes plain data; objects go only where a defense's or an attack's name or a model's "
            "factory goes",
            path=path,
        )


class _Converter:
    def __init__(self) -> None:
        self.registrations: dict[tuple[Kind, str], Registration] = {}
        self.modules: dict[str, None] = {}

    def reference(self, obj: Any, field: str) -> str:
        ref = reference_of(obj, field=field)
        self.modules[ref.partition(":")[0]] = None
        return ref

    def component(self, entry: Any, kind: Kind, field: str) -> Any:
        """An entry of ``defenses`` / ``attacks``: a class, or a mapping whose
        ``name`` may be one."""
        if isinstance(entry, Mapping):
            if not _is_object(entry.get("name")):
                return dict(entry)
            return {**entry, "name": self._register(entry["name"], kind, f"{field}.name")}
        if _is_object(entry):
            return {"name": self._register(entry, kind, field)}
        return entry

    def _register(self, cls: Any, kind: Kind, field: str) -> str:
        name = _component_class(cls, kind, field)
        reference = self.reference(cls, field)
        _, registry = KINDS[kind]
        if name in registry and registry.get(name, path=field) is not cls:
            raise ConfigError(
                f"{cls.__qualname__} is named '{name}', which is already the name of another {kind}; "
                "give it a name of its own",
                path=field,
            )
        earlier = self.registrations.get((kind, name))
        if earlier is not None and earlier.reference != reference:
            raise ConfigError(
                f"two different {kind} classes are named '{name}' ({earlier.reference}, {reference})",
                path=field,
            )
        self.registrations[(kind, name)] = Registration(kind, name, reference, cls)
        return name

    def model(self, spec: Any, field: str) -> Any:
        if isinstance(spec, Mapping) and _is_object(spec.get("factory")):
            return {**spec, "factory": self.reference(spec["factory"], f"{field}.factory")}
        return spec

    def party(self, spec: Any, field: str) -> Any:
        if not isinstance(spec, Mapping):
            return spec
        out = dict(spec)
        if "model" in out:
            out["model"] = self.model(out["model"], f"{field}.model")
        if isinstance(out.get("defenses"), list):
            out["defenses"] = [
                self.component(d, "defense", f"{field}.defenses[{i}]") for i, d in enumerate(out["defenses"])
            ]
        return out


def convert(doc: Mapping[str, Any]) -> Converted:
    """Replace the objects of a protocol mapping by names and references (see
    the module's docstring); the mapping given is left as it was. Raises a
    ConfigError naming the field for an object that cannot be referred to, or
    one anywhere else."""
    c = _Converter()
    out = dict(doc)
    parties = out.get("parties")
    if isinstance(parties, Mapping):
        parties = dict(parties)
        if "active" in parties:
            parties["active"] = c.party(parties["active"], "parties.active")
        if isinstance(parties.get("passive"), list):
            parties["passive"] = [
                c.party(p, f"parties.passive[{i}]") for i, p in enumerate(parties["passive"])
            ]
        out["parties"] = parties
    if "top" in out:
        out["top"] = c.model(out["top"], "top")
    if isinstance(out.get("attacks"), list):
        out["attacks"] = [c.component(a, "attack", f"attacks[{i}]") for i, a in enumerate(out["attacks"])]
    _refuse_objects(out, "")
    return Converted(out, tuple(c.registrations.values()), tuple(c.modules))


@contextlib.contextmanager
def registered(registrations: tuple[Registration, ...]) -> Iterator[None]:
    """Register the classes in this process for the duration of the block (for
    the checks at load and the attacks the launcher runs after training), and
    remove them afterwards; a name already registered to the same class (a
    module that registers its own classes) is left as it is. The class objects
    themselves: importing a script's reference here would run the script again."""
    added: list[tuple[Registry[Any], str]] = []
    try:
        for r in registrations:
            _, registry = KINDS[r.kind]
            if r.name not in registry:
                registry.add(r.name, r.cls)
                added.append((registry, r.name))
        yield
    finally:
        for registry, name in added:
            registry.remove(name)


def register_in_rank(registrations: Sequence[tuple[str, str, str]], code: CodePolicy) -> None:
    """A rank of the caller's launch: load each class by its reference (kind,
    name, reference: :meth:`Registration.for_rank`) under the rank's user code
    policy ``code`` (the launcher's, which allows the modules of its caller's
    classes: :meth:`~securevfl.usercode.CodePolicy.allowing`) and register it under
    its name, unless importing its module registered it already (a module that
    registers its own classes); whatever else the rank had under that name gives
    way (the caller checked that no other class has it)."""
    for kind, name, reference in registrations:
        cls = code.load(reference, what=f"{kind} class '{name}' ({reference})", path=kind + "s")
        _, registry = KINDS[kind]  # type: ignore[index]
        if name not in registry or registry.get(name) is not cls:
            registry.add(name, cls, force=True)
