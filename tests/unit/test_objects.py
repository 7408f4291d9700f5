"""Python objects where a protocol names things (securevfl.app.objects): what
can be referred to by ``module:name`` and what is refused, naming the field; the
rewrite of a protocol mapping; the registration of a script's defense and attack
classes for one call, in the caller and in a rank; the running script's own
objects."""

from __future__ import annotations

import functools
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from securevfl import api
from securevfl.app.objects import Registration, convert, reference_of, register_in_rank, registered
from securevfl.attacks.base import ATTACKS
from securevfl.defenses.base import DEFENSES
from securevfl.errors import ConfigError, UserCodeError
from securevfl.usercode import CodePolicy
from tests.support import user_components as uc
from tests.support.protocols import ROOT, small_digits

MOD = "tests.support.user_components"


def test_top_level_functions_and_classes_are_referred_to_by_module_and_name() -> None:
    assert reference_of(uc.bottom, field="f") == f"{MOD}:bottom"
    assert reference_of(uc.Rounding, field="f") == f"{MOD}:Rounding"


def _local() -> Any:
    def inner(n: int, out: int) -> None:
        return None

    return inner


class Holder:
    class Inner:
        pass

    def __call__(self, n: int, out: int) -> None:
        return None


def _impostor() -> types.FunctionType:
    """A function that says it is user_components.bottom, which it is not."""
    fn = types.FunctionType(uc.bottom.__code__, {}, "bottom")
    fn.__module__ = MOD
    fn.__qualname__ = "bottom"
    return fn


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (lambda n, out: None, "a lambda"),
        (_local(), "inside a function"),
        (Holder.Inner, "inside a function or a class"),
        (Holder(), "not a class or a function"),
        (functools.partial(uc.bottom, hidden=3), "not a class or a function"),
        (len, "not a class or a function"),
        (_impostor(), "does not lead back"),
    ],
)
def test_what_a_rank_cannot_import_is_refused_naming_the_field(obj: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        reference_of(obj, field="parties.passive[0].model.factory")
    assert info.value.path == "parties.passive[0].model.factory"


def _doc() -> dict[str, Any]:
    doc = small_digits()
    doc["parties"]["passive"][0]["model"] = {"factory": uc.bottom, "out": 16}
    doc["parties"]["passive"][0]["defenses"] = [uc.Rounding]
    doc["parties"]["passive"][1]["defenses"] = [{"name": uc.Rounding, "params": {"decimals": 2}}]
    doc["top"] = {"factory": uc.bottom}
    doc["attacks"] = [{"name": uc.Idle}, {"name": "membership_inference"}]
    return doc


def test_a_mapping_s_objects_become_names_and_references() -> None:
    doc = _doc()
    conv = convert(doc)
    passive = conv.doc["parties"]["passive"]
    assert passive[0]["model"] == {"factory": f"{MOD}:bottom", "out": 16}
    assert passive[0]["defenses"] == [{"name": "test_rounding"}]
    assert passive[1]["defenses"] == [{"name": "test_rounding", "params": {"decimals": 2}}]
    assert passive[1]["model"] == doc["parties"]["passive"][1]["model"]  # untouched
    assert conv.doc["top"] == {"factory": f"{MOD}:bottom"}
    assert conv.doc["attacks"] == [{"name": "test_idle"}, {"name": "membership_inference"}]
    assert conv.registrations == (
        Registration("defense", "test_rounding", f"{MOD}:Rounding"),
        Registration("attack", "test_idle", f"{MOD}:Idle"),
    )
    assert conv.registrations[0].cls is uc.Rounding
    assert conv.modules == (MOD,)
    assert doc["parties"]["passive"][0]["defenses"] == [uc.Rounding]  # the caller's mapping as it was
    assert convert(small_digits()).registrations == ()


@pytest.mark.parametrize(
    ("where", "value", "path", "needle"),
    [
        (("training", "lr"), uc.bottom, "training.lr", "takes plain data"),
        (
            ("parties", "passive", 0, "defenses"),
            [uc.Idle],
            "parties.passive[0].defenses[0]",
            "Defense subclass",
        ),
        (("attacks",), [uc.Rounding], "attacks[0]", "Attack subclass"),
        (
            ("parties", "passive", 0, "defenses"),
            [uc.Named],
            "parties.passive[0].defenses[0]",
            "another defense",
        ),
        (
            ("parties", "active", "defenses"),
            [{"name": lambda: 0}],
            "parties.active.defenses[0].name",
            "Defense",
        ),
        (("top",), {"factory": lambda i, o: None}, "top.factory", "a lambda"),
    ],
)
def test_objects_that_cannot_go_there_are_refused_naming_the_field(
    where: tuple[Any, ...], value: Any, path: str, needle: str
) -> None:
    doc = small_digits()
    node: Any = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(ConfigError, match=needle) as info:
        convert(doc)
    assert info.value.path == path


def test_two_classes_under_one_name_are_refused() -> None:
    other = type("Rounding2", (uc.Rounding,), {"__module__": MOD})
    uc.Rounding2 = other  # type: ignore[attr-defined]  # importable, and named as Rounding is
    try:
        doc = small_digits()
        doc["parties"]["passive"][0]["defenses"] = [uc.Rounding]
        doc["parties"]["passive"][1]["defenses"] = [other]
        with pytest.raises(ConfigError, match="two different defense classes are named 'test_rounding'"):
            convert(doc)
    finally:
        del uc.Rounding2  # type: ignore[attr-defined]


def test_classes_are_registered_for_the_call_only() -> None:
    conv = convert(_doc())
    assert "test_rounding" not in DEFENSES and "test_idle" not in ATTACKS
    with registered(conv.registrations):
        assert DEFENSES.get("test_rounding") is uc.Rounding and ATTACKS.get("test_idle") is uc.Idle
    assert "test_rounding" not in DEFENSES and "test_idle" not in ATTACKS
    with pytest.raises(RuntimeError), registered(conv.registrations):
        raise RuntimeError  # removed when the call fails too
    assert "test_rounding" not in DEFENSES


def test_a_rank_registers_them_by_reference() -> None:
    regs = convert(_doc()).registrations
    try:
        register_in_rank([r.for_rank() for r in regs], CodePolicy().allowing(r.module for r in regs))
        assert DEFENSES.get("test_rounding") is uc.Rounding and ATTACKS.get("test_idle") is uc.Idle
    finally:
        DEFENSES.remove("test_rounding")
        ATTACKS.remove("test_idle")


def test_a_rank_takes_a_module_that_registers_its_own_class_as_it_is() -> None:
    """Importing the module registers the class; registering it again is no error."""
    name, module = "test_self_registered", "tests.support.user_plugin"
    sys.modules.pop(module, None)
    DEFENSES.remove(name)
    try:
        register_in_rank([("defense", name, f"{module}:SelfRegistered")], CodePolicy(frozenset({module})))
        assert DEFENSES.get(name) is sys.modules[module].SelfRegistered
    finally:
        DEFENSES.remove(name)
        sys.modules.pop(module, None)


def test_a_rank_loads_a_class_only_under_its_policy() -> None:
    """A rank's policy is the single gate: a class whose module the launcher's
    policy does not allow is refused, naming it, and nothing is imported."""
    name, module = "test_self_registered", "tests.support.user_plugin"
    sys.modules.pop(module, None)
    DEFENSES.remove(name)
    try:
        with pytest.raises(UserCodeError, match=f"defense class '{name}'.*not allowed|not allowed.*{name}"):
            register_in_rank([("defense", name, f"{module}:SelfRegistered")], CodePolicy())
        assert module not in sys.modules and name not in DEFENSES
    finally:
        DEFENSES.remove(name)
        sys.modules.pop(module, None)


def test_load_protocol_refuses_a_class_it_could_not_keep_registered() -> None:
    doc = small_digits()
    doc["parties"]["passive"][0]["defenses"] = [uc.Rounding]
    with pytest.raises(ConfigError, match="load_protocol takes defenses by name"):
        api.load_protocol(doc)


SCRIPT = """
from securevfl.app.objects import reference_of
from securevfl.errors import ConfigError

def bottom(in_features, out):
    return None

if __name__ == "__main__":
    try:
        print(reference_of(bottom, field="f"))
    except ConfigError as exc:
        print("refused:", exc)
"""


def _python(args: list[str], cwd: Path) -> str:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_running_script_s_objects_are_referred_to_by_its_module_name(tmp_path: Path) -> None:
    """A rank imports the script under its file name (its folder is on sys.path);
    code with no importable main module is refused."""
    (tmp_path / "exp.py").write_text(SCRIPT)
    assert _python(["exp.py"], tmp_path) == "exp:bottom"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "exp.py").write_text(SCRIPT)
    assert _python(["-m", "pkg.exp"], tmp_path) == "pkg.exp:bottom"
    refused = "refused: at 'f': bottom is defined in a main module that cannot be imported by name"
    assert _python(["-c", SCRIPT], tmp_path).startswith(refused)
