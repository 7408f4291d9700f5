"""User code named in a protocol file, and who may import it.

A protocol file may name code of its author's own: ``plugins``, modules that
register defenses, attacks, datasets, tasks or models when imported
(:mod:`securevfl.plugins`), and model factories (``model: {factory:
"package.module:callable"}``). The file travels between organizations, so naming
a module must never make a peer run code that peer did not choose (SECURITY.md
§4b). Every process that would import such code holds a :class:`CodePolicy`: the
modules its own invocation allows. ``securevfl party`` and ``securevfl validate``
allow what ``--allow-plugin`` names and nothing else; the local launcher
(``securevfl run``, ``compare``, ``predict``, :mod:`securevfl.api`), run by the
file's author on one machine, allows the modules the file itself names. A policy
is checked before anything is imported (:meth:`CodePolicy.check`, which names
every module refused), and again by each import (:meth:`CodePolicy.import_module`).

**What an allowance names** (:func:`policy_of`). A party allows code it chose,
never a name whose code the file's sender can supply:

* ``mylab`` (a module name): the party's *installed* module ``mylab`` and its
  submodules, imported from the Python path as any import is. The protocol
  file's folder is never searched for it, so a ``mylab.py`` or a package
  ``mylab/`` sent with the file never replaces it (nor runs in its place when
  ``mylab`` is not installed: the import fails, naming the file and how to
  allow it).
* ``./mylab.py`` or ``./mylab`` (a path: it has a ``/`` or ends in ``.py``): the
  module ``mylab`` is that file, or that package folder (its ``__init__.py``
  and its submodules), wherever it lies: the party names the very file.
* ``mylab=sha256:HEX`` (a pinned digest): the module ``mylab`` is ``mylab.py``
  beside the protocol file, run only if its source hashes to ``HEX``; the bytes
  checked are the bytes run.

A module allowed by file is imported from the bytes read when it is imported
(a finder at the end of ``sys.meta_path`` that answers for those names alone;
``sys.path`` is left as it is), and never under the name of a module installed
elsewhere: a file named ``tenseal.py`` is refused rather than replacing TenSEAL
for securevfl and every library. The local launcher allows the file's own
modules the same way (:func:`own_policy`): a module the file names that lies
beside it (``NAME.py`` or ``NAME/``) is allowed by its path, any other by name.

**References.** User code is named as ``package.module:qualname`` (the qualified
name may be dotted: ``module:Class.method``). It names a function or class
*defined in that module* (its ``__module__``), through classes defined there:
``mylab:os.system`` or ``mylab:np.load`` would otherwise let a file call any
function of any module the allowed one imports, with arguments the file
chooses. The Python API turns an object given to it into its reference
(:func:`securevfl.app.objects.reference_of`) and passes that to the ranks, each of
which loads it under its own policy; :meth:`CodePolicy.load` turns a reference
back into the object.

**Errors.** A refused module, one that cannot be found or raises while it is
imported, a file whose digest does not match its pin, and a reference to a
missing attribute or to one defined elsewhere, and a model factory that cannot
be called as securevfl calls it (:func:`check_factory`) are :class:`UserCodeError`: exit
code 2, no traceback; the exception's own text and the line in the user's file
that raised it go to ``detail`` (the owner's stderr only: the text may quote
data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import inspect
import re
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from securevfl.errors import UserCodeError

#: A module name: ``package.module``.
MODULE_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"
#: A reference to an object in a module: ``package.module:qualname``.
REF_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"
_REF = re.compile(REF_PATTERN)
#: A module beside the protocol file pinned by the SHA-256 of its source: ``NAME=sha256:HEX``.
_PIN = re.compile(r"^([A-Za-z_]\w*)=sha256:([0-9A-Fa-f]{64})$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")
#: Where a refused or failed allowance points (the flag, and ``allow_plugins`` in the API).
FLAG = "--allow-plugin"

#: How a party allows a module: the flag and the API argument (for messages).
HOW_TO_ALLOW = (
    "a party imports only the code its own invocation allows: start it with --allow-plugin MODULE for "
    "an installed module, --allow-plugin PATH/NAME.py for a file it names, or --allow-plugin "
    "NAME=sha256:DIGEST for NAME.py beside the protocol file (securevfl party, securevfl validate; "
    "allow_plugins=[...] in securevfl.api.party)"
)


@dataclass(frozen=True)
class Needed:
    """One module a process would import for a protocol: ``module``, what it is
    for (``plugin 'x'``, ``model factory 'm:f' of party 'p1'``) and the YAML
    path that names it."""

    module: str
    what: str
    path: str


@dataclass(frozen=True)
class FileModule:
    """A top-level module allowed as a file: ``name``, ``path`` (absolute: a
    ``.py`` file, or a package's folder) and ``sha256``, the digest of a single
    file's source that must match the bytes run (a party's pin, or what the local
    launcher read), or None."""

    name: str
    path: str
    sha256: str | None = None

    @property
    def package(self) -> bool:
        return not self.path.endswith(".py")

    @property
    def source(self) -> str:
        """The file its code is read from (a package's ``__init__.py``)."""
        return str(Path(self.path) / "__init__.py") if self.package else self.path

    def covers(self, module: str) -> bool:
        return module == self.name or (self.package and module.startswith(self.name + "."))


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_ref(ref: str) -> tuple[str, str]:
    """``"package.module:qualname"`` -> (module, qualname); a malformed reference
    is a :class:`UserCodeError`."""
    if not _REF.match(ref):
        raise UserCodeError(f"'{ref}' is not a 'package.module:qualname' reference")
    module, _, qualname = ref.partition(":")
    return module, qualname


def is_path(text: str) -> bool:
    """Whether an allowance names a file rather than a module (a ``/`` or a ``.py``)."""
    return "/" in text or "\\" in text or text.endswith(".py")


def is_allowance(text: str) -> bool:
    """Whether ``text`` reads as one allowance (a module name, a path, a pin); the
    path is checked by :func:`policy_of`."""
    return bool(re.fullmatch(MODULE_PATTERN, text) or _PIN.match(text) or is_path(text))


def beside_file(folder: str | None, name: str) -> FileModule | None:
    """Top-level module ``name`` as a file in ``folder`` (``NAME.py``, else a
    package ``NAME/``), or None."""
    if folder is None:
        return None
    f, pkg = Path(folder) / f"{name}.py", Path(folder) / name
    if f.is_file():
        return FileModule(name, str(f.resolve()))
    if (pkg / "__init__.py").is_file():
        return FileModule(name, str(pkg.resolve()))
    return None


def _named_file(text: str) -> FileModule:
    """The module a party names by path: a ``.py`` file or a package's folder."""
    p = Path(text).expanduser().resolve()
    if p.suffix == ".py" and p.is_file():
        name = p.stem
    elif p.is_dir() and (p / "__init__.py").is_file():
        name = p.name
    else:
        raise UserCodeError(
            f"'{text}' is neither a .py file nor a package folder (one with an __init__.py)", path=FLAG
        )
    if not _NAME.match(name):
        raise UserCodeError(f"'{text}': '{name}' cannot be a Python module's name", path=FLAG)
    return FileModule(name, str(p))


def _pinned(name: str, digest: str, beside: str | None) -> FileModule:
    """``NAME=sha256:HEX``: ``NAME.py`` beside the protocol file, pinned to ``HEX``."""
    spec = f"{name}=sha256:{digest}"
    if beside is None:
        raise UserCodeError(
            f"'{spec}' pins a file beside the protocol file, and this protocol was given without one; "
            "allow the module's file by its path",
            path=FLAG,
        )
    found = beside_file(beside, name)
    if found is None or found.package:
        raise UserCodeError(
            f"'{spec}': there is no file '{name}.py' beside the protocol file (a digest pins one "
            "file; a package is allowed by its folder's path)",
            path=FLAG,
        )
    return FileModule(name, found.path, digest.lower())


def policy_of(allow: Iterable[str], beside: str | None = None) -> CodePolicy:
    """The policy of a process whose invocation allows ``allow`` (``--allow-plugin``,
    ``allow_plugins``): installed modules by name, files by path, and files beside
    the protocol file (the folder ``beside``) by pinned digest (module docstring)."""
    names: set[str] = set()
    files: dict[str, FileModule] = {}
    for text in allow:
        if not isinstance(text, str) or not is_allowance(text):
            raise UserCodeError(
                f"{text!r} is not a module name (package.module), a file path (./mylab.py) or a pinned "
                "file (mylab=sha256:DIGEST)",
                path=FLAG,
            )
        pin = _PIN.match(text)
        if pin:
            f = _pinned(pin.group(1), pin.group(2), beside)
        elif is_path(text):
            f = _named_file(text)
        else:
            names.add(text)
            continue
        if files.get(f.name, f) != f:
            raise UserCodeError(f"module '{f.name}' is allowed as two different files", path=FLAG)
        files[f.name] = f
    return CodePolicy(frozenset(names), beside, frozenset(files.values()))


def allowance_module(text: str) -> str:
    """The module an allowance names, to import it (``mylab``, ``./mylab.py`` and
    ``mylab=sha256:HEX`` all name ``mylab``); ``text`` is one :func:`policy_of` took."""
    pin = _PIN.match(text)
    if pin:
        return pin.group(1)
    return _named_file(text).name if is_path(text) else text


def own_policy(modules: Iterable[str], beside: str | None) -> CodePolicy:
    """The local launcher's policy for the modules its own protocol file names:
    one that lies beside the file is allowed by its path (a single file pinned to
    the digest read now, so that every rank runs the bytes the launcher saw),
    any other by name."""
    names: set[str] = set()
    files: set[FileModule] = set()
    for module in modules:
        f = beside_file(beside, module.partition(".")[0])
        if f is None:
            names.add(module)
        else:
            files.add(f if f.package else dataclasses.replace(f, sha256=sha256_of(Path(f.path).read_bytes())))
    return CodePolicy(frozenset(names), beside, frozenset(files))


class _Source(importlib.abc.Loader):
    """Runs the source bytes read (and checked) when the import was allowed."""

    def __init__(self, source: bytes, origin: str):
        self.source = source
        self.origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, self.origin, "exec", dont_inherit=True), module.__dict__)


class _Files(importlib.abc.MetaPathFinder):
    """Finds the modules allowed as files, and only those (top-level names), after
    every other finder: a file never takes an installed module's place."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[FileModule, bytes]] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if path is not None or fullname not in self.sources:
            return None
        f, source = self.sources[fullname]
        spec = importlib.machinery.ModuleSpec(fullname, _Source(source, f.source), origin=f.source)
        if f.package:
            spec.submodule_search_locations = [f.path]
        spec.has_location = True
        return spec


def _finder() -> _Files:
    """The process's finder of allowed files, last on ``sys.meta_path``."""
    for f in sys.meta_path:
        if isinstance(f, _Files):
            return f
    finder = _Files()
    sys.meta_path.append(finder)
    return finder


def _installed(name: str) -> str | None:
    """Where top-level module ``name`` is found other than as an allowed file
    (its origin), or None."""
    for finder in sys.meta_path:
        if isinstance(finder, _Files):
            continue
        find = getattr(finder, "find_spec", None)
        spec = find(name, None) if find is not None else None
        if spec is not None:
            return str(spec.origin or name)
    return None


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):
        return False


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame that raised ``exc`` (for its owner)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def explain(exc: BaseException) -> str:
    """A user code exception as its owner reads it: type, text, where it was raised."""
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


@dataclass(frozen=True)
class CodePolicy:
    """The user code one process may import: the installed modules in
    ``allowed`` (a name allows its submodules too: ``mylab`` allows
    ``mylab.models``), looked up on ``sys.path`` alone, and the top-level modules
    in ``files``, each the file (or package folder) its invocation named.
    ``beside``: the protocol file's folder, named in messages (and kept with a
    saved model). The default policy allows nothing. Immutable and picklable:
    the local launcher hands its policy to each rank it starts."""

    allowed: frozenset[str] = frozenset()
    beside: str | None = None
    files: frozenset[FileModule] = frozenset()

    def _file(self, module: str) -> FileModule | None:
        return next((f for f in self.files if f.covers(module)), None)

    def allows(self, module: str) -> bool:
        return self._file(module) is not None or any(
            module == a or module.startswith(a + ".") for a in self.allowed
        )

    def allowing(self, modules: Iterable[str]) -> CodePolicy:
        """This policy with the installed ``modules`` allowed too (the local
        launcher adds the modules of the classes its caller passed as objects)."""
        more = frozenset(modules) - self.allowed
        return self if not more else dataclasses.replace(self, allowed=self.allowed | more)

    def _hint(self, module: str) -> str:
        """How to allow the file beside the protocol that has ``module``'s name."""
        f = beside_file(self.beside, module.partition(".")[0])
        if f is None:
            return ""
        if f.package:
            return (
                f" (a package '{f.name}/' lies beside the protocol file: allow it by its path, "
                f"--allow-plugin PATH/{f.name})"
            )
        digest = sha256_of(Path(f.path).read_bytes())
        return (
            f" (a file '{f.name}.py' lies beside the protocol file: allow it by its path, "
            f"--allow-plugin PATH/{f.name}.py, or by its digest, --allow-plugin {f.name}=sha256:{digest})"
        )

    def check(self, needed: Iterable[Needed]) -> None:
        """Refuse, before anything is imported, every module of ``needed`` this
        policy does not allow, naming each (and what it is for)."""
        refused = [n for n in needed if not self.allows(n.module)]
        if not refused:
            return
        named = "; ".join(
            f"{n.what} (module '{n.module}', at '{n.path}'){self._hint(n.module)}" for n in refused
        )
        raise UserCodeError(
            f"not allowed in this process: {named}. A protocol file cannot make a party run code it "
            f"did not choose; {HOW_TO_ALLOW}",
            path=refused[0].path,
        )

    def _ready(self, f: FileModule, what: str, path: str) -> None:
        """Read ``f``'s source for its import, once: refused if its digest does not
        match the pin, or if its name is an installed module's."""
        held = sys.modules.get(f.name)
        if held is not None:
            if _same_file(getattr(held, "__file__", None), f.source):
                return
            raise UserCodeError(
                f"{what}: module '{f.name}' is already imported from elsewhere; a file allowed as "
                f"'{f.name}' never replaces it",
                path=path,
            )
        origin = _installed(f.name)
        if origin is not None and not _same_file(origin, f.source):
            raise UserCodeError(
                f"{what}: the file allowed as module '{f.name}' has the name of an installed module, "
                "which a file never replaces; rename the file",
                path=path,
            )
        try:
            source = Path(f.source).read_bytes()
        except OSError as exc:
            raise UserCodeError(
                f"{what}: cannot read the file of module '{f.name}' ({exc.strerror})", path=path
            ) from None
        if f.sha256 is not None and sha256_of(source) != f.sha256:
            raise UserCodeError(
                f"{what}: '{Path(f.source).name}' (module '{f.name}') does not match the pinned sha256 "
                f"({f.sha256}): it is not the file that was allowed",
                path=path,
            )
        _finder().sources[f.name] = (f, source)

    def import_module(self, module: str, *, what: str, path: str) -> ModuleType:
        """Import ``module`` for ``what`` (named at YAML ``path``) under this policy."""
        self.check([Needed(module, what, path)])
        f = self._file(module)
        if f is not None:
            self._ready(f, what, path)
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                looked = f"in {f.path}" if f is not None else "on the Python path"
                raise UserCodeError(
                    f"{what}: no module named '{exc.name}' (looked {looked}){self._hint(module)}", path=path
                ) from None
            raise UserCodeError(
                f"{what}: module '{module}' failed while it was imported ({type(exc).__name__})",
                path=path,
                detail=explain(exc),
            ) from None
        except (Exception, SystemExit) as exc:
            raise UserCodeError(
                f"{what}: module '{module}' failed while it was imported ({type(exc).__name__})",
                path=path,
                detail=explain(exc),
            ) from None

    def load(self, ref: str, *, what: str, path: str) -> Any:
        """The function or class a ``package.module:qualname`` reference names,
        defined in that module and imported under this policy."""
        module, qualname = split_ref(ref)
        obj: Any = self.import_module(module, what=what, path=path)
        parts = qualname.split(".")
        for i, part in enumerate(parts):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise UserCodeError(f"{what}: module '{module}' has no '{qualname}'", path=path) from None
            # a callable (or a class on the way) must be defined in the module itself; a
            # value that is not callable is returned for the caller to refuse as such
            last = i == len(parts) - 1
            foreign = getattr(obj, "__module__", None) != module and (callable(obj) or not last)
            if isinstance(obj, ModuleType) or foreign or not (last or inspect.isclass(obj)):
                raise UserCodeError(
                    f"{what}: '{ref}' is not a function or class defined in module '{module}'; a "
                    "reference names code of the allowed module itself, not code it reaches in another",
                    path=path,
                )
        return obj


LAYOUT_PARAM = "layout"  # the keyword a bottom factory declares to receive its party's FeatureLayout


def accepts_layout(fn: Any) -> bool:
    """Whether the model factory ``fn`` declares a parameter named ``layout``
    that it can take by keyword (a ``**params`` catch-all does not count: such
    a factory is called exactly as one without it). A callable without a
    readable signature does not."""
    try:
        p = inspect.signature(fn).parameters.get(LAYOUT_PARAM)
    except (TypeError, ValueError):
        return False
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return p is not None and p.kind in by_keyword


def check_factory(
    code: CodePolicy, ref: str, params: Mapping[str, Any], *, what: str, path: str, layout: bool = False
) -> None:
    """Refuse a model factory that cannot be called as securevfl calls it,
    ``factory(in_features, out, **params)``, before any rank starts: ``ref``,
    imported under ``code``, must name a callable whose signature accepts two
    positional arguments and the keywords of ``params`` (a misspelt module,
    attribute or option is named at load rather than in the owner's rank, after
    start-up and ID matching). ``layout``: the call passes a bottom model's
    input layout to a factory that declares ``layout`` (:func:`accepts_layout`),
    so ``params`` must not set it. A callable without a readable signature (a
    builtin) is left to the call itself. Nothing is called."""
    fn = code.load(ref, what=what, path=path)
    if not callable(fn):
        raise UserCodeError(f"{what} is not callable (a {type(fn).__name__})", path=path)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    given = dict(params)
    if layout and accepts_layout(fn):
        if LAYOUT_PARAM in params:
            raise UserCodeError(
                f"{what} takes '{LAYOUT_PARAM}' (the party's input layout, which securevfl passes), so "
                f"params must not set '{LAYOUT_PARAM}'",
                path=path.removesuffix(".factory") + f".params.{LAYOUT_PARAM}",
            )
        given[LAYOUT_PARAM] = None
    try:
        signature.bind(0, 0, **given)
    except TypeError as exc:
        keys = f"params {sorted(params)}" if params else "no params"
        raise UserCodeError(
            f"{what} cannot be called as factory(in_features, out, **params) with {keys}: {exc}", path=path
        ) from None
