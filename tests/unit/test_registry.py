"""The registry's entries by path: imported on first lookup, listed without
importing, refused when they name nothing; and a plain run's processes import
none of the components it does not use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.errors import ConfigError
from securevfl.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module that nothing has imported yet, on sys.path: ``(module name, folder)``."""
    name = f"svfl_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "class Thing:\n    name = 'thing'\n\n\nclass Other:\n    name = 'other'\n\n\nLIMIT = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_an_entry_by_path_is_imported_on_its_first_lookup(plugin):
    reg: Registry[type] = Registry("thing")
    reg.add_path("thing", f"{plugin}:Thing")
    assert "thing" in reg and reg.names() == ["thing"] and list(reg) == ["thing"]
    assert plugin not in sys.modules  # listed, not imported
    cls = reg.get("thing")
    assert plugin in sys.modules and cls is sys.modules[plugin].Thing
    assert reg.get("thing") is cls


def test_entries_by_path_and_by_object_share_one_namespace(plugin):
    reg: Registry[object] = Registry("thing")
    reg.add_path("thing", f"{plugin}:Thing")
    with pytest.raises(ValueError, match="'thing' is already registered"):
        reg.add("thing", object())
    with pytest.raises(ValueError, match="'thing' is already registered"):
        reg.add_path("thing", f"{plugin}:Thing")
    replacement = object()
    reg.add("thing", replacement, force=True)
    assert reg.get("thing") is replacement
    reg.add_path("thing", f"{plugin}:Thing", force=True)
    assert reg.get("thing") is sys.modules[plugin].Thing
    reg.remove("thing")
    assert "thing" not in reg and reg.names() == []


def test_a_malformed_path_is_refused_at_registration():
    reg: Registry[object] = Registry("thing")
    for bad in ("module.Thing", "module:", ":Thing", "a b:Thing", "module:Thing.attr"):
        with pytest.raises(ValueError, match=r"is not a 'package\.module:attribute' path"):
            reg.add_path("thing", bad)
    assert reg.names() == []


def test_a_path_to_nothing_or_to_another_name_is_a_registration_bug(plugin):
    reg: Registry[object] = Registry("thing")
    reg.add_path("missing", f"{plugin}:Missing")
    with pytest.raises(LookupError, match=rf"'missing' is registered at {plugin}:Missing, which does not"):
        reg.get("missing")
    reg.add_path("thing", f"{plugin}:Other")
    with pytest.raises(LookupError, match="which is named 'other'"):
        reg.get("thing")
    reg.add_path("limit", f"{plugin}:LIMIT")  # an object without a name of its own
    assert reg.get("limit") == 3


def test_an_optional_package_that_is_not_installed_is_a_config_error():
    reg: Registry[object] = Registry("exchange backend")
    reg.add_path("exotic", "svfl_not_installed_anywhere.backend:Exotic")
    with pytest.raises(ConfigError) as exc:
        reg.get("exotic", path="exchange.backend")
    assert str(exc.value).startswith(
        "at 'exchange.backend': exchange backend 'exotic' needs the Python package "
        "'svfl_not_installed_anywhere', which is not installed"
    )
    assert "exotic" in reg  # still registered: installing the package makes it work


def test_a_missing_securevfl_module_is_a_bug_not_a_config_error():
    reg: Registry[object] = Registry("defense")
    reg.add_path("gone", "securevfl.defenses.no_such_module:Gone")
    with pytest.raises(ModuleNotFoundError):
        reg.get("gone")


def test_unknown_names_list_the_entries_by_path_too(plugin):
    reg: Registry[object] = Registry("thing")
    reg.add("a", 1)
    reg.add_path("thing", f"{plugin}:Thing")
    with pytest.raises(ConfigError, match=r"unknown thing 'b' \(known: a, thing\)"):
        reg.get("b")
    assert plugin not in sys.modules


#: Modules a plain protocol's processes have no use for: the other backends (and
#: their crypto libraries), the defenses and attacks it does not run, the figures.
NOT_FOR_PLAIN = (
    "crypten",
    "tenseal",
    "phe",
    "securevfl.exchange.mpc",
    "securevfl.exchange.ckks",
    "securevfl.exchange.paillier",
    "securevfl.exchange.mpc.crypten.runtime",
    "securevfl.defenses.crdp",
    "securevfl.defenses.dravl",
    "securevfl.defenses.hashvfl",
    "securevfl.defenses.vfl_afe",
    "securevfl.attacks.membership",
    "securevfl.attacks.gradient_clusters",
    "securevfl.attacks.code_detection",
    "sklearn.ensemble",
    "sklearn.cluster",
    "matplotlib",
)


def test_a_plain_protocol_loads_none_of_the_components_it_does_not_use():
    """What a plain rank imports (the CLI, which a spawned rank re-imports as its
    main module, the launcher and the rank's code: what the fork server preloads),
    with the protocol loaded, its components resolved and its backend's role objects
    looked up, holds no other backend, defense or attack, and no plotting."""
    code = (
        "import sys\n"
        "import securevfl.cli, securevfl.app.launcher, securevfl.app.rank, securevfl.app.predict\n"
        "from securevfl.app.loader import load_checked\n"
        "from securevfl.app.rank_layout import layout_of\n"
        "from securevfl.exchange import EXCHANGES\n"
        "proto = load_checked('protocols/plain.yaml')\n"
        "assert layout_of(proto).world_size == 3\n"
        "EXCHANGES.get('plain').role_objects()\n"
        f"print(' '.join(m for m in {NOT_FOR_PLAIN!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == []
