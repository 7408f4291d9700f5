"""What a bottom-model factory receives (securevfl.data.layout, securevfl.models):
the party's input columns in order, each with its source and kind, and the
one-hot block of each categorical column, built from the fitted preprocessing
alone (the same from the saved state at prediction); a factory that declares
``layout`` gets it and one that does not is called as before; a partial
``preprocess.standardize`` list z-scores the columns it names, and a name that
is not a numeric column of the party is refused naming the field and the party."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from securevfl.app.loader import load_protocol_dict
from securevfl.attacks.views import own_layout
from securevfl.config import CsvSource, ModelSpec, PreprocessSpec
from securevfl.data.columns import check_standardize
from securevfl.data.fitted import apply_fitted, from_saved
from securevfl.data.layout import (
    FeatureLayout,
    InputColumn,
    categorical_blocks,
    feature_layout,
    fitted_columns,
    plain_layout,
    select_columns,
)
from securevfl.data.party_data import load_party_data
from securevfl.data.preprocess import fit_preprocessor
from securevfl.errors import ConfigError, DataError, UserCodeError
from securevfl.models import build_bottom
from securevfl.parties.state import PreprocessState
from securevfl.records import OwnView
from securevfl.usercode import accepts_layout, check_factory, policy_of
from tests.support.protocols import load_yaml


def spec(**kw: Any) -> PreprocessSpec:
    return PreprocessSpec.model_validate(kw)


def frame(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    f = pd.DataFrame(
        {
            "age": rng.normal(40, 10, n),
            "income": rng.lognormal(3, 1, n),
            "visits": rng.integers(0, 5, n).astype(float),
            "region": rng.choice(["north", "south", "east"], n, p=[0.5, 0.45, 0.05]),
            "plan": rng.choice(["a", "b"], n),
        }
    )
    f.loc[[1, 2], "income"] = np.nan
    return f


MIXED = {
    "categorical": {"columns": ["region", "plan"], "min_frequency": 3},
    "impute": {"columns": ["income"]},
    "log1p": ["income"],
    "standardize": ["age", "income"],
}


def fitted_layout(pre_spec: PreprocessSpec, f: pd.DataFrame) -> tuple[Any, FeatureLayout]:
    pre = fit_preprocessor(pre_spec, "lab", f)
    return pre, feature_layout("lab", pre.columns, from_saved(pre.fitted(), "lab"), standardized=False)


def test_the_layout_describes_every_input_column_in_the_order_the_model_receives_them():
    f = frame()
    pre, lay = fitted_layout(spec(**MIXED), f)
    assert lay.names == tuple(pre.columns) and lay.width == 9
    got = [(c.kind, c.source, c.category, c.log, c.standardized) for c in lay.columns]
    assert got == [
        ("numeric", "income", None, "log1p", True),  # log1p, imputed, standardized
        ("missing_indicator", "income", None, None, True),  # the indicator is scaled with its group
        ("numeric", "age", None, None, True),  # complete, standardized
        ("numeric", "visits", None, None, False),  # complete, not in the standardize list
        ("category", "region", "north", None, False),  # "east" is rare: in the "other" column
        ("category", "region", "south", None, False),
        ("other", "region", None, None, False),
        ("category", "plan", "a", None, False),
        ("category", "plan", "b", None, False),
    ]
    assert [c.index for c in lay.columns] == list(range(9))
    region, plan = lay.categorical
    assert (region.column, region.start, region.stop, region.cardinality) == ("region", 4, 7, 3)
    assert region.categories == ("north", "south") and region.has_other
    assert (plan.column, plan.columns, plan.cardinality, plan.has_other) == ("plan", slice(7, 9), 2, False)
    assert lay.block("plan") is plan and lay.numeric == (0, 1, 2, 3)
    with pytest.raises(KeyError):
        lay.block("age")
    # the blocks hold what the layout says: one 1 per row, at the row's category
    x = pre.transform(f)
    for b in lay.categorical:
        block = x[:, b.columns]
        assert (block.sum(axis=1) == 1).all()
        names = [*b.categories, "other"] if b.has_other else list(b.categories)
        expect = [v if v in b.categories else "other" for v in f[b.column]]
        assert [names[k] for k in block.argmax(axis=1)] == expect


def test_an_unseen_category_without_an_other_column_leaves_its_block_empty():
    """What the layout's docstring promises a factory about a block without "other"."""
    train = pd.DataFrame({"plan": ["a", "b"] * 5})
    pre, lay = fitted_layout(spec(categorical={"columns": ["plan"]}), train)
    (plan,) = lay.categorical
    assert not plan.has_other and plan.cardinality == 2
    x = pre.transform(pd.DataFrame({"plan": ["c", "a"]}))
    assert x[:, plan.columns].tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_the_layout_is_the_same_from_the_saved_state_as_at_training():
    f = frame()
    pre, lay = fitted_layout(spec(**MIXED), f)
    state = PreprocessState(inputs=list(pre.inputs), columns=list(pre.columns), fitted=pre.fitted())
    saved = PreprocessState.model_validate(json.loads(json.dumps(state.model_dump())))
    assert state.layout("lab") == lay
    assert saved.layout("lab") == lay  # what prediction rebuilds from preprocess.json
    hash(lay)  # immutable all the way down


def test_a_party_without_preprocessing_has_numeric_columns_standardized_as_the_run_did():
    scaled = PreprocessState(inputs=["a", "b"], columns=["a", "b"], mean=[0.0, 1.0], scale=[1.0, 2.0])
    assert scaled.layout("p") == plain_layout("p", ["a", "b"], standardized=True)
    raw = PreprocessState(inputs=["a", "b"], columns=["a", "b"]).layout("p")
    assert [(c.kind, c.source, c.standardized) for c in raw.columns] == [
        ("numeric", "a", False),
        ("numeric", "b", False),
    ]
    assert raw.categorical == () and raw.numeric == (0, 1)


def test_feature_selection_is_described_and_a_split_block_is_left_unblocked():
    _, lay = fitted_layout(spec(**MIXED), frame())
    full = list(lay.columns)
    # a defense kept plan's columns and one numeric column, and added one of its own
    sel = select_columns("lab", full, ["plan_a", "plan_b", "age", "made_up"])
    assert [(c.index, c.kind, c.source) for c in sel.columns] == [
        (0, "category", "plan"),
        (1, "category", "plan"),
        (2, "numeric", "age"),
        (3, "derived", None),
    ]
    assert [(b.column, b.start, b.stop) for b in sel.categorical] == [("plan", 0, 2)]
    # region's columns split into two runs: no block for region, its columns still described
    split = select_columns("lab", full, ["region_north", "age", "region_south"])
    assert split.categorical == () and [c.category for c in split.columns] == ["north", None, "south"]
    assert categorical_blocks([]) == ()


def test_a_saved_transform_whose_columns_do_not_add_up_is_a_data_error():
    pre, _ = fitted_layout(spec(**MIXED), frame())
    doc = pre.fitted()
    doc["outputs"] = doc["outputs"][:-1]
    with pytest.raises(
        DataError, match=r"party 'lab': its saved preprocessing describes 9 columns but names 8"
    ):
        feature_layout("lab", doc["outputs"], from_saved(doc, "lab"), standardized=False)
    assert len(fitted_columns(from_saved(pre.fitted(), "lab"))) == 9


# -- partial standardize --------------------------------------------------------------


def test_a_standardize_list_z_scores_the_listed_columns_alone():
    f = frame().drop(columns=["region", "plan"])
    pre = fit_preprocessor(spec(standardize=["age"]), "lab", f.fillna(0.0))
    x = pre.transform(f.fillna(0.0))
    age, visits = pre.columns.index("age"), pre.columns.index("visits")
    assert abs(float(x[:, age].mean())) < 1e-5 and float(x[:, age].std()) == pytest.approx(1.0, abs=1e-5)
    assert np.array_equal(x[:, visits], f["visits"].to_numpy(np.float32))  # untouched
    assert pre.columns == ["age", "income", "visits"]  # the standardized group comes first
    fitted = pre.fitted()["numeric"]
    assert "mean" in fitted["age"] and "mean" not in fitted["visits"]
    # true and false keep today's order and scaling
    every = fit_preprocessor(spec(), "lab", f.fillna(0.0))
    none = fit_preprocessor(spec(standardize=False), "lab", f.fillna(0.0))
    assert every.columns == none.columns == ["age", "income", "visits"]
    assert all("mean" in v for v in every.fitted()["numeric"].values())
    assert not any("mean" in v for v in none.fitted()["numeric"].values())


def test_a_standardize_list_replays_identically_from_the_saved_parameters():
    f = frame()
    pre = fit_preprocessor(spec(**MIXED), "lab", f)
    assert np.array_equal(apply_fitted(from_saved(pre.fitted(), "lab"), "lab", f), pre.transform(f))


def test_the_schema_refuses_a_categorical_or_repeated_standardize_column():
    with pytest.raises(ValidationError, match=r"standardize lists categorical columns \['region'\]"):
        spec(categorical={"columns": ["region"]}, standardize=["age", "region"])
    with pytest.raises(ValidationError, match=r"standardize lists columns \['age'\] more than once"):
        spec(standardize=["age", "age"])
    with pytest.raises(ValidationError):
        spec(standardize="age")  # strict: a list or a bool
    assert spec().standardize is True and spec().standardized(["a", "b"]) == ["a", "b"]
    assert spec(standardize=["b"]).standardized(["a", "b"]) == ["b"]


def test_check_standardize_names_the_party_and_the_field():
    s = spec(categorical={"columns": ["region"]}, standardize=["age", "typo"])
    check_standardize(spec(standardize=True), "lab", ["x"])
    with pytest.raises(ConfigError) as err:
        check_standardize(s, "lab", ["age", "region"], path="parties.passive[0]")
    assert err.value.path == "parties.passive[0].preprocess.standardize"
    assert "party 'lab': preprocess.standardize names ['typo']" in str(err.value)
    assert "region" not in str(err.value)  # it names the protocol's list, never the party's other columns


def test_a_standardize_list_is_checked_at_load_when_the_protocol_fixes_the_columns():
    doc = load_yaml("plain.yaml")
    doc["parties"]["passive"][0]["preprocess"] = {"standardize": ["px_0_0", "px_0_4"]}
    with pytest.raises(ConfigError) as err:
        load_protocol_dict(doc)
    assert err.value.path == "parties.passive[0].preprocess.standardize"
    assert "party 'left'" in str(err.value) and "['px_0_4']" in str(err.value)
    doc["parties"]["passive"][0]["preprocess"] = {"standardize": ["px_0_0", "px_1_3"]}
    load_protocol_dict(doc)
    # a CSV party that lists its feature columns: checked at load too; its categorical columns are not numeric
    csv = {
        "name": "csvcheck",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {"name": "bank", "source": {"path": "bank.csv", "label_column": "label"}},
            "passive": [
                {
                    "name": "shop",
                    "source": {"path": "shop.csv", "feature_columns": ["spend", "tier"]},
                    "preprocess": {"categorical": {"columns": ["tier"]}, "standardize": ["spend", "visits"]},
                    "model": {"out": 8},
                }
            ],
        },
    }
    with pytest.raises(ConfigError) as err:
        load_protocol_dict(csv)
    assert err.value.path == "parties.passive[0].preprocess.standardize" and "['visits']" in str(err.value)


def test_a_standardize_list_is_checked_when_the_party_reads_its_file(tmp_path: Path):
    path = tmp_path / "p.csv"
    f = frame()
    f.insert(0, "id", [f"r{i}" for i in range(len(f))])
    f.to_csv(path, index=False)
    pre = spec(categorical={"columns": ["region", "plan"]}, impute={}, standardize=["age", "nope"])
    with pytest.raises(ConfigError, match=r"party 'shop': preprocess.standardize names \['nope'\]"):
        load_party_data(CsvSource(path=str(path)), "shop", is_active=False, preprocess=pre)
    ok = spec(categorical={"columns": ["region", "plan"]}, impute={}, standardize=["age"])
    data = load_party_data(CsvSource(path=str(path)), "shop", is_active=False, preprocess=ok)
    assert data.frame is not None


# -- the factory call -----------------------------------------------------------------

FACTORIES = """
from torch import nn

CALLS = []

def plain(in_features, out, *, hidden=4):
    CALLS.append(("plain", in_features, out, {"hidden": hidden}))
    return nn.Linear(in_features, out)

def catch_all(in_features, out, **params):
    CALLS.append(("catch_all", in_features, out, dict(params)))
    return nn.Linear(in_features, out)

def with_layout(in_features, out, *, layout, hidden=4):
    CALLS.append(("with_layout", in_features, out, layout))
    return nn.Linear(in_features, out)

def optional_layout(in_features, out, layout=None):
    CALLS.append(("optional_layout", in_features, out, layout))
    return nn.Linear(in_features, out)
"""


@pytest.fixture
def factories(tmp_path: Path):
    name = f"svfl_layout_factories_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    finders = list(sys.meta_path)
    policy = policy_of([str(tmp_path / f"{name}.py")], str(tmp_path))
    yield name, policy
    sys.modules.pop(name, None)
    sys.meta_path[:] = finders


def _build(name: str, policy: Any, fn: str, given: FeatureLayout | None, /, **params: Any) -> Any:
    model = ModelSpec(factory=f"{name}:{fn}", params=params, out=3)
    build_bottom(model, 2, seed=0, party="p1", code=policy, path="parties.passive[0].model", layout=given)
    return sys.modules[name].CALLS[-1]


LAYOUT = plain_layout("p1", ["a", "b"], standardized=True)


def test_a_factory_that_declares_layout_receives_the_partys_layout(factories):
    name, policy = factories
    assert _build(name, policy, "with_layout", LAYOUT, hidden=5) == ("with_layout", 2, 3, LAYOUT)
    assert _build(name, policy, "optional_layout", LAYOUT) == ("optional_layout", 2, 3, LAYOUT)
    # without a layout to give (a caller that has none) the optional one keeps its default
    assert _build(name, policy, "optional_layout", None) == ("optional_layout", 2, 3, None)


def test_a_factory_without_layout_is_called_exactly_as_before(factories):
    name, policy = factories
    assert _build(name, policy, "plain", LAYOUT, hidden=6) == ("plain", 2, 3, {"hidden": 6})
    # a **params catch-all does not ask for the layout: it gets the params alone
    assert _build(name, policy, "catch_all", LAYOUT, k=1) == ("catch_all", 2, 3, {"k": 1})
    mod = sys.modules[name]
    assert not accepts_layout(mod.plain) and not accepts_layout(mod.catch_all) and not accepts_layout(len)
    assert accepts_layout(mod.with_layout) and accepts_layout(mod.optional_layout)


def test_params_may_not_set_the_layout_of_a_factory_that_takes_it(factories):
    name, policy = factories
    with pytest.raises(UserCodeError, match="params must not set 'layout'") as err:
        _build(name, policy, "with_layout", LAYOUT, **{"layout": "mine"})
    assert err.value.path == "parties.passive[0].model.params.layout"
    what = dict(what="bottom", path="parties.passive[0].model.factory")
    with pytest.raises(UserCodeError, match="params must not set 'layout'") as err:
        check_factory(policy, f"{name}:with_layout", {"layout": 1}, layout=True, **what)
    assert err.value.path == "parties.passive[0].model.params.layout"


def test_the_load_time_signature_check_knows_a_bottom_factory_gets_its_layout(factories):
    name, policy = factories
    what = dict(what="bottom", path="parties.passive[0].model.factory")
    check_factory(policy, f"{name}:with_layout", {"hidden": 2}, layout=True, **what)
    check_factory(policy, f"{name}:catch_all", {"layout": 1}, layout=True, **what)  # its own option
    with pytest.raises(UserCodeError, match="missing a required argument: 'layout'"):
        check_factory(policy, f"{name}:with_layout", {}, layout=False, **what)  # a top model gets none


def test_an_attack_rebuilds_a_partys_bottom_model_with_the_layout_in_its_own_view():
    pre, lay = fitted_layout(spec(**MIXED), frame())
    state = PreprocessState(inputs=list(pre.inputs), columns=list(pre.columns), fitted=pre.fitted())
    assert own_layout(OwnView({"preprocess": state.model_dump()}), "lab") == lay
    assert own_layout(OwnView({}), "lab") is None


def test_input_columns_are_immutable():
    c = InputColumn(0, "a", "numeric", "a")
    with pytest.raises(AttributeError):
        setattr(c, "name", "b")  # noqa: B010
