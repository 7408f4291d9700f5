"""Plugins (securevfl.plugins) and who may import them (securevfl.app.loader):
a protocol's plugins are imported before it is checked, only where the process's
invocation allows them, and what they register is then known to the protocol."""

from __future__ import annotations

import copy
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from securevfl import plugins
from securevfl.app.loader import (
    OWN,
    load_checked,
    load_checked_dict,
    load_protocol,
    load_protocol_dict,
    needed_code,
)
from securevfl.attacks import ATTACKS
from securevfl.cli import main
from securevfl.data.catalog import DATASETS
from securevfl.defenses import DEFENSES
from securevfl.errors import ConfigError, UserCodeError
from securevfl.models import MODELS
from tests.support.protocols import load_yaml

PLUGIN = """
import torch
from torch import nn
from securevfl.plugins import Defense, DefenseOptions, register_defense, register_model

MARKS = {marks!r}
open(MARKS, "a").write("imported\\n")

class HalveOptions(DefenseOptions):
    factor: float = 0.5

@register_defense
class Halve(Defense[HalveOptions]):
    name = {defense!r}
    sides = frozenset({{"passive"}})
    options = HalveOptions

    def embed(self, h, *, train):
        return h * self.params.factor

    def embed_local(self, h):
        return h * self.params.factor

@register_model({model!r})
def tiny(in_features, out, *, width=4):
    return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, out))

def tiny_bottom(in_features, out, *, width=4):
    return tiny(in_features, out, width=width)

class Wide(nn.Module):
    def __init__(self, in_features, out, depth):
        super().__init__()

NOT_CALLABLE = 3
"""


@pytest.fixture
def plugin(tmp_path: Path):
    """A plugin module beside a protocol file in ``tmp_path`` (its names unique to
    the test), and the protocol document using what it registers; every trace of
    it is removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    name, defense, model = f"svfl_plugin_{tag}", f"halve_{tag}", f"tiny_{tag}"
    marks = tmp_path / "marks.txt"
    (tmp_path / f"{name}.py").write_text(PLUGIN.format(marks=str(marks), defense=defense, model=model))
    doc = load_yaml("plain.yaml")
    doc["plugins"] = [name]
    left = doc["parties"]["passive"][0]
    left["defenses"] = [{"name": defense, "params": {"factor": 0.25}}]
    left["model"] = {"kind": model, "params": {"width": 6}, "out": 16}
    finders = list(sys.meta_path)
    file = str(tmp_path / f"{name}.py")  # how a party allows it: by the file's path
    yield {
        "name": name,
        "file": file,
        "defense": defense,
        "model": model,
        "doc": doc,
        "marks": marks,
        "dir": tmp_path,
    }
    sys.modules.pop(name, None)
    sys.meta_path[:] = finders
    DEFENSES.remove(defense)
    MODELS.remove(model)


def _imported(p: dict[str, Any]) -> int:
    return p["marks"].read_text().count("imported") if p["marks"].exists() else 0


def test_a_plugin_not_allowed_is_refused_before_it_is_imported(plugin):
    for allow in ((), ("other_module",), (plugin["name"] + "x",)):
        with pytest.raises(UserCodeError) as err:
            load_protocol_dict(copy.deepcopy(plugin["doc"]), allow=allow, beside=plugin["dir"])
        assert f"plugin '{plugin['name']}'" in str(err.value) and err.value.path == "plugins[0]"
        assert "--allow-plugin" in str(err.value)
    assert _imported(plugin) == 0 and plugin["name"] not in sys.modules


def test_an_allowed_plugin_registers_what_the_protocol_uses(plugin):
    comps = load_checked_dict(
        copy.deepcopy(plugin["doc"]), allow=[plugin["file"]], beside=plugin["dir"]
    ).components
    assert _imported(plugin) == 1
    assert comps.party("left").names() == [plugin["defense"]]
    assert comps.code.allows(plugin["name"])
    assert plugin["model"] in MODELS
    # a second load imports nothing again (one registration per process)
    load_protocol_dict(copy.deepcopy(plugin["doc"]), allow=[plugin["file"]], beside=plugin["dir"])
    assert _imported(plugin) == 1


def test_a_protocol_file_allows_its_own_modules_in_the_local_launcher(plugin):
    doc = plugin["doc"]
    doc["parties"]["passive"][1]["model"] = {"factory": f"{plugin['name']}:tiny_bottom", "out": 16}
    f = plugin["dir"] / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    code = load_checked(f, allow=OWN).code
    assert code.allows(plugin["name"]) and not code.allows("numpy")
    assert code.beside == str(plugin["dir"].resolve())


def test_a_party_checks_its_own_factories_with_the_plugins_before_importing(plugin):
    doc = plugin["doc"]
    doc["parties"]["passive"][1]["model"] = {"factory": "right_models:bottom", "out": 16}
    doc["top"] = {"factory": "top_models:top"}
    assert [n.module for n in needed_code(load_protocol_dict(_no_plugins(doc)), 2)] == ["right_models"]
    assert [n.module for n in needed_code(load_protocol_dict(_no_plugins(doc)), 0)] == ["top_models"]
    assert needed_code(load_protocol_dict(_no_plugins(doc)), 1) == []
    assert needed_code(load_protocol_dict(_no_plugins(doc)), 3) == []  # a helper rank
    with pytest.raises(UserCodeError, match="model factory 'right_models:bottom' of party 'right'"):
        load_protocol_dict(copy.deepcopy(doc), allow=[plugin["file"]], rank=2, beside=plugin["dir"])
    assert _imported(plugin) == 0  # the allowed plugin was not imported either
    # rank 1 does not import the right party's factory: its plugin is all it needs
    load_protocol_dict(copy.deepcopy(doc), allow=[plugin["file"]], rank=1, beside=plugin["dir"])
    assert _imported(plugin) == 1


def _no_plugins(doc: dict[str, Any]) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    d.pop("plugins")
    d["parties"]["passive"][0].pop("defenses")
    d["parties"]["passive"][0]["model"] = {"kind": "mlp", "out": 16}
    return d


def test_a_plugin_that_fails_on_import_is_named_without_a_traceback(plugin, tmp_path):
    name = f"svfl_bad_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from securevfl.plugins import register_dataset\n"
        "register_dataset('digits')(lambda spec, seed: None)\n"  # a built-in name, not forced
    )
    doc = copy.deepcopy(plugin["doc"])
    doc["plugins"] = [name]
    doc["parties"]["passive"][0].pop("defenses")
    doc["parties"]["passive"][0]["model"] = {"kind": "mlp", "out": 16}
    try:
        with pytest.raises(
            UserCodeError, match=rf"plugin '{name}': module '{name}' failed while it was"
        ) as err:
            load_protocol_dict(doc, allow=[str(tmp_path / f"{name}.py")], beside=tmp_path)
        assert err.value.detail is not None and "dataset 'digits' is already registered" in err.value.detail
    finally:
        sys.modules.pop(name, None)


def test_registration_refuses_duplicates_unless_forced_and_checks_the_class():
    class Opts(plugins.DefenseOptions):
        pass

    class One(plugins.Defense[Opts]):
        name = f"dup_{uuid.uuid4().hex[:8]}"
        options = Opts

    plugins.register_defense(One)
    try:
        with pytest.raises(ValueError, match="already registered"):
            plugins.register_defense(One)
        assert plugins.register_defense(force=True)(One) is One
        assert DEFENSES.get(One.name) is One
    finally:
        DEFENSES.remove(One.name)
    with pytest.raises(TypeError, match=r"subclass of securevfl\.plugins\.Defense"):
        plugins.register_defense(int)  # type: ignore[arg-type]

    class Nameless(plugins.Attack[plugins.AttackOptions]):
        pass

    with pytest.raises(TypeError, match="needs its own 'name'"):
        plugins.register_attack(Nameless)
    with pytest.raises(ValueError, match="'csv' is the parties' own files"):
        plugins.register_dataset("csv")


def test_registered_attacks_and_datasets_are_known_by_name(tmp_path):
    tag = uuid.uuid4().hex[:8]

    @plugins.register_attack
    class Probe(plugins.Attack[plugins.AttackOptions]):
        name = f"probe_{tag}"

    @plugins.register_dataset(f"data_{tag}")
    def build(spec: plugins.DatasetSpec, seed: int) -> plugins.Table:
        raise NotImplementedError

    try:
        doc = load_yaml("plain.yaml")
        doc["attacks"] = [{"name": Probe.name}]
        assert load_checked_dict(doc).components.attacks[0].cls is Probe
        doc["dataset"]["name"] = f"data_{tag}"
        load_protocol_dict(doc)  # a registered dataset's columns are checked when it is built
    finally:
        ATTACKS.remove(Probe.name)
        DATASETS.remove(f"data_{tag}")


def test_an_unknown_model_kind_lists_the_known_ones():
    doc = load_yaml("plain.yaml")
    doc["parties"]["passive"][0]["model"] = {"kind": "resnet", "out": 16}
    with pytest.raises(ConfigError) as err:
        load_protocol_dict(doc)
    assert err.value.path == "parties.passive[0].model.kind"
    assert "unknown model 'resnet'" in str(err.value) and "mlp" in str(err.value)


def test_a_registered_task_is_named_by_the_protocol_and_reads_its_labels():
    import numpy as np
    import pandas as pd

    from securevfl.data.party_data import labels_for_task
    from securevfl.parties.task_kinds import TASKS
    from securevfl.parties.tasks import Regression

    tag = uuid.uuid4().hex[:8]

    @plugins.register_task
    class Ranking(Regression):
        name = f"ranking_{tag}"

    try:
        doc = load_yaml("diabetes_regression.yaml")
        doc["task"] = Ranking.name
        assert load_protocol_dict(doc).task == Ranking.name
        ids = pd.Series(["a", "b", "c"])
        y, classes, kind = labels_for_task(
            pd.Series([1.5, 2.0, 7.0]), "p", "y", ids, "f", Ranking.name, False
        )
        assert kind == Ranking.name and classes is None and y.dtype == np.float32
        y, classes, kind = labels_for_task(pd.Series(["x", "y", "x"]), "p", "y", ids, "f", "votes", True)
        assert kind == "votes" and classes == ["x", "y"] and list(y) == [0, 1, 0]
        doc["task"] = "unheard_of"
        with pytest.raises(ConfigError, match="unknown task 'unheard_of'"):
            load_protocol_dict(doc)
    finally:
        TASKS.remove(Ranking.name)

    class NoKind(plugins.Task):
        name = f"nokind_{tag}"

    with pytest.raises(TypeError, match="needs 'has_classes'"):
        plugins.register_task(NoKind)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"factory": "{name}:tiny_botom"}, "module '{name}' has no 'tiny_botom'"),
        ({"factory": "{name}x:tiny_bottom"}, "no module named '{name}x' (looked on the Python path)"),
        ({"factory": "{name}:NOT_CALLABLE"}, "factory '{name}:NOT_CALLABLE' is not callable (a int)"),
        (
            {"factory": "{name}:tiny_bottom", "params": {"widht": 6}},
            "cannot be called as factory(in_features, out, **params) with params ['widht']: got an "
            "unexpected keyword argument 'widht'",
        ),
        ({"factory": "{name}:Wide"}, "with no params: missing a required argument: 'depth'"),
    ],
)
def test_a_factory_that_cannot_be_called_is_refused_at_load_naming_its_field(plugin, model, says):
    """Where the process may import the factory's module (the local launcher: the
    file's own; validate: what --allow-plugin allows), a misspelt module,
    attribute or option is refused when the file is loaded, before any rank
    starts, naming the field; nothing is called."""
    name = plugin["name"]
    doc = plugin["doc"]
    doc["parties"]["passive"][1]["model"] = {
        **{k: v.format(name=name) if isinstance(v, str) else v for k, v in model.items()},
        "out": 16,
    }
    f = plugin["dir"] / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    # a misspelt module is not one validate's --allow-plugin allows: left to its owner's rank
    for allow in (OWN,) if "no module" in says else (OWN, [plugin["file"]]):
        with pytest.raises(UserCodeError) as err:
            load_protocol(f, allow=allow)
        assert err.value.path == "parties.passive[1].model.factory", err.value
        assert says.format(name=name) in str(err.value)
        assert "bottom model of party 'right': factory" in str(err.value)


def test_a_factory_is_checked_only_where_its_module_may_be_imported(plugin):
    """validate without the factory's module allowed, and a party whose peer's
    factory it may not import, leave it to its owner's rank."""
    other = plugin["dir"] / "theirs.py"
    other.write_text(f"open({str(plugin['marks'])!r}, 'a').write('theirs\\n')\n")
    doc = plugin["doc"]
    doc["parties"]["passive"][1]["model"] = {"factory": "theirs:missing", "out": 16}
    f = plugin["dir"] / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    load_protocol(f, allow=[plugin["file"]])  # validate --allow-plugin PLUGIN
    load_protocol(f, allow=[plugin["file"]], rank=1)  # the left party's rank
    assert "theirs" not in plugin["marks"].read_text() and "theirs" not in sys.modules
    with pytest.raises(UserCodeError, match="has no 'missing'"):
        load_protocol(f, allow=OWN)
    sys.modules.pop("theirs", None)


def test_validate_refuses_a_misspelt_factory_with_exit_code_2(plugin, capsys):
    doc = plugin["doc"]
    doc["parties"]["passive"][1]["model"] = {"factory": f"{plugin['name']}:tiny_botom", "out": 16}
    f = plugin["dir"] / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(f), "--allow-plugin", plugin["file"]]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "at 'parties.passive[1].model.factory'" in err and "has no 'tiny_botom'" in err
    assert "Traceback" not in err


def test_a_built_in_replaced_with_force_is_said_in_the_output_and_the_result(recwarn):
    """``force=True`` may put user code under a built-in's name; a run that uses the
    name then says so: a SecurityWarning where the party builds its defenses, and the
    replacement in its summary (``replaced_builtins``, merged into result.json)."""
    from pydantic import Field

    from securevfl.defenses.base import build_stack
    from securevfl.errors import SecurityWarning
    from securevfl.records import RankSummary
    from tests.support.protocols import small_digits

    class Opts(plugins.DefenseOptions):
        epsilon: float = Field(default=1.0)

    class Impostor(plugins.Defense[Opts]):
        name = "label_dp"
        options = Opts
        sides = frozenset({"active"})

    builtin = DEFENSES.get("label_dp")
    assert DEFENSES.replaced("label_dp") is None
    plugins.register_defense(force=True)(Impostor)
    try:
        origin = f"{Impostor.__module__}:{Impostor.__qualname__}"
        assert DEFENSES.replaced("label_dp") == origin
        doc = small_digits()
        doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 2.0}}]
        checked = load_checked_dict(doc)
        proto = checked.protocol
        stack = build_stack(proto, checked.components, proto.parties.active.name, "active")
        said = [str(w.message) for w in recwarn if issubclass(w.category, SecurityWarning)]
        assert said and "defense 'label_dp' is not securevfl's built-in" in said[0] and origin in said[0]
        assert stack.replaced == {"label_dp": origin}
        summary = RankSummary(rank=0, party="active", role="active", pid=1, replaced_builtins=stack.replaced)
        assert summary.to_json()["replaced_builtins"] == {"label_dp": origin}
        plugins.register_defense(force=True)(Impostor)  # replaced again: still user code
        assert DEFENSES.replaced("label_dp") == origin
    finally:
        DEFENSES.add("label_dp", builtin, force=True)
    assert DEFENSES.replaced("label_dp") is None and DEFENSES.get("label_dp") is builtin
