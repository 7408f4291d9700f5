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

**References.** User code is named as ``package.module:qualname`` (the qualified
name may be dotted: ``module:Class.method``). The Python API turns an object
given to it into its reference (:func:`securevfl.app.objects.reference_of`) and
passes that to the ranks, each of which loads it under its own policy;
:meth:`CodePolicy.load` turns a reference back into the object.

**Where modules are found.** A module is looked up on ``sys.path`` as any import
is; a policy made for a protocol file also looks up an allowed top-level module
in the file's folder first (``beside``), so ``my_models.py`` next to the protocol
file is found wherever the command runs. Only the allowed names are looked up
there (a finder on ``sys.meta_path`` that answers for those names alone), and
``sys.path`` is left as it is: a file in that folder can never shadow a module
that securevfl or a library imports later. A module beside the file that the
allowed one imports in turn must be inside an allowed package (a folder with an
``__init__.py``), or be allowed itself.

**Errors.** A refused module, one that cannot be found or raises while it is
imported, and a reference to a missing attribute are :class:`UserCodeError`:
exit code 2, no traceback; the exception's own text and the line in the user's
file that raised it go to ``detail`` (the owner's stderr only: the text may quote
data).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from securevfl.errors import UserCodeError

#: A module name: ``package.module``.
MODULE_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"
#: A reference to an object in a module: ``package.module:qualname``.
REF_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"
_REF = re.compile(REF_PATTERN)

#: How a party allows a module: the flag and the API argument (for messages).
HOW_TO_ALLOW = (
    "a party imports only the code its own invocation allows: start it with --allow-plugin MODULE "
    "(securevfl party, securevfl validate) or allow_plugins=[...] (securevfl.api.party)"
)


@dataclass(frozen=True)
class Needed:
    """One module a process would import for a protocol: ``module``, what it is
    for (``plugin 'x'``, ``model factory 'm:f' of party 'p1'``) and the YAML
    path that names it."""

    module: str
    what: str
    path: str


def split_ref(ref: str) -> tuple[str, str]:
    """``"package.module:qualname"`` -> (module, qualname); a malformed reference
    is a :class:`UserCodeError`."""
    if not _REF.match(ref):
        raise UserCodeError(f"'{ref}' is not a 'package.module:qualname' reference")
    module, _, qualname = ref.partition(":")
    return module, qualname


def _walk(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _Beside(importlib.abc.MetaPathFinder):
    """Finds the allowed top-level modules, and only those, in one folder (a
    protocol file's): the file's own modules without putting the folder on
    ``sys.path`` (module docstring)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if path is not None or fullname not in self.names:
            return None  # a submodule (found through its package) or a name not allowed here
        return importlib.machinery.PathFinder.find_spec(fullname, [self.folder])


def _finder(folder: str) -> _Beside:
    """The finder for ``folder``, installed once per process, ahead of the
    path-based finder (so a file's own module wins over an installed one of the
    same name, for the names allowed alone)."""
    for f in sys.meta_path:
        if isinstance(f, _Beside) and f.folder == folder:
            return f
    finder = _Beside(folder)
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path)
    )
    sys.meta_path.insert(at, finder)
    return finder


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame that raised ``exc`` (for its owner)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def explain(exc: BaseException) -> str:
    """A user code exception as its owner reads it: type, text, where it was raised."""
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


@dataclass(frozen=True)
class CodePolicy:
    """The user code one process may import: the modules in ``allowed`` (a name
    allows its submodules too: ``mylab`` allows ``mylab.models``), looked up first
    in ``beside`` (a protocol file's folder) when given, then on ``sys.path``.
    The default policy allows nothing. Immutable and picklable: the local
    launcher hands its policy to each rank it starts."""

    allowed: frozenset[str] = frozenset()
    beside: str | None = None

    def allows(self, module: str) -> bool:
        return any(module == a or module.startswith(a + ".") for a in self.allowed)

    def allowing(self, modules: Iterable[str]) -> CodePolicy:
        """This policy with ``modules`` allowed too (the local launcher adds the
        modules of the classes its caller passed as objects)."""
        more = frozenset(modules) - self.allowed
        return self if not more else CodePolicy(self.allowed | more, self.beside)

    def check(self, needed: Iterable[Needed]) -> None:
        """Refuse, before anything is imported, every module of ``needed`` this
        policy does not allow, naming each (and what it is for)."""
        refused = [n for n in needed if not self.allows(n.module)]
        if not refused:
            return
        named = "; ".join(f"{n.what} (module '{n.module}', at '{n.path}')" for n in refused)
        raise UserCodeError(
            f"not allowed in this process: {named}. A protocol file cannot make a party run code it "
            f"did not choose; {HOW_TO_ALLOW}",
            path=refused[0].path,
        )

    def import_module(self, module: str, *, what: str, path: str) -> ModuleType:
        """Import ``module`` for ``what`` (named at YAML ``path``) under this policy."""
        self.check([Needed(module, what, path)])
        if self.beside is not None:
            _finder(self.beside).names.add(module.partition(".")[0])
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                looked = f"in {self.beside} and " if self.beside else ""
                raise UserCodeError(
                    f"{what}: no module named '{exc.name}' (looked {looked}on the Python path)", path=path
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
        """The object a ``package.module:qualname`` reference names, imported under
        this policy."""
        module, qualname = split_ref(ref)
        mod = self.import_module(module, what=what, path=path)
        try:
            return _walk(mod, qualname)
        except AttributeError:
            raise UserCodeError(f"{what}: module '{module}' has no '{qualname}'", path=path) from None
