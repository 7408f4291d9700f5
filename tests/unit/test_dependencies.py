"""Dependencies are declared where they are used, pinned, and used.

pyproject.toml declares each distribution once: core (imported by securevfl
itself), ``crypto`` (the HE and MPC backends, and what CrypTen imports, since
CrypTen is installed without its metadata's dependencies) or ``dev`` (tools, and
the references the tests and benchmarks compare against). requirements.txt,
requirements-dev.txt and the Makefile (torch, CrypTen) pin exact versions.

The checks, on the installed environment (``make install``):

* every declared distribution is pinned exactly once, at a version its
  declaration allows;
* every pin is declared, or is a hold: a dependency of a pinned distribution
  (per its installed metadata) pinned so that installs repeat, e.g. cffi for
  cryptography;
* every declared distribution is used: imported by the code of its group
  (securevfl for core and crypto, or CrypTen's own modules for what CrypTen
  imports; tests, benchmarks or examples for dev) or, for a dev tool, run by the
  Makefile or configured in pyproject.toml;
* nothing securevfl imports is missing from core or crypto, and nothing it
  imports is declared dev.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import importlib.util
import re
import tomllib
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from securevfl.doctor import parse_requirement, satisfies

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
MAKE_PIN = re.compile(r"install\s+(?:--no-deps\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")

#: modules a distribution provides where its metadata does not list them
MODULES_OF = {"openmined-psi": {"private_set_intersection"}}
#: CrypTen is installed with --no-deps: what its own modules import is declared by us
NO_DEPS = ("crypten",)


def norm(name: str) -> str:
    """A distribution's normalized name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, tuple[str, str]]:
    """normalized name -> (group, version specifier), from pyproject.toml."""
    project = PYPROJECT["project"]
    out: dict[str, tuple[str, str]] = {}
    groups = [("core", project["dependencies"]), *project["optional-dependencies"].items()]
    for group, reqs in groups:
        for text in reqs:
            req = parse_requirement(text)
            assert norm(req.name) not in out, f"{req.name} is declared twice"
            out[norm(req.name)] = (group, req.specifier)
    return out


def pins() -> dict[str, list[tuple[str, str]]]:
    """normalized name -> [(version, where)], from requirements*.txt and the Makefile."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(ROOT.glob("requirements*.txt")):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = PIN.match(line)
            assert m, f"{path.name}: '{line}' is not an exact pin (name==version)"
            out.setdefault(norm(m.group(1)), []).append((m.group(2), path.name))
    for m in MAKE_PIN.finditer((ROOT / "Makefile").read_text()):
        out.setdefault(norm(m.group(1)), []).append((m.group(2), "Makefile"))
    return out


def requires(name: str) -> set[str]:
    """The unconditional dependencies of an installed distribution."""
    try:
        reqs = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return set()
    return {norm(parse_requirement(r).name) for r in reqs if "extra" not in r.partition(";")[2]}


def modules_of() -> dict[str, set[str]]:
    """normalized distribution name -> the top-level modules it installs."""
    out: dict[str, set[str]] = {norm(k): set(v) for k, v in MODULES_OF.items()}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            out.setdefault(norm(dist), set()).add(module)
    return out


#: calls that import the module they name (or, find_spec, look it up to import it later)
IMPORTERS = (
    "importorskip",
    "import_module",
    "find_spec",
    "_Lazy",  # securevfl.exchange.ckks._tenseal: TenSEAL imported on first use
)


def _files(places: Iterable[Path]) -> Iterator[Path]:
    for place in places:
        yield from sorted(place.rglob("*.py")) if place.is_dir() else [place]


def imported(places: Iterable[Path], skip: Iterable[Path] = ()) -> set[str]:
    """Top-level modules the Python files under ``places`` import: import
    statements anywhere, and the calls of :data:`IMPORTERS` with a module's name."""
    skipped = {p.resolve() for p in skip}
    found: set[str] = set()
    for path in _files(places):
        if path.resolve() in skipped:
            continue
        with warnings.catch_warnings():  # a third-party docstring's invalid escape, say
            warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.partition(".")[0])
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, (ast.Attribute, ast.Name))
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in IMPORTERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value.partition(".")[0])
    return found


PACKAGE = ROOT / "securevfl"
#: the doctor imports every declared distribution by name: that is checking, not using
DOCTOR = PACKAGE / "doctor.py"


def securevfl_imports() -> set[str]:
    return imported([PACKAGE], skip=[DOCTOR])


def dev_tools() -> dict[str, bool]:
    """dev distributions that are tools rather than imports, and whether the
    project uses them as such."""
    make = (ROOT / "Makefile").read_text()
    return {
        "ruff": "$(BIN)/ruff check" in make,
        "mypy": "$(BIN)/mypy" in make and "mypy" in PYPROJECT["tool"],
        "pytest-timeout": "timeout" in PYPROJECT["tool"]["pytest"]["ini_options"],
        "pytest-xdist": "pytest -q -n $(WORKERS)" in make,
        "types-pyyaml": "mypy" in PYPROJECT["tool"] and "yaml" in securevfl_imports(),
    }


def test_every_declared_distribution_is_pinned_once_within_its_range():
    have = pins()
    bad = []
    for name, (group, spec) in declared().items():
        found = have.get(name, [])
        if len(found) != 1:
            bad.append(f"{name} ({group}) is pinned {len(found)} times: {found}")
        elif spec and not satisfies(found[0][0], spec):
            bad.append(f"{name} ({group}) is pinned at {found[0][0]} ({found[0][1]}), declared {spec}")
    assert not bad, "\n".join(bad)


def test_every_pin_is_declared_or_holds_a_dependency_of_a_pin():
    decl = declared()
    have = pins()
    reached = set(decl)
    grew = True
    while grew:  # what the declared distributions need, and what that needs
        more = {d for name in reached if name in have for d in requires(name)} - reached
        grew = bool(more)
        reached |= more
    unused = sorted(set(have) - reached)
    assert not unused, f"pinned, but neither declared nor needed by a pinned distribution: {unused}"
    repeated = {name: where for name, where in have.items() if len(where) > 1}
    assert not repeated, f"pinned more than once: {repeated}"


def test_every_declared_distribution_is_used_by_its_group():
    mods = modules_of()
    ours = securevfl_imports()
    elsewhere = imported([ROOT / "tests", ROOT / "benchmarks", ROOT / "examples"])
    spec = importlib.util.find_spec("crypten")
    assert spec is not None and spec.submodule_search_locations, "CrypTen is not installed"
    by_no_deps = imported(Path(p) for p in spec.submodule_search_locations)
    tools = dev_tools()
    unused = []
    for name, (group, _) in declared().items():
        provides = mods.get(name, set())
        assert provides or name in tools, f"{name} is not installed (make install)"
        if group == "dev":
            used = bool(provides & elsewhere) or tools.get(name, False)
        elif group == "crypto":
            used = bool(provides & ours) or (name not in NO_DEPS and bool(provides & by_no_deps))
        else:
            used = bool(provides & ours)
        if not used:
            unused.append(f"{name} ({group})")
    assert not unused, f"declared but not used where their group is used: {unused}"


def test_what_securevfl_imports_is_declared_core_or_crypto():
    decl = declared()
    owner = {m: name for name, ms in modules_of().items() for m in ms}
    third_party = {m for m in securevfl_imports() if m in owner and owner[m] != "securevfl"}
    groups = {m: decl.get(owner[m], ("undeclared", ""))[0] for m in third_party}
    wrong = {m: g for m, g in groups.items() if g not in ("core", "crypto")}
    assert not wrong, f"securevfl imports these, declared outside core and crypto: {wrong}"
    assert {"torch", "dp_accounting", "cryptography", "tenseal", "crypten"} <= third_party


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("2.13.0+cpu", ">=2.13,<2.14", True),
        ("2.14.0", ">=2.13,<2.14", False),
        ("0.4.1", "==0.4.1", True),
        ("2.0.5", ">=2.0.6", False),
        ("1.22.0", "~=1.21", True),
        ("6.30.2", "==6.30.*", True),
    ],
)
def test_version_ranges_are_read_as_pip_reads_them(version: str, spec: str, ok: bool):
    assert satisfies(version, spec) is ok
