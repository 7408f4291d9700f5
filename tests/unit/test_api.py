"""securevfl.api without running anything: protocols from files, mappings and
loaded protocols with overrides, refusals as securevfl's errors, and a docstring
on every public name."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from securevfl import api
from securevfl.app.loader import override_expr, parse_override
from securevfl.config import Protocol
from securevfl.errors import ConfigError
from securevfl.privacy.accountant import GaussianRelease, Mechanism, account
from tests.support.protocols import PROTOCOLS, ROOT, load_yaml, small_digits


def test_every_public_name_has_a_docstring():
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), name
    assert {"load_protocol", "run", "compare", "predict", "party"} <= set(api.__all__)


def test_a_file_with_overrides_as_a_mapping_or_as_set_expressions():
    by_map = api.load_protocol(PROTOCOLS / "ckks.yaml", overrides={"training.max_steps": 20})
    by_set = api.load_protocol(str(PROTOCOLS / "ckks.yaml"), overrides=["training.max_steps=20"])
    assert isinstance(by_map, Protocol)
    assert by_map.training.max_steps == by_set.training.max_steps == 20
    assert by_map.digest() == by_set.digest()
    assert api.load_protocol(PROTOCOLS / "ckks.yaml").digest() != by_map.digest()


def test_a_mapping_and_a_loaded_protocol_load_as_the_file_does():
    from_file = api.load_protocol(PROTOCOLS / "plain.yaml")
    from_doc = api.load_protocol(load_yaml("plain.yaml"))
    again = api.load_protocol(from_file)
    assert from_doc.digest() == from_file.digest() == again.digest()
    changed = api.load_protocol(
        from_file, overrides={"parties.passive[1].model.out": 32, "interactive.out": 32}
    )
    assert changed.parties.passive[1].model.out == 32
    assert from_file.parties.passive[1].model.out == 64  # the protocol given is left as it was


def test_override_values_keep_their_python_type():
    """A float written with an exponent stays a float (JSON's 1e-05 would be a string
    to YAML 1.1), a string that looks like YAML stays a string."""
    defense = {"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 3.0, "delta": 1e-5}}
    proto = api.load_protocol(small_digits(), overrides={"parties.passive[0].defenses": [defense]})
    assert proto.parties.passive[0].defenses[0].params["delta"] == 1e-5
    for value in (1e-5, 2.5e-300, "yes", "a: b", "x\ny", [1, 2.0e-7], {"a": None}, True, 10**18):
        expr = override_expr("k.x", value)
        assert parse_override(expr) == (["k", "x"], value), expr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"training.max_stepz": 3}, "training.max_stepz"),
        ({"training.epochs": "three"}, "training.epochs"),
        ({"training.epochs": Path("3")}, "not plain data"),
        ("training.epochs=3", "not one string"),
        (["training.epochs"], "key.path=value"),
    ],
)
def test_bad_overrides_raise_config_errors_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        api.load_protocol(PROTOCOLS / "plain.yaml", overrides=overrides)


def test_what_is_not_a_protocol_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="protocol file not found"):
        api.load_protocol(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not int"):
        api.load_protocol(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not list"):
        api.load_protocol(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_compare_refuses_before_anything_runs(tmp_path: Path):
    doc = small_digits()
    with pytest.raises(ConfigError, match="seeds repeat"):
        api.compare([PROTOCOLS / "plain.yaml"], seeds=[0, 0], out=tmp_path / "a")
    with pytest.raises(ConfigError, match="both named"):
        api.compare([doc, doc], out=tmp_path / "b")
    with pytest.raises(ConfigError, match="must be a list"):
        api.compare(doc, grid={"training.lr": 0.1}, out=tmp_path / "c")
    with pytest.raises(ConfigError, match=r"training\.seed"):
        api.compare(doc, grid={"training.seed": [1, 2]}, out=tmp_path / "d")
    assert not list(tmp_path.rglob("seed*"))  # no run started


def test_a_protocol_given_as_data_is_kept_in_the_comparison_folder(tmp_path: Path):
    """A mapping to compare is written to OUT/protocols/<name>.yaml, its CSV paths made
    absolute, and planned from there (a repeated seed stops it before any run)."""
    doc = load_yaml("plain.yaml")
    csv_doc = yaml.safe_load((ROOT / "examples" / "csv_walkthrough" / "protocol.yaml").read_text())
    assert csv_doc["parties"]["active"]["source"]["path"] == "data/registry.csv"
    with pytest.raises(ConfigError, match="seeds repeat"):
        api.compare([doc, csv_doc], seeds=[1, 1], out=tmp_path)
    kept = api.load_protocol(tmp_path / "protocols" / "plain.yaml")
    assert kept.digest() == api.load_protocol(doc).digest()
    written = api.load_protocol(tmp_path / "protocols" / "wine_csv.yaml")
    assert written.parties.active.source is not None
    assert written.parties.active.source.path == str(Path("data/registry.csv").resolve())
    assert not list(tmp_path.rglob("seed*"))


def test_a_comparison_row_gives_each_party_s_privacy_at_its_worst_seed() -> None:
    ranks = {"0": {"party": "active", "role": "active"}, "1": {"party": "left", "role": "passive"}}

    def spent(noise: float) -> api.RunResult:
        mech = Mechanism("embedding_dp", (GaussianRelease(count=4, noise_multiplier=noise),))
        privacy = {
            "accountant": "pld",
            "delta": 1e-5,
            "noise_seed_pinned": False,
            "parties": account({"left": [mech]}, 1e-5),
            "budget": None,
            "planned_steps": 4,
            "steps_run": 4,
            "stopped_by_budget": False,
        }
        return api.RunResult.model_construct(ranks=ranks, privacy=privacy, folder=Path("."))

    runs = (spent(1.0), spent(0.5), spent(2.0))
    row = api.ComparisonRow("p", {}, "mpc", "embedding_dp", "digits", (0, 1, 2), {}, runs)
    worst = row.privacy_of("left")
    assert worst is not None and worst == runs[1].privacy_of("left")
    assert worst.epsilon > max(r.privacy_of("left").epsilon for r in (runs[0], runs[2]))  # type: ignore[union-attr]
    assert row.privacy_of("active") is None and set(row.privacy) == {"left"}
    with pytest.raises(ConfigError, match="no party 'shop'"):
        row.privacy_of("shop")
    assert row.test_accuracy is None and row.mean("test_accuracy") is None
