"""Grid expansion for `securevfl compare --grid`: keys as `--set` writes them
(list indices included), value splitting, kind checks, unknown keys and missing
list elements refused with their path, the product of the axes."""

from __future__ import annotations

import pytest

from securevfl.app.comparison import Source, plan
from securevfl.app.grid import (
    apply_point,
    check_axis,
    missing_element,
    parse_axis,
    point_label,
    points,
    split_values,
)
from securevfl.errors import ConfigError
from tests.support.protocols import PROTOCOLS, small_digits, write_yaml

EPS = "parties.active.defenses[0].params.epsilon"


def test_list_indices_and_values_parse_like_set() -> None:
    axis = parse_axis(f"{EPS}=0.5,1,2,4")
    assert axis.path == ("parties", "active", "defenses", 0, "params", "epsilon")
    assert axis.values == (0.5, 1, 2, 4)
    assert axis.short == "epsilon"


def test_values_may_be_lists_and_quoted_strings() -> None:
    assert split_values("[16,8],[32], 'a,b'") == ["[16,8]", "[32]", "'a,b'"]
    axis = parse_axis("parties.passive[0].model.hidden=[16,8],[32]")
    assert axis.values == ([16, 8], [32])


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("training.lr=0.1,abc", "mix kinds"),
        ("training.lr=0.1,0.1", "repeat"),
        ("training.lr=0.1,,0.2", "empty value"),
        ("training.seed=0,1", "--seeds"),
        ("training.lr", "key.path=value"),
    ],
)
def test_bad_axes_are_refused_with_their_key(expr: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        parse_axis(expr)
    assert info.value.path in (expr.split("=")[0], "--grid")


def test_values_of_another_kind_than_the_file_holds_are_refused() -> None:
    doc = small_digits()
    with pytest.raises(ConfigError, match="is a string, the protocol holds a number") as info:
        check_axis(doc, parse_axis("training.epochs=two,three"))
    assert info.value.path == "training.epochs"
    check_axis(doc, parse_axis("training.epochs=1,2"))  # numbers over a number: fine


def test_points_are_the_product_in_order_and_labels_name_each_axis() -> None:
    a, b = parse_axis("training.lr=0.1,0.01"), parse_axis("training.epochs=1,2,3")
    pts = points([a, b])
    assert len(pts) == 6
    assert point_label(pts[0]) == "lr=0.1,epochs=1" and point_label(pts[-1]) == "lr=0.01,epochs=3"
    doc = apply_point(small_digits(), pts[-1])
    assert doc["training"]["lr"] == 0.01 and doc["training"]["epochs"] == 3
    with pytest.raises(ConfigError, match="given twice"):
        points([a, a])


def _label_dp_file(tmp_path):
    doc = small_digits()
    doc["parties"]["active"]["defenses"] = [{"name": "label_dp", "params": {"epsilon": 1.0}}]
    return write_yaml(tmp_path / "ldp.yaml", doc)


def test_plan_expands_grid_points_times_seeds_into_their_own_folders(tmp_path) -> None:
    axes = (parse_axis(f"{EPS}=0.5,2"), parse_axis("training.lr=0.01,0.003"))
    src = Source(_label_dp_file(tmp_path), (), axes)
    p = plan("t", [src], [0, 1], tmp_path / "out")
    assert len(p.runs) == 8
    assert len({r.folder for r in p.runs}) == 8 and len({r.digest for r in p.runs}) == 8
    first = p.runs[0]
    assert first.label == "plain[epsilon=0.5,lr=0.01]" and first.seed == 0
    assert first.proto.training.seed == 0 and p.runs[1].proto.training.seed == 1
    assert first.proto.parties.active.defenses[0].params["epsilon"] == 0.5
    assert first.folder == tmp_path / "out" / "plain" / "epsilon=0.5,lr=0.01" / "seed0"
    assert p.axes == {"plain": [EPS, "training.lr"]}


def test_plan_without_seeds_runs_each_protocol_at_its_own_seed(tmp_path) -> None:
    p = plan("t", [Source(PROTOCOLS / "plain.yaml")], None, tmp_path)
    assert [(r.label, r.seed, r.folder.name) for r in p.runs] == [("plain", 0, "seed0")]


@pytest.mark.parametrize(
    ("expr", "path", "needle"),
    [
        ("training.epochz=1,2", "training.epochz", "unknown key"),
        (f"{EPS}=0.5,1", "parties.active.defenses[0]", "no such list element"),
        ("training.epochs=1.5,2", "training.epochs", "integer"),
        ("exchange.backend=plain,quantum", "exchange.backend", "quantum"),
    ],
)
def test_unknown_keys_and_refused_values_name_their_path(tmp_path, expr, path, needle) -> None:
    src = Source(PROTOCOLS / "plain.yaml", (), (parse_axis(expr),))
    with pytest.raises(ConfigError) as info:
        plan("t", [src], [0], tmp_path)
    msg = str(info.value)
    assert path in msg and needle.lower() in msg.lower(), msg


EVERY_EPS = "parties.passive[*].defenses[0].params.epsilon"


def _embedding_dp_doc() -> dict:
    doc = small_digits()
    for p in doc["parties"]["passive"]:
        p["defenses"] = [
            {
                "name": "embedding_dp",
                "params": {"variant": "vanilla", "epsilon": 3.0, "calibration": "analytic"},
            }
        ]
    return doc


def test_a_star_index_sets_every_element_of_a_list() -> None:
    """``[*]`` varies one field of every passive party at once: one grid axis, not
    the product of one axis per party."""
    axis = parse_axis(f"{EVERY_EPS}=1,10")
    assert axis.short == "epsilon" and axis.path[2] == "[*]"
    pts = points([axis])
    assert [point_label(p) for p in pts] == ["epsilon=1", "epsilon=10"]
    doc = apply_point(_embedding_dp_doc(), pts[1])
    assert [p["defenses"][0]["params"]["epsilon"] for p in doc["parties"]["passive"]] == [10, 10]
    # each element gets its own copy of a mutable value
    doc = apply_point(_embedding_dp_doc(), points([parse_axis("parties.passive[*].defenses=[],[[]]")])[0])
    first, second = (p["defenses"] for p in doc["parties"]["passive"])
    assert first == second == [] and first is not second


def test_a_star_index_is_checked_at_every_element(tmp_path) -> None:
    doc = _embedding_dp_doc()
    doc["parties"]["passive"][1]["defenses"][0]["params"]["epsilon"] = "three"
    with pytest.raises(ConfigError, match="the protocol holds a string"):
        check_axis(doc, parse_axis(f"{EVERY_EPS}=1,10"))
    src = Source(write_yaml(tmp_path / "p.yaml", small_digits()), (), (parse_axis(f"{EVERY_EPS}=1,10"),))
    with pytest.raises(ConfigError, match="no such list element") as info:
        plan("t", [src], [0], tmp_path / "out")
    assert "parties.passive[0].defenses[0]" in str(info.value)
    src = Source(src.path, (), (parse_axis("parties.active.defenses[*].params.epsilon=1,2"),))
    with pytest.raises(ConfigError, match=r"\[\*\] needs a non-empty list") as info:
        plan("t", [src], [0], tmp_path / "out")


def test_a_star_grid_plans_one_run_per_value(tmp_path) -> None:
    src = Source(
        write_yaml(tmp_path / "dp.yaml", _embedding_dp_doc()), (), (parse_axis(f"{EVERY_EPS}=1,10"),)
    )
    p = plan("t", [src], [0], tmp_path / "out")
    assert [r.label for r in p.runs] == ["plain[epsilon=1]", "plain[epsilon=10]"]
    assert [[d.defenses[0].params["epsilon"] for d in r.proto.parties.passive] for r in p.runs] == [
        [1, 1],
        [10, 10],
    ]


def test_missing_element_names_the_list_element_a_key_goes_through() -> None:
    doc = small_digits()
    assert missing_element(doc, parse_axis(f"{EPS}=1").path) == "parties.active.defenses[0]"
    assert missing_element(doc, parse_axis(f"{EVERY_EPS}=1").path) == "parties.passive[*].defenses[0]"
    assert missing_element(doc, parse_axis("training.momentum=0.9").path) is None  # a key is created
    assert missing_element(_embedding_dp_doc(), parse_axis(f"{EVERY_EPS}=1").path) is None


def test_a_grid_leaves_a_protocol_without_its_key_unexpanded_as_the_reference(tmp_path) -> None:
    """``compare plain.yaml defended.yaml --grid DEFENSE_KEY=...``: the sweep
    expands the defended protocol and the undefended one runs once beside it, as
    the reference row, and the plan says so; an axis both have expands both."""
    undefended = small_digits()
    undefended["name"] = "base"
    base = write_yaml(tmp_path / "base.yaml", undefended)
    ldp = _label_dp_file(tmp_path)
    eps = parse_axis(f"{EPS}=0.5,2")
    said: list[str] = []
    p = plan("t", [Source(base, (), (eps,)), Source(ldp, (), (eps,))], [0], tmp_path / "out", say=said.append)
    assert [r.label for r in p.runs] == ["base", "plain[epsilon=0.5]", "plain[epsilon=2]"]
    assert p.runs[0].folder == tmp_path / "out" / "base" / "seed0" and p.runs[0].point == {}
    assert p.axes == {"base": [], "plain": [EPS]}
    assert said[-1] == (
        f"base: the grid's '{EPS}' (it has no parties.active.defenses[0]) does not apply to it; it runs "
        "once, as the undefended reference row the defended rows are measured against"
    )
    lr = parse_axis("training.lr=0.01,0.003")
    said.clear()
    p = plan(
        "t", [Source(base, (), (eps, lr)), Source(ldp, (), (eps, lr))], [0], tmp_path / "out", say=said.append
    )
    assert [r.label for r in p.runs][:2] == ["base[lr=0.01]", "base[lr=0.003]"] and len(p.runs) == 6
    assert any(s.endswith("it is expanded by the other axes only") for s in said)


def test_grid_values_that_differ_only_in_unsafe_characters_get_their_own_folders(tmp_path) -> None:
    """``a b``, ``a_b`` and ``a/b`` are three points: three folders (one folder would
    leave two results lost and re-run two points at every call), each inside its
    protocol's folder."""
    src = Source(PROTOCOLS / "plain.yaml", (), (parse_axis("description=a b,a_b,a/b,..,.x"),))
    p = plan("t", [src], [0], tmp_path / "out")
    folders = [r.folder for r in p.runs]
    assert len(set(folders)) == 5, folders
    assert all(f.parent.parent == tmp_path / "out" / "plain" for f in folders), folders
    assert folders[1] == tmp_path / "out" / "plain" / "description=a_b" / "seed0"  # a plain name: as it is
    for f in folders:
        f.mkdir(parents=True)


def test_a_grid_value_past_the_file_name_limit_gets_a_short_folder(tmp_path) -> None:
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    src = Source(PROTOCOLS / "plain.yaml", (), (parse_axis(f"description={long_a},{long_b}"),))
    p = plan("t", [src], [0], tmp_path / "out")
    names = [r.folder.parent.name for r in p.runs]
    assert len(set(names)) == 2 and all(len(n.encode()) <= 255 for n in names), names
    for r in p.runs:
        r.folder.mkdir(parents=True)  # no "File name too long"
