"""The one way an exchange backend is registered (:mod:`securevfl.exchange.spec`):
a package ``securevfl/exchange/<name>/`` whose face declares it and names its role
objects by path, registered in EXCHANGES; the registry refuses a second entry under
a name, and anything that is not such a declaration, with a message naming the
backend (docs/extending.md, "Adding an exchange backend")."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.errors import ConfigError
from securevfl.exchange import EXCHANGES
from securevfl.exchange.spec import ExchangeBackend, Roles, check_declaration
from securevfl.registry import Registry

ROOT = Path(__file__).resolve().parents[2]

#: what a declaration must not import: loading a protocol reads it (tests/unit/test_light_start.py)
HEAVY = ("torch", "numpy", "crypten", "tenseal", "phe", "gmpy2")


class Toy(ExchangeBackend):
    name = "toy"
    roles = "svfl_toy_backend.roles:ToyRoles"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A module ``svfl_toy_backend_<n>`` on sys.path that nothing has imported yet,
    holding role objects and declarations (one good, one without roles)."""
    name = f"svfl_toy_backend_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from securevfl.exchange.spec import ExchangeBackend, Roles\n\n\n"
        "class ToyRoles(Roles):\n"
        "    @classmethod\n"
        "    def active(cls, ctx):\n"
        "        return ('active', ctx)\n\n\n"
        "class NotRoles:\n"
        "    pass\n\n\n"
        "class Rolesless(ExchangeBackend):\n"
        "    name = 'rolesless'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_every_backend_is_one_package_with_its_roles_beside_its_declaration():
    """Each registered backend's declaration is its package's face and its role
    objects are that package's ``roles`` module (a Roles subclass)."""
    assert EXCHANGES.names() == ["ckks", "mpc", "paillier", "plain"]
    for name in EXCHANGES.names():
        decl = EXCHANGES.get(name)
        assert decl.__module__ == f"securevfl.exchange.{name}", name
        assert decl.roles.partition(":")[0] == f"securevfl.exchange.{name}.roles", name
        roles = decl.role_objects()
        assert issubclass(roles, Roles) and roles.__module__ == f"securevfl.exchange.{name}.roles", name
        assert decl.role_objects() is roles


def test_the_declarations_import_nothing_heavy():
    """Looking up every backend's declaration (what loading and validating a
    protocol does) imports neither torch nor numpy nor a crypto library; a fresh
    interpreter, so that nothing imported before counts."""
    code = (
        "import sys\n"
        "from securevfl.exchange import EXCHANGES\n"
        "decls = [EXCHANGES.get(n) for n in EXCHANGES.names()]\n"
        "assert len(decls) == 4\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == []


def test_a_backend_registered_twice_is_refused():
    with pytest.raises(ValueError, match="exchange backend 'plain' is already registered"):
        EXCHANGES.add("plain", EXCHANGES.get("plain"))
    with pytest.raises(ValueError, match="exchange backend 'mpc' is already registered"):
        EXCHANGES.add_path("mpc", "securevfl.exchange.mpc:Mpc")
    EXCHANGES.add("toy", Toy)
    try:
        with pytest.raises(ValueError, match="exchange backend 'toy' is already registered"):
            EXCHANGES.add("toy", Toy)
        assert EXCHANGES.get("toy") is Toy
    finally:
        EXCHANGES.remove("toy")
    assert "toy" not in EXCHANGES


def test_a_backend_without_roles_or_not_a_declaration_is_refused():
    class NoRoles(ExchangeBackend):
        name = "toy"

    class BadRoles(ExchangeBackend):
        name = "toy"
        roles = "securevfl.exchange.toy.roles.ToyRoles"  # a dot, not a colon

    class Misnamed(ExchangeBackend):
        name = "other"
        roles = Toy.roles

    refused = [
        (NoRoles, "exchange backend 'toy' names no role objects: set roles = \"package.module:Class\""),
        (BadRoles, "exchange backend 'toy' names no role objects"),
        (Misnamed, "exchange backend 'toy': its declaration is named 'other'"),
        (Roles, "exchange backend 'toy': .* is not an ExchangeBackend subclass"),
        (object(), "is not an ExchangeBackend subclass"),
    ]
    for obj, says in refused:
        with pytest.raises(ValueError, match=says):
            EXCHANGES.add("toy", obj)  # type: ignore[arg-type]
        assert "toy" not in EXCHANGES


def test_an_entry_by_path_is_checked_when_it_is_first_looked_up(toy):
    """A declaration registered by path is imported on its first lookup, then held
    to the same rule: one without roles is refused, and the name stays unusable."""
    reg: Registry[type[ExchangeBackend]] = Registry("exchange backend", check=check_declaration)
    reg.add_path("rolesless", f"{toy}:Rolesless")
    assert toy not in sys.modules
    for _ in range(2):
        with pytest.raises(ValueError, match="exchange backend 'rolesless' names no role objects"):
            reg.get("rolesless")


def test_role_objects_are_imported_on_first_use_and_must_be_roles(toy):
    class Good(ExchangeBackend):
        name = "good"
        roles = f"{toy}:ToyRoles"

    class Missing(ExchangeBackend):
        name = "missing"
        roles = f"{toy}:Nowhere"

    class Wrong(ExchangeBackend):
        name = "wrong"
        roles = f"{toy}:NotRoles"

    class Uninstalled(ExchangeBackend):
        name = "uninstalled"
        roles = "svfl_not_installed_anywhere.roles:Roles"

    assert toy not in sys.modules  # declared, not imported
    assert Good.active("ctx") == ("active", "ctx")  # type: ignore[arg-type,comparison-overlap]
    with pytest.raises(NotImplementedError, match="ToyRoles has no passive role"):
        Good.passive("ctx")  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="ToyRoles has no helper ranks"):
        Good.helper("ctx")  # type: ignore[arg-type]
    with pytest.raises(LookupError, match=rf"'missing' names its role objects at {toy}:Nowhere, which does"):
        Missing.role_objects()
    with pytest.raises(TypeError, match=rf"'wrong': its roles, {toy}:NotRoles, is not a subclass of"):
        Wrong.role_objects()
    with pytest.raises(ConfigError, match="'uninstalled' needs the Python package 'svfl_not_installed_any"):
        Uninstalled.role_objects()


def test_every_backend_states_what_it_reveals_and_is_audited_end_to_end():
    """A backend has its row in SECURITY.md §6's table (what A and P_i receive and
    learn, its trust assumptions) and, unless it is ``plain`` (the reference), its
    entry in tests/e2e/test_backends.py's CRYPTO, over which the step-by-step
    comparison with plain and the wire audit run."""
    security = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    table = security[security.index("## 6. Crypto backends") :].split("\n### ")[0]
    rows = set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE))
    assert rows == set(EXCHANGES.names())
    module = ast.parse((ROOT / "tests" / "e2e" / "test_backends.py").read_text(encoding="utf-8"))
    (crypto,) = [
        n.value
        for n in module.body
        if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["CRYPTO"]
    ]
    assert isinstance(crypto, ast.Dict)
    audited = {k.value for k in crypto.keys if isinstance(k, ast.Constant)}
    assert audited == set(EXCHANGES.names()) - {"plain"}
