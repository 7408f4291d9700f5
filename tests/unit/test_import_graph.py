"""The package's import graph has no cycles and respects its layers.

The graph is built from the source with :mod:`ast`, without importing anything:
one node per module of ``securevfl/``, one edge per import of another securevfl
module, wherever the import statement sits (function-local imports count: they
are still dependencies, only hidden). Imports under ``if TYPE_CHECKING:`` are left
out (they never run) and relative imports are resolved. ``from pkg import name``
reads ``pkg``'s namespace, so it is an edge to the package's face (its
``__init__``), and also to the submodule ``pkg.name`` when there is one: a module
that takes a sibling through the face that imports it closes a circle, and the
tests below refuse it. ``import pkg.name`` names the submodule alone. The implicit
import of a module's parent packages is not an edge (every submodule of a package
would otherwise close a cycle through its ``__init__``).

A registration by path, ``REGISTRY.add_path(name, "securevfl.pkg.mod:Attr")``
(:mod:`securevfl.registry`), imports ``securevfl.pkg.mod`` on the name's first
lookup: it is an edge too (marked ``by path``), from the registering module to the
registered one, held to the same rules as an import statement.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import securevfl

PACKAGE = Path(securevfl.__file__).resolve().parent
NAME = "securevfl"

#: Layer rules: modules under the key may not import modules under any of the values.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # the wire knows nothing of what runs over it
    "securevfl.runtime": (
        "securevfl.parties",
        "securevfl.exchange",
        "securevfl.defenses",
        "securevfl.attacks",
        "securevfl.report",
        "securevfl.app",
    ),
    # pure privacy math: mechanisms come from the caller
    "securevfl.privacy": (
        "securevfl.parties",
        "securevfl.defenses",
        "securevfl.attacks",
        "securevfl.report",
        "securevfl.app",
    ),
    # the schema alone; the checked loader lives in securevfl.app.loader
    "securevfl.config": ("securevfl.validation", "securevfl.exchange", "securevfl.defenses", "securevfl.app"),
}

#: The house from the top floor down: a module may import only from its own entry or
#: from entries below it (the longest matching prefix places a module; docs/design.md §11).
LAYERS: tuple[str, ...] = (
    "securevfl.__main__",
    "securevfl.cli",
    "securevfl.api",
    "securevfl.doctor",
    "securevfl.app",
    "securevfl.plugins",
    "securevfl.validation",
    "securevfl.sizing",
    "securevfl.report",
    "securevfl.attacks",
    "securevfl.parties",
    "securevfl.defenses",
    "securevfl.exchange",
    "securevfl.data",
    "securevfl.privacy",
    "securevfl.models",
    "securevfl.model_kinds",
    "securevfl.bottoms",
    "securevfl.model_limits",
    "securevfl.runtime",
    "securevfl.schedule",
    "securevfl.metrics",
    "securevfl.components",
    "securevfl.config",
    "securevfl.config_errors",
    "securevfl.records",
    "securevfl.snapshot",
    "securevfl.registry",
    "securevfl.usercall",
    "securevfl.usercode",
    "securevfl.errors",
    "securevfl.seeding",
    "securevfl.timing",
    "securevfl._compat",
    "securevfl",
)

#: Only these may import the top layer.
APP_IMPORTERS = ("securevfl.app", "securevfl.api", "securevfl.cli", "securevfl.__main__")

#: Third-party packages that may be imported inside a function: optional, heavy
#: crypto libraries whose import only the processes using them should pay for.
LOCAL_IMPORT_OK = frozenset({"crypten", "phe", "tenseal"})


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    local: bool  # the import statement sits inside a function
    by_path: bool = False  # a registration by path (Registry.add_path), imported on lookup

    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def says(self) -> str:
        """``source:line imports target`` (or ``registers`` for an edge by path)."""
        return f"{self.where()} {'registers' if self.by_path else 'imports'} {self.target}"


def _under(module: str, prefix: str) -> bool:
    """Whether ``module`` is ``prefix`` or inside it."""
    return module == prefix or module.startswith(prefix + ".")


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it sits in a function."""

    def walk(node: ast.AST, local: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    yield from walk_one(stmt, local)
                continue
            yield from walk_one(child, local)

    def walk_one(node: ast.AST, local: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, local
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from walk(node, inner)

    yield from walk(tree, False)


def _registrations(tree: ast.AST) -> Iterator[tuple[ast.Call, str, str]]:
    """Every ``X.add_path(name, "module:attribute")`` call with a literal path, as
    (call, module, attribute)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_path"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            module, _, attr = node.args[1].value.partition(":")
            yield node, module, attr


def _role_paths(tree: ast.AST) -> Iterator[tuple[ast.Assign, str, str]]:
    """Every ``roles = "module:attribute"`` in a class body (an exchange backend's
    declaration naming its role objects, :mod:`securevfl.exchange.spec`), as
    (assignment, module, attribute). Not an edge of the graph: the role objects
    depend on their declaration (its options), and are imported after it, by the
    rank that builds its role."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and [t.id for t in stmt.targets if isinstance(t, ast.Name)] == ["roles"]
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                module, _, attr = stmt.value.value.partition(":")
                yield stmt, module, attr


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The absolute module names an import statement refers to."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # the names are looked up in `prefix` first (its face), then among its submodules
    return [prefix, *(f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in known)]


def _owner(target: str, known: set[str], name: str = NAME) -> str | None:
    """The module of package ``name`` that ``target`` names (its nearest existing
    prefix), if any."""
    if target != name and not target.startswith(name + "."):
        return None
    while target not in known and "." in target:
        target = target.rpartition(".")[0]
    return target if target in known else None


def build_graph(package: Path = PACKAGE) -> tuple[dict[str, list[Edge]], list[tuple[str, int, str]]]:
    """(edges by source module, third-party function-local imports as (module, line, name))
    of the package in the folder ``package`` (securevfl's by default)."""
    name = package.name
    modules = _modules(package)
    known = set(modules)
    graph: dict[str, list[Edge]] = {m: [] for m in modules}
    external_local: list[tuple[str, int, str]] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, local in _imports(tree):
            for target in dict.fromkeys(_targets(module, path, node, known)):
                owner = _owner(target, known, name)
                if owner is None:
                    if local:
                        external_local.append((module, node.lineno, target))
                elif owner != module:
                    graph[module].append(Edge(module, owner, node.lineno, local))
        for call, target, _ in _registrations(tree):
            owner = _owner(target, known, name)
            if owner is not None and owner != module:
                graph[module].append(Edge(module, owner, call.lineno, False, by_path=True))
    return graph, external_local


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for e in edges:
                w = e.target
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def one_cycle(graph: dict[str, list[Edge]], component: list[str]) -> list[Edge]:
    """A shortest cycle through the component's first module (breadth-first)."""
    members = set(component)
    start = component[0]
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in graph[v]:
                if e.target not in members:
                    continue
                if e.target == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if e.target not in came:
                    came[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    raise AssertionError(f"no cycle found through {start}")


def _how(e: Edge) -> str:
    return ", in a function" if e.local else ", by path" if e.by_path else ""


def _show(cycle: list[Edge]) -> str:
    hops = [f"{e.source} -> {e.target} (line {e.line}{_how(e)})" for e in cycle]
    return "\n    ".join(hops)


def test_the_builder_sees_imports_and_cycles() -> None:
    """The graph helpers on a known shape: a cycle is found and shown."""
    toy = {
        "a": [Edge("a", "b", 1, False)],
        "b": [Edge("b", "c", 2, True)],
        "c": [Edge("c", "a", 3, False)],
        "d": [Edge("d", "a", 4, False)],
    }
    assert strongly_connected(toy) == [["a", "b", "c"]]
    assert [e.target for e in one_cycle(toy, ["a", "b", "c"])] == ["b", "c", "a"]
    graph, _ = build_graph()
    assert any(e.target == "securevfl.config" for e in graph["securevfl.models"])
    # `from securevfl.privacy import gaussian` reads the package's face, then the submodule
    targets = {e.target for e in graph["securevfl.defenses.vfl_afe"]}
    assert {"securevfl.privacy", "securevfl.privacy.gaussian"} <= targets
    # a registration by path is an edge to the registered module
    assert any(e.target == "securevfl.exchange.plain" and e.by_path for e in graph["securevfl.exchange"])
    tree = ast.parse('R.add_path("x", "securevfl.models:mlp")\nR.add("y", 1)\n')
    assert [(m, a) for _, m, a in _registrations(tree)] == [("securevfl.models", "mlp")]
    tree = ast.parse('class B:\n    roles = "securevfl.x.roles:R"\n    name = "b"\nroles = "a:b"\n')
    assert [(m, a) for _, m, a in _role_paths(tree)] == [("securevfl.x.roles", "R")]


def _toy_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "toy" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "toy"


def test_a_circle_through_a_package_face_is_seen(tmp_path: Path) -> None:
    """A face that imports its submodule, and the submodule taking a sibling through
    that face (``from toy.pkg import b``, relative or absolute), is a circle; naming
    the sibling module itself (``import toy.pkg.b``, ``from toy.pkg.b import x``) is none."""
    face = "from toy.pkg.a import A\n"
    for spelling in ("from toy.pkg import b\n", "from . import b\n", "from toy.pkg import B\n"):
        pkg = _toy_package(
            tmp_path / str(len(spelling)) / spelling[5],
            {
                "__init__.py": "",
                "pkg/__init__.py": face + "B = 1\n",
                "pkg/a.py": spelling + "A = 1\n",
                "pkg/b.py": "",
            },
        )
        graph, _ = build_graph(pkg)
        assert strongly_connected(graph) == [["toy.pkg", "toy.pkg.a"]], spelling
    for spelling in ("import toy.pkg.b\n", "import toy.pkg.b as b\n", "from toy.pkg.b import x\n"):
        pkg = _toy_package(
            tmp_path / "ok" / str(len(spelling)),
            {
                "__init__.py": "",
                "pkg/__init__.py": face,
                "pkg/a.py": spelling + "A = 1\n",
                "pkg/b.py": "x = 1\n",
            },
        )
        graph, _ = build_graph(pkg)
        assert strongly_connected(graph) == [], spelling
        assert {e.target for e in graph["toy.pkg.a"]} == {"toy.pkg.b"}, spelling


def test_registrations_by_path_name_existing_objects() -> None:
    """Every ``add_path`` in securevfl, and every exchange backend's ``roles``, names
    a module of the package and a name that module defines at its top level (checked
    from the source, importing nothing): a typo would otherwise surface only when a
    protocol names the entry, or a rank builds its role."""
    modules = _modules()
    bad = []
    found = roles = 0
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for how, paths in (("registers", _registrations(tree)), ("names its roles at", _role_paths(tree))):
            for node, target, attr in paths:
                found += how == "registers"
                roles += how != "registers"
                where = f"{module}:{node.lineno}"
                if target not in modules:
                    bad.append(f"{where} {how} {target}:{attr}, but there is no module {target}")
                    continue
                if attr not in _top_level_names(ast.parse(modules[target].read_text(encoding="utf-8"))):
                    bad.append(f"{where} {how} {target}:{attr}, but {target} defines no '{attr}'")
    assert found >= 20, f"only {found} registrations by path found: is the registration call still add_path?"
    assert roles >= 4, f"only {roles} backends name their role objects: is the attribute still roles?"
    assert not bad, "registrations by path that name nothing:\n" + "\n".join(bad)


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level: classes, functions, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
    return names


def test_no_import_cycles() -> None:
    graph, _ = build_graph()
    components = strongly_connected(graph)
    report = [
        f"{len(c)} modules import each other: {', '.join(c)}\n  e.g.\n    {_show(one_cycle(graph, c))}"
        for c in components
    ]
    assert not components, "import cycles in securevfl:\n" + "\n".join(report)


def test_layers() -> None:
    graph, _ = build_graph()
    bad = []
    for module, edges in graph.items():
        for layer, forbidden in FORBIDDEN.items():
            if _under(module, layer):
                bad += [e.says() for e in edges if any(_under(e.target, f) for f in forbidden)]
        if not any(_under(module, m) for m in APP_IMPORTERS):
            bad += [e.says() for e in edges if _under(e.target, "securevfl.app")]
    assert not bad, "layer violations:\n" + "\n".join(bad)


def _floor(module: str) -> int:
    """The index in :data:`LAYERS` of the entry that places ``module``."""
    matches = [i for i, prefix in enumerate(LAYERS) if _under(module, prefix)]
    return max(matches, key=lambda i: len(LAYERS[i]))


def test_imports_go_down_the_house() -> None:
    graph, _ = build_graph()
    up = [
        f"{e.says()}, which sits above it"
        for edges in graph.values()
        for e in edges
        if _floor(e.target) < _floor(e.source)
    ]
    assert not up, "imports up the layers (see LAYERS):\n" + "\n".join(up)


def test_imports_sit_at_the_top_of_their_module() -> None:
    """Function-local imports hide dependencies (and cycles); only optional, heavy
    crypto libraries may be imported where they are used."""
    graph, external_local = build_graph()
    local = [f"{e.where()} imports {e.target}" for edges in graph.values() for e in edges if e.local]
    local += [
        f"{m}:{line} imports {name}"
        for m, line, name in external_local
        if name.partition(".")[0] not in LOCAL_IMPORT_OK
    ]
    assert not local, "function-local imports:\n" + "\n".join(local)
