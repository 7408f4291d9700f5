"""User code named in a protocol file (securevfl.usercode): references, the
policy that decides what a process may import, and where modules are found."""

from __future__ import annotations

import hashlib
import sys
import uuid
from pathlib import Path

import pytest

from securevfl.app.objects import reference_of
from securevfl.errors import UserCodeError
from securevfl.usercode import CodePolicy, FileModule, Needed, allowance_module, policy_of, split_ref


@pytest.fixture
def isolated():
    """Undo what a test's imports leave behind: the modules it imported and the
    finders it installed."""
    modules, finders, path = set(sys.modules), list(sys.meta_path), list(sys.path)
    yield
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.meta_path[:] = finders
    assert sys.path == path  # a policy never touches sys.path


def _module(folder: Path, body: str, name: str | None = None) -> str:
    """Write a module into ``folder`` under a fresh name (or ``name``); its name."""
    name = name or f"svfl_case_{uuid.uuid4().hex[:10]}"
    (folder / f"{name}.py").write_text(body)
    return name


def top_level() -> int:
    return 2


def test_a_reference_of_an_object_loads_back_only_where_its_module_is_allowed():
    """The API names an object by reference_of (securevfl.app.objects), and a rank
    loads it under its policy: allowed, the same object; not allowed, refused."""
    ref = reference_of(top_level, field="f")
    assert ref == f"{__name__}:top_level"
    what = dict(what="factory", path="f")
    assert CodePolicy(frozenset({__name__})).load(ref, **what) is top_level
    with pytest.raises(UserCodeError, match="not allowed in this process"):
        CodePolicy().load(ref, **what)
    assert CodePolicy().allowing([__name__]).load(ref, **what) is top_level


def test_allowing_adds_modules_and_keeps_the_folder():
    policy = CodePolicy(frozenset({"a"}), "/x")
    assert policy.allowing([]) is policy
    assert policy.allowing(["a"]) is policy
    wider = policy.allowing(["b.c"])
    assert wider == CodePolicy(frozenset({"a", "b.c"}), "/x")
    assert wider.allows("b.c.d") and not wider.allows("b")
    assert not policy.allows("b.c")


def test_split_ref_refuses_a_malformed_reference():
    for bad in ("nomodule", "a.b", "a:", ":b", "a:b:c", "a-b:c", "a:b c"):
        with pytest.raises(UserCodeError, match=r"not a 'package\.module:qualname'"):
            split_ref(bad)


def test_a_name_allows_itself_and_its_submodules_only():
    policy = CodePolicy(frozenset({"mylab"}))
    assert policy.allows("mylab") and policy.allows("mylab.models.deep")
    assert not policy.allows("mylabs") and not policy.allows("other") and not policy.allows("my")
    assert not CodePolicy().allows("mylab")


def test_check_names_every_refused_module_before_anything_is_imported(tmp_path, isolated):
    marker = tmp_path / "imported"
    name = _module(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    policy = CodePolicy(frozenset({"other"}), str(tmp_path))
    needed = [
        Needed(name, "plugin 'x'", "plugins[0]"),
        Needed("other.sub", "plugin 'y'", "plugins[1]"),
        Needed("third", "model factory 'third:f' of party 'p1'", "parties.passive[0].model.factory"),
    ]
    with pytest.raises(UserCodeError) as err:
        policy.check(needed)
    msg = str(err.value)
    assert name in msg and "third:f" in msg and "party 'p1'" in msg and "'other.sub'" not in msg
    assert err.value.path == "plugins[0]" and "--allow-plugin" in msg
    with pytest.raises(UserCodeError, match="not allowed"):
        policy.import_module(name, what="plugin", path="plugins[0]")
    assert not marker.exists() and name not in sys.modules


def test_a_module_beside_the_file_is_found_only_as_the_file_its_policy_names(tmp_path, isolated):
    """By path (or pinned digest) the file is the module; by name the folder is
    not searched (SECURITY.md §4b; tests/threat_model/test_plugin_trust.py)."""
    allowed = _module(tmp_path, "VALUE = 7\n")
    other = _module(tmp_path, "VALUE = 8\n")
    policy = policy_of([str(tmp_path / f"{allowed}.py")], str(tmp_path))
    assert policy.allows(allowed) and not policy.allows(other) and not policy.allows(f"{allowed}.sub")
    assert policy.load(f"{allowed}:VALUE", what="factory", path="x") == 7
    by_name = CodePolicy(frozenset({other}), str(tmp_path))
    with pytest.raises(UserCodeError, match=f"no module named '{other}' .*--allow-plugin {other}=sha256:"):
        by_name.import_module(other, what="factory", path="x")
    with pytest.raises(ModuleNotFoundError):
        __import__(other)
    assert str(tmp_path) not in sys.path


def test_an_allowance_reads_as_a_name_a_path_or_a_pin(tmp_path):
    f = tmp_path / "svfl_pinned_mod.py"
    f.write_text("A = 1\n")
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    policy = policy_of(["a.b", f"svfl_pinned_mod=sha256:{digest.upper()}"], str(tmp_path))
    assert policy.allowed == frozenset({"a.b"})
    assert policy.files == frozenset({FileModule("svfl_pinned_mod", str(f.resolve()), digest)})
    by_path = policy_of([str(f), str(tmp_path / "." / f.name)])
    assert by_path.files == frozenset({FileModule("svfl_pinned_mod", str(f.resolve()))})
    for bad, says in (
        ("a-b", "is not a module name"),
        (str(tmp_path / "missing.py"), "neither a .py file nor a package folder"),
        ("nothere=sha256:" + "0" * 64, "no file 'nothere.py' beside the protocol file"),
    ):
        with pytest.raises(UserCodeError, match=says) as err:
            policy_of([bad], str(tmp_path))
        assert err.value.path == "--allow-plugin"
    with pytest.raises(UserCodeError, match="given without one"):
        policy_of([f"svfl_pinned_mod=sha256:{digest}"], None)
    with pytest.raises(UserCodeError, match="allowed as two different files"):
        policy_of([str(f), f"svfl_pinned_mod=sha256:{digest}"], str(tmp_path))


def test_a_file_never_takes_an_installed_modules_name(tmp_path, isolated):
    """A file allowed as ``json`` (or any module installed elsewhere) is refused
    rather than replacing it for securevfl and every library."""
    (tmp_path / "json.py").write_text("raise SystemExit('planted')\n")
    policy = policy_of([str(tmp_path / "json.py")], str(tmp_path))
    with pytest.raises(UserCodeError, match="already imported from elsewhere"):
        policy.import_module("json", what="plugin 'json'", path="plugins[0]")
    (tmp_path / "svfl_shadowed.py").write_text("raise SystemExit('planted')\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "svfl_shadowed.py").write_text("SOURCE = 'installed'\n")
    sys.path.insert(0, str(site))
    try:
        policy = policy_of([str(tmp_path / "svfl_shadowed.py")], str(tmp_path))
        with pytest.raises(UserCodeError, match="has the name of an installed module"):
            policy.import_module("svfl_shadowed", what="plugin", path="plugins[0]")
    finally:
        sys.path.remove(str(site))


def test_import_failures_are_user_code_errors_with_the_text_for_the_owner(tmp_path, isolated):
    policy = CodePolicy(frozenset({"svfl_missing_mod"}), str(tmp_path))
    with pytest.raises(UserCodeError, match="no module named 'svfl_missing_mod'") as err:
        policy.import_module("svfl_missing_mod", what="plugin 'svfl_missing_mod'", path="plugins[0]")
    assert "on the Python path" in str(err.value)

    broken = _module(tmp_path, "x = 1\nraise RuntimeError('row 17 holds 4.2')\n")
    policy = policy_of([str(tmp_path / f"{broken}.py")], str(tmp_path))
    with pytest.raises(UserCodeError) as err:
        policy.import_module(broken, what=f"plugin '{broken}'", path="plugins[0]")
    assert "failed while it was imported (RuntimeError)" in str(err.value)
    assert "4.2" not in str(err.value)  # the public message quotes no text of the user's
    assert err.value.detail is not None
    assert "row 17 holds 4.2" in err.value.detail and f"{broken}.py, line 2" in err.value.detail

    # a dependency the user's module lacks is its failure, not a missing module of the file's
    needs = _module(tmp_path, "import svfl_not_installed_anywhere\n")
    policy = policy_of([str(tmp_path / f"{needs}.py")], str(tmp_path))
    with pytest.raises(UserCodeError, match="failed while it was imported"):
        policy.import_module(needs, what="plugin", path="plugins[0]")

    ok = _module(tmp_path, "A = 1\n")
    with pytest.raises(UserCodeError, match=f"module '{ok}' has no 'nothing'"):
        policy_of([str(tmp_path / f"{ok}.py")]).load(f"{ok}:nothing", what="factory", path="x")


def test_a_policy_is_immutable_and_picklable():
    import pickle

    p = CodePolicy(frozenset({"a", "b.c"}), "/some/folder")
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        p.allowed = frozenset()  # type: ignore[misc]


def test_a_user_code_errors_text_stays_with_its_owner():
    """A rank relays its error to its peers without the user code's own text."""
    from securevfl.runtime.notes import error_note

    exc = UserCodeError("bottom model of party 'p1': factory 'm:f' raised ValueError", detail="row 17: 4.2")
    note = error_note(1, exc)
    assert note.kind == "UserCodeError" and note.detail == "row 17: 4.2"
    shared = note.public()
    assert shared.detail is None and "4.2" not in shared.model_dump_json()


def test_each_allowance_names_the_module_it_allows(tmp_path):
    """``securevfl attack --plugin`` imports the module each allowance names."""
    (tmp_path / "mylab.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert allowance_module("mylab.models") == "mylab.models"
    assert allowance_module(str(tmp_path / "mylab.py")) == "mylab"
    assert allowance_module(str(tmp_path / "pkg")) == "pkg"
    assert allowance_module("mylab=sha256:" + "a" * 64) == "mylab"
    with pytest.raises(UserCodeError, match=r"neither a \.py file nor a package folder"):
        allowance_module(str(tmp_path / "missing.py"))
