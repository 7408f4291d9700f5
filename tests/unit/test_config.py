"""Protocol schema and load-time cross-checks: every error is a ConfigError that
names the YAML path of the offending field; overrides; the protocol digest."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from securevfl.app.loader import load_protocol, load_protocol_dict
from securevfl.config import SCHEMA_VERSION, Protocol
from securevfl.errors import ConfigError
from tests.support.protocols import load_yaml


@pytest.fixture
def doc() -> dict[str, Any]:
    return load_yaml("plain.yaml")


def csv_doc() -> dict[str, Any]:
    """A valid CSV-dataset protocol: label-only active party, two passive files."""
    return {
        "name": "csvcheck",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {"name": "bank", "source": {"path": "bank.csv", "label_column": "label"}},
            "passive": [
                {"name": "shop", "source": {"path": "shop.csv"}, "model": {"out": 8}},
                {"name": "telco", "source": {"path": "telco.csv"}, "model": {"out": 8}},
            ],
        },
    }


def config_error(doc: Any, **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_protocol_dict(doc, **kw)
    return info.value


def test_base_protocol_is_valid(doc):
    proto = load_protocol_dict(doc)
    assert isinstance(proto, Protocol)
    assert proto.n_passive == 2
    assert proto.training.epochs == 10


# -- unknown keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.update(foo=1), "foo"),
        (lambda d: d["training"].update(epochz=3), "training.epochz"),
        (
            lambda d: d["parties"]["passive"][0]["model"].update(foo=1),
            "parties.passive[0].model.foo",
        ),
        (
            lambda d: d["parties"]["passive"][1]["columns"].update(extra="x"),
            "parties.passive[1].columns.extra",
        ),
        (lambda d: d["parties"]["active"].update(labels="y"), "parties.active.labels"),
        (lambda d: d["dataset"].update(shuffle=True), "dataset.shuffle"),
    ],
)
def test_unknown_key_names_its_yaml_path(doc, mutate, path):
    mutate(doc)
    err = config_error(doc)
    assert err.path == path
    assert f"'{path}'" in str(err)
    assert "unknown key" in str(err)


def test_unknown_key_in_file_names_file_and_path(doc, tmp_path):
    doc["parties"]["passive"][0]["model"]["foo"] = 1
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_protocol(f)
    msg = str(info.value)
    assert str(f) in msg
    assert "parties.passive[0].model.foo" in msg and "unknown key" in msg


# -- wrong types and values ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("training", "epochs", "ten"),
        ("training", "epochs", 0),
        ("training", "epochs", [3]),
        ("training", "batch_size", -1),
        ("training", "lr", 0),
        ("training", "optimizer", "rmsprop"),
        ("dataset", "test_fraction", 1.5),
        ("interactive", "out", "wide"),
    ],
)
def test_wrong_type_or_value_names_the_field(doc, section, key, value):
    doc[section][key] = value
    err = config_error(doc)
    assert err.path == f"{section}.{key}"
    assert f"'{section}.{key}'" in str(err)


def test_wrong_type_message_shows_the_bad_value(doc):
    doc["training"]["epochs"] = "ten"
    err = config_error(doc)
    assert "training.epochs" in str(err)
    assert "'ten'" in str(err)


def test_missing_required_field(doc):
    del doc["dataset"]
    err = config_error(doc)
    assert err.path == "dataset"
    assert "missing" in str(err)


def test_several_errors_are_all_listed(doc):
    doc["training"]["epochs"] = "ten"
    doc["training"]["batch_size"] = -1
    msg = str(config_error(doc))
    assert "training.epochs" in msg and "training.batch_size" in msg


def test_non_mapping_document_is_rejected():
    err = config_error(["not", "a", "mapping"])
    assert "mapping" in str(err)


def test_bad_party_name(doc):
    doc["parties"]["passive"][0]["name"] = "has space"
    assert config_error(doc).path == "parties.passive[0].name"


def test_repeated_party_names(doc):
    doc["parties"]["passive"][1]["name"] = doc["parties"]["passive"][0]["name"]
    assert "unique" in str(config_error(doc))


def test_column_select_needs_exactly_one_form(doc):
    doc["parties"]["passive"][0]["columns"] = {"glob": "px_?_[0-3]", "index": [0, 32]}
    err = config_error(doc)
    assert err.path == "parties.passive[0].columns"
    assert "exactly one" in str(err)


# -- --set overrides -----------------------------------------------------------------------


def test_overrides_apply(doc):
    proto = load_protocol_dict(
        doc,
        overrides=[
            "training.epochs=3",
            "training.lr=0.5",
            "parties.passive[1].model.out=16",
            "training.optimizer=sgd",
        ],
    )
    assert proto.training.epochs == 3
    assert proto.training.lr == 0.5
    assert proto.parties.passive[1].model.out == 16
    assert proto.training.optimizer == "sgd"


def test_a_star_override_sets_every_list_element(doc):
    proto = load_protocol_dict(doc, overrides=["parties.passive[*].model.out=16", "interactive.out=16"])
    assert [p.model.out for p in proto.parties.passive] == [16, 16]  # type: ignore[union-attr]
    one = load_protocol_dict(doc, overrides=["parties.passive[0].model.out=16", "interactive.out=16"])
    assert [p.model.out for p in one.parties.passive] == [16, 64]  # type: ignore[union-attr]


def test_overrides_do_not_modify_the_callers_mapping(doc):
    before = copy.deepcopy(doc)
    load_protocol_dict(doc, overrides=["training.epochs=3"])
    assert doc == before


def test_overrides_apply_through_load_protocol(doc, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert load_protocol(f, overrides=["training.batch_size=7"]).training.batch_size == 7


@pytest.mark.parametrize(
    ("expr", "path", "text"),
    [
        ("training.epochs=ten", "training.epochs", "integer"),
        ("training.epochz=3", "training.epochz", "unknown key"),
        ("training.epochs", "--set", "key.path=value"),
        ("=3", "--set", "empty key"),
        ("parties.passive[5].model.out=3", "parties.passive[5]", "no such list element"),
        ("training.epochs.x=1", "training.epochs.x", "non-mapping"),
        ("training.epochs=[1", "training.epochs", "YAML"),
        ("training[*].epochs=1", "training[*]", "non-empty list"),
        ("parties.passive[*].model.outs=1", "parties.passive[0].model.outs", "unknown key"),
    ],
)
def test_bad_overrides_error_with_path(doc, expr, path, text):
    err = config_error(doc, overrides=[expr])
    assert err.path == path
    assert text in str(err)


# -- registries ----------------------------------------------------------------------------


def test_unknown_backend_lists_known_backends(doc):
    doc["exchange"]["backend"] = "magic"
    err = config_error(doc)
    assert err.path == "exchange.backend"
    msg = str(err)
    assert "'magic'" in msg and "known:" in msg and "plain" in msg


def test_unknown_dataset_lists_known_datasets(doc):
    doc["dataset"]["name"] = "mnist"
    err = config_error(doc)
    assert err.path == "dataset.name"
    msg = str(err)
    assert "'mnist'" in msg
    for known in ("csv", "digits", "breast_cancer", "synthetic"):
        assert known in msg


def test_unknown_defense_and_attack(doc):
    d = copy.deepcopy(doc)
    d["parties"]["passive"][0]["defenses"] = [{"name": "no-such-defense"}]
    assert config_error(d).path == "parties.passive[0].defenses[0].name"
    d = copy.deepcopy(doc)
    d["attacks"] = [{"name": "no-such-attack"}]
    assert config_error(d).path == "attacks[0].name"


# -- column layout -------------------------------------------------------------------------


def test_overlapping_column_selections(doc):
    doc["parties"]["passive"][1]["columns"] = {"glob": "px_?_[3-7]"}  # px_?_3 also in 'left'
    err = config_error(doc)
    assert err.path == "parties.passive[1].columns"
    msg = str(err)
    assert "left" in msg and "right" in msg and "px_0_3" in msg


def test_overlapping_names_and_index(doc):
    doc["parties"]["passive"][0]["columns"] = {"index": [0, 10]}
    doc["parties"]["passive"][0]["model"] = {"kind": "mlp"}
    doc["parties"]["passive"][1]["columns"] = {"names": ["px_1_1"]}  # feature #9
    doc["parties"]["passive"][1]["model"] = {"kind": "mlp"}
    assert config_error(doc).path == "parties.passive[1].columns"


def test_unknown_column_names(doc):
    doc["parties"]["passive"][0]["columns"] = {"names": ["px_0_0", "nope"]}
    err = config_error(doc)
    assert err.path == "parties.passive[0].columns.names"
    assert "nope" in str(err)


def test_cnn_input_shape_must_match_column_count(doc):
    doc["parties"]["passive"][0]["model"]["input_shape"] = [1, 8, 8]  # party has 32 columns
    err = config_error(doc)
    assert err.path == "parties.passive[0].model.input_shape"
    assert "64" in str(err) and "32" in str(err)


def test_cnn_needs_input_shape(doc):
    del doc["parties"]["passive"][1]["model"]["input_shape"]
    err = config_error(doc)
    assert err.path == "parties.passive[1].model"
    assert "input_shape" in str(err)


def test_passive_party_needs_columns_and_model(doc):
    d = copy.deepcopy(doc)
    del d["parties"]["passive"][0]["columns"]
    assert config_error(d).path == "parties.passive[0].columns"
    d = copy.deepcopy(doc)
    del d["parties"]["passive"][1]["model"]
    assert config_error(d).path == "parties.passive[1].model"


# -- CSV datasets --------------------------------------------------------------------------


def test_csv_protocol_is_valid():
    proto = load_protocol_dict(csv_doc())
    assert proto.parties.active.source.label_column == "label"
    assert proto.parties.passive[0].source.label_column is None


def test_csv_passive_source_with_label_column_is_rejected():
    d = csv_doc()
    d["parties"]["passive"][1]["source"]["label_column"] = "label"
    err = config_error(d)
    assert err.path == "parties.passive[1].source.label_column"
    assert "must not hold labels" in str(err)


def test_an_active_model_without_its_columns_names_where_to_list_them():
    """An active party given a bottom model but no columns of its own is told where its
    columns go: ``source.feature_columns`` with a CSV file, ``columns`` on a built-in dataset."""
    d = csv_doc()
    d["parties"]["active"]["model"] = {"kind": "mlp", "hidden": [8], "out": 4}
    err = config_error(d)
    assert err.path == "parties.active.model" and "parties.active.source.feature_columns" in str(err)
    d["parties"]["active"]["source"]["feature_columns"] = ["age"]
    assert load_protocol_dict(d).parties.active.source.feature_columns == ["age"]
    b = load_yaml("plain.yaml")
    b["parties"]["active"]["model"] = {"kind": "mlp", "hidden": [8], "out": 4}
    assert "parties.active.columns" in str(config_error(b))


def test_csv_active_source_needs_label_column():
    d = csv_doc()
    del d["parties"]["active"]["source"]["label_column"]
    assert config_error(d).path == "parties.active.source.label_column"


def test_csv_party_needs_source_not_columns():
    d = csv_doc()
    del d["parties"]["passive"][0]["source"]
    assert config_error(d).path == "parties.passive[0].source"
    d = csv_doc()
    d["parties"]["passive"][0]["columns"] = {"glob": "*"}
    assert config_error(d).path == "parties.passive[0].columns"


def test_builtin_dataset_refuses_sources(doc):
    doc["parties"]["passive"][0]["source"] = {"path": "x.csv"}
    assert config_error(doc).path == "parties.passive[0].source"


def test_label_only_active_party_with_model_is_rejected(doc):
    d = csv_doc()
    d["parties"]["active"]["model"] = {"kind": "mlp"}
    err = config_error(d)
    assert err.path == "parties.active.model"
    assert "label-only" in str(err)
    doc["parties"]["active"]["model"] = {"kind": "mlp"}  # built-in dataset, no columns
    assert config_error(doc).path == "parties.active.model"


def test_active_party_with_features_needs_model():
    d = csv_doc()
    d["parties"]["active"]["source"]["feature_columns"] = ["income"]
    assert config_error(d).path == "parties.active.model"
    d["parties"]["active"]["model"] = {"kind": "mlp"}
    assert load_protocol_dict(d).parties.active.model is not None


def test_csv_paths_resolve_relative_to_protocol_file(tmp_path):
    sub = tmp_path / "proto"
    sub.mkdir()
    f = sub / "p.yaml"
    f.write_text(yaml.safe_dump(csv_doc()))
    proto = load_protocol(f)
    assert Path(proto.parties.active.source.path) == (sub / "bank.csv").resolve()
    assert Path(proto.parties.passive[1].source.path) == (sub / "telco.csv").resolve()


# -- digest --------------------------------------------------------------------------------


def test_digest_is_stable_across_loads(doc, tmp_path):
    a = load_protocol_dict(doc).digest()
    assert load_protocol_dict(copy.deepcopy(doc)).digest() == a
    # key order and a round trip through a file do not matter
    reordered = dict(reversed(list(copy.deepcopy(doc).items())))
    assert load_protocol_dict(reordered).digest() == a
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=True))
    assert load_protocol(f).digest() == a
    assert a.startswith(f"v{SCHEMA_VERSION}-") and len(a) == 19 and int(a[3:], 16) >= 0


def test_digest_changes_with_any_field(doc):
    base = load_protocol_dict(doc).digest()
    seen = {base}
    for expr in [
        "training.seed=1",
        "training.epochs=11",
        "parties.passive[0].model.out=63",
        "dataset.test_fraction=0.25",
        "description=other",
    ]:
        d = load_protocol_dict(doc, overrides=[expr]).digest()
        assert d not in seen, expr
        seen.add(d)


def test_a_field_a_later_securevfl_adds_with_its_default_keeps_the_digest(doc, monkeypatch):
    """A run saved now stays usable (predict, --resume) under a securevfl whose
    schema has one more field, set to the default that keeps today's behaviour."""
    proto = load_protocol_dict(doc)
    saved = proto.digest()
    real = Protocol.model_dump

    def upgraded(self: Protocol, **kw: Any) -> dict[str, Any]:  # the schema with training.new_knob: int = 0
        out = real(self, **kw)
        if not kw.get("exclude_defaults"):
            out["training"]["new_knob"] = 0
        return out

    monkeypatch.setattr(Protocol, "model_dump", upgraded)
    assert proto.digest() == saved
    assert proto.digest_mismatch(saved) is None


def test_a_digest_an_older_securevfl_saved_is_read_and_an_incompatible_one_said(doc):
    proto = load_protocol_dict(doc)
    assert proto.digest_mismatch(proto.legacy_digest()) is None  # saved before the schema version
    changed = load_protocol_dict(doc, overrides=["training.epochs=11"])
    older = proto.digest_mismatch(changed.legacy_digest())
    assert older is not None and "older securevfl" in older and "incompatible" in older
    other = proto.digest_mismatch(f"v{SCHEMA_VERSION + 1}-" + proto.digest()[-16:])
    assert other is not None and "incompatible" in other and f"v{SCHEMA_VERSION + 1}" in other
    edited = proto.digest_mismatch(changed.digest())
    assert edited is not None and "different protocol" in edited and "incompatible" not in edited
    assert proto.digest_mismatch("not a digest") is not None


def test_digest_same_for_override_and_edit(doc):
    via_set = load_protocol_dict(doc, overrides=["training.epochs=3"]).digest()
    doc["training"]["epochs"] = 3
    assert load_protocol_dict(doc).digest() == via_set


# -- numbers and sizes are checked at load (no inf, NaN, overflow, negative widths) --


@pytest.mark.parametrize(
    ("path", "value", "text"),
    [
        ("training.lr", float("inf"), "not a finite number"),
        ("interactive.lr", float("inf"), "not a finite number"),
        ("training.lr", float("nan"), "not a finite number"),
        ("training.lr", 1.0e308, "beyond float32's range"),
        ("training.batch_size", 10**30, "beyond int64's range"),
        ("parties.passive[0].model.hidden", [-3], "greater than 0"),
        ("top.hidden", [0], "greater than 0"),
        ("interactive.out", 1 << 30, "less than or equal to 65536"),
    ],
)
def test_bad_numbers_are_refused_at_load_with_their_path(doc, path, value, text):
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {}) if isinstance(k, str) else node[k]
    node[keys[-1]] = value
    err = config_error(doc)
    shown = path + ("[0]" if isinstance(value, list) else "")
    assert err.path == shown and text in str(err), str(err)


def test_negative_cnn_input_shape_is_refused(doc):
    doc["parties"]["passive"][0]["model"] = {"kind": "cnn", "input_shape": [1, -8, 4], "out": 8}
    err = config_error(doc)
    assert err.path == "parties.passive[0].model.input_shape[1]"


def test_non_finite_component_parameter_is_refused_with_its_path(doc):
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": float("inf")}}]
    err = config_error(doc)
    assert err.path == "parties.active.defenses[0].params.epsilon" and "not a finite number" in str(err)


def test_non_finite_override_is_refused(doc):
    with pytest.raises(ConfigError, match=r"at 'training\.lr': not a finite number"):
        load_protocol_dict(doc, overrides=["training.lr=.inf"])


def test_binary_protocol_file_is_refused(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="not a text file"):
        load_protocol(f)
    f.write_bytes(b"name: a\x00b\n")
    with pytest.raises(ConfigError, match="NUL bytes"):
        load_protocol(f)


# -- the digest covers what the parties agree on, not where each keeps its file --


def _csv_folder(root: Path, doc: dict[str, Any]) -> Path:
    root.mkdir()
    for p in [doc["parties"]["active"], *doc["parties"]["passive"]]:
        (root / p["source"]["path"]).write_text("id,x\n")
    f = root / "protocol.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_same_protocol_in_two_folders_has_one_digest(tmp_path):
    doc = csv_doc()
    a = load_protocol(_csv_folder(tmp_path / "host_a", doc))
    b = load_protocol(_csv_folder(tmp_path / "host_b", doc))
    assert a.parties.active.source.path != b.parties.active.source.path  # each resolved locally
    assert a.digest() == b.digest()


def test_digest_still_covers_the_source_columns(tmp_path):
    doc = csv_doc()
    other = copy.deepcopy(doc)
    other["parties"]["active"]["source"]["label_column"] = "outcome"
    a = load_protocol(_csv_folder(tmp_path / "a", doc))
    b = load_protocol(_csv_folder(tmp_path / "b", other))
    assert a.digest() != b.digest()


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "", "a b", "a\\b", "x" * 101])
def test_the_protocol_name_cannot_leave_its_folder(doc, name):
    doc["name"] = name
    err = config_error(doc)
    assert err.path == "name" and "names its output folder" in str(err), err


@pytest.mark.parametrize("name", ["plain", "demo_mpc", "v1.2", "run-3", "lr=0.1,b+c", "7"])
def test_plain_protocol_names_are_accepted(doc, name):
    doc["name"] = name
    assert load_protocol_dict(doc).name == name


@pytest.mark.parametrize(
    ("synthetic", "path"),
    [
        ({"rows": 10**10}, "dataset.synthetic.rows"),
        ({"rows": 10**7, "features": 1000}, "dataset.synthetic"),
        ({"features": 10**6}, "dataset.synthetic.features"),
        ({"classes": 10**6}, "dataset.synthetic.classes"),
    ],
)
def test_a_synthetic_table_too_large_to_build_is_refused(synthetic, path):
    doc = {
        "name": "syn",
        "dataset": {"name": "synthetic", "synthetic": synthetic},
        "parties": {"passive": [{"name": "p", "columns": {"index": [0, 2]}, "model": {"out": 4}}]},
    }
    assert config_error(doc).path == path


# -- models by import path, plugins ----------------------------------------------------------


def test_a_factory_model_entry_loads_and_round_trips(doc):
    model = {"factory": "my_models:bottom", "params": {"hidden": 8}, "out": 16}
    doc["parties"]["passive"][0]["model"] = model
    doc["top"] = {"factory": "my_models.tops:Top.build", "params": {"depth": 2}}
    proto = load_protocol_dict(doc)
    m = proto.parties.passive[0].model
    assert m.factory == "my_models:bottom" and m.params == {"hidden": 8} and m.builtin_params() is None
    assert proto.parties.passive[1].model.builtin_params() == {"input_shape": [1, 8, 4], "channels": 8}
    again = Protocol.model_validate_json(proto.model_dump_json())  # as a rank receives it
    assert again.parties.passive[0].model == m and again.top == proto.top


@pytest.mark.parametrize(
    ("model", "path", "text"),
    [
        ({"kind": "cnn", "factory": "m:f", "out": 4}, "model", "either 'kind'"),
        ({"factory": "m:f", "hidden": [8], "out": 4}, "model", "'hidden' is an option of the built-in"),
        ({"factory": "m:f", "channels": 3, "out": 4}, "model", "'channels' is an option of the built-in"),
        ({"kind": "mlp", "params": {"hidden": [8]}, "out": 4}, "model", "at the top level"),
        ({"factory": "m.f", "out": 4}, "model.factory", "should match pattern"),
        ({"factory": "m:f", "init": "random", "out": 4}, "model.init", "'private' or 'seeded'"),
    ],
)
def test_a_model_entry_names_one_source_and_its_options_in_their_place(doc, model, path, text):
    doc["parties"]["passive"][0]["model"] = model
    err = config_error(doc)
    assert err.path == f"parties.passive[0].{path}" and text in str(err)


def test_a_top_factory_takes_params_and_the_builtin_hidden(doc):
    doc["top"] = {"factory": "m:f", "hidden": [8]}
    assert "'hidden' is an option of the built-in top" in str(config_error(doc))
    doc["top"] = {"hidden": [8], "params": {"x": 1}}
    assert "the built-in top model takes 'hidden'" in str(config_error(doc))


def test_plugins_are_module_names(doc):
    doc["plugins"] = ["my plugin"]
    assert config_error(doc).path == "plugins[0]"


def test_digest_covers_factories_plugins_and_init_but_not_their_defaults(doc):
    base = load_protocol_dict(doc).digest()
    explicit = copy.deepcopy(doc)
    explicit["plugins"] = []
    explicit["parties"]["passive"][0]["model"].update({"init": "private", "params": {}, "factory": None})
    assert load_protocol_dict(explicit).digest() == base
    seen = {base}
    for expr in [
        "parties.passive[0].model.init=seeded",
        "parties.passive[0].model={factory: 'm:f', out: 64}",
        "parties.passive[0].model={factory: 'm:f', out: 64, params: {a: 1}}",
        "top={factory: 'm:top'}",
    ]:
        d = load_protocol_dict(doc, overrides=[expr]).digest()
        assert d not in seen, expr
        seen.add(d)
