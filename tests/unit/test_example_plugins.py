"""The components of examples/plugins, each on its own: the two model factories
give the declared width, the top-k defense releases k coordinates per row and
passes gradient through them alone, and the ``ink_probe`` attack recovers a
property planted in z and nothing from z that does not carry it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from securevfl.attacks import ATTACKS
from securevfl.attacks.base import View
from securevfl.config import PreprocessSpec
from securevfl.data.fitted import from_saved
from securevfl.data.layout import feature_layout
from securevfl.data.preprocess import fit_preprocessor
from securevfl.defenses import DEFENSES
from securevfl.errors import ConfigError
from securevfl.records import OwnView
from securevfl.seeding import seeded

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_plugins_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def example() -> Iterator[Any]:
    """Import an example module by path; what it registered is removed afterwards."""
    defenses, attacks = set(DEFENSES.names()), set(ATTACKS.names())
    yield _load
    for n in set(DEFENSES.names()) - defenses:
        DEFENSES.remove(n)
    for n in set(ATTACKS.names()) - attacks:
        ATTACKS.remove(n)
    sys.modules.pop("example_plugins", None)


def test_residual_cnn_maps_an_image_half_to_out_columns(example):
    m = example("residual_cnn").bottom(32, 16, input_shape=[1, 8, 4], channels=4, blocks=2)
    x = torch.rand(5, 32)
    out = m(x)
    assert out.shape == (5, 16) and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    with pytest.raises(ConfigError, match=r"holds 64 values, the party has 32"):
        example("residual_cnn").bottom(32, 16, input_shape=[1, 8, 8])


def test_embedding_bag_codes_columns_and_maps_them_to_out_columns(example):
    mod = example("embedding_bag")
    x = torch.tensor([[0.0, 1.0, 0.5], [1 / 16, 2.0, -1.0]])
    # column j's code c is token j * 17 + c; codes are clamped to 0..16
    assert mod.codes(x, 17, 16).tolist() == [[0, 33, 42], [1, 33, 34]]
    m = mod.bottom(3, 8, levels=17, scale=16, dim=4)
    out = m(x)
    assert out.shape == (2, 8) and out.dtype == torch.float32
    # a row's output depends on its codes alone: equal codes, equal output
    same = m(torch.tensor([[0.01, 0.99, 0.51]]))
    assert torch.allclose(same, out[:1])


def test_topk_embedding_releases_the_k_largest_coordinates_per_row(example):
    mod = example("topk_embedding")
    assert "topk_embedding" in DEFENSES
    d = mod.TopKEmbedding(mod.TopKOptions(k=2), ctx=None)
    h = torch.tensor([[0.1, -3.0, 2.0, 0.5], [4.0, 0.0, -0.25, 0.5]], requires_grad=True)
    out = d.embed(h, train=True)
    assert out.tolist() == [[0.0, -3.0, 2.0, 0.0], [4.0, 0.0, 0.0, 0.5]]
    out.sum().backward()
    assert h.grad is not None and h.grad.tolist() == [[0, 1, 1, 0], [1, 0, 0, 1]]
    assert torch.equal(d.embed_local(h.detach()), out.detach())
    assert mod.topk_rows(h.detach(), 9).equal(h.detach())  # k above the width keeps everything
    with pytest.raises(ValueError):
        mod.TopKOptions(k=0)


def _probe_inputs(z_of_ink: Any, n: int = 400, seed: int = 1) -> tuple[Any, OwnView]:
    """A victim with 6 features on ``n`` records (3/4 training rows) and A's z for
    each record, one training forward and one evaluation forward."""
    g = np.random.default_rng(seed)
    x = torch.tensor(g.uniform(size=(n, 6)), dtype=torch.float32)
    ink = x.double().mean(1)
    train_idx, test_idx = np.arange(0, 300), np.arange(300, n)
    z = z_of_ink(ink, g).float()
    victim = OwnView({"x_raw": x, "train_idx": train_idx, "test_idx": test_idx})
    world = SimpleNamespace(passive=lambda name: SimpleNamespace(own=victim))
    active = OwnView(
        {
            "train_idx": train_idx,
            "test_idx": test_idx,
            "forwards": [
                {"phase": "train", "round": 0, "rows": list(range(300))},
                {"phase": "eval", "round": 1, "rows": list(range(100))},
            ],
            "z": [z[train_idx], z[test_idx]],
        }
    )
    return world, active


@pytest.mark.parametrize(
    ("z_of_ink", "low", "high"),
    [
        # z carries the victim's ink linearly among noise columns: the probe recovers it
        (lambda ink, g: torch.stack([3 * ink, *torch.tensor(g.normal(size=(4, len(ink))))], 1), 0.99, 1.0),
        # z carries no trace of it: R^2 at or below the chance level 0
        (lambda ink, g: torch.tensor(g.normal(size=(len(ink), 5))), -1.0, 0.05),
    ],
)
def test_ink_probe_recovers_a_planted_property_and_only_that(example, z_of_ink, low, high):
    mod = example("ink_probe")
    assert "ink_probe" in ATTACKS
    attack = mod.InkProbe(mod.InkProbeOptions(target="left", aux_fraction=0.3, alpha=1e-3))
    world, active = _probe_inputs(z_of_ink)
    prior = attack.knowledge(world)
    assert len(prior["aux_rows"]) == 90 and prior["aux_rows"].max() < 300
    guess = attack.run(View(rank=0, party="active", received={}, own=active, prior=prior))
    score = attack.score(guess, world)
    assert score["n_test"] == 100 and score["chance"] == 0.0
    assert low <= score["ap"] <= high


def test_ridge_and_r2_on_exact_data(example):
    mod = example("ink_probe")
    x = np.random.default_rng(0).normal(size=(50, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 4.0
    w, b = mod.ridge_fit(x, y, 1e-9)
    assert np.allclose(w, [1.0, -2.0, 0.5]) and b == pytest.approx(4.0)
    assert mod.r2(y, y) == 1.0 and mod.r2(np.full_like(y, y.mean()), y) == pytest.approx(0.0)


def test_per_category_embeds_each_categorical_block_of_a_real_layout(example):
    """The recipe of docs/extending.md: built from the layout of a real fitted
    preprocessing, one embedding table per categorical column (its cardinality
    plus a row for an empty block), indexed by the block's argmax."""
    train = pd.DataFrame(
        {
            "age": np.linspace(20, 60, 12),
            "region": ["north", "south", "east"] * 4,
            "plan": ["a"] * 10 + ["b"] * 2,
        }
    )
    spec = PreprocessSpec.model_validate({"categorical": {"columns": ["region", "plan"], "min_frequency": 3}})
    pre = fit_preprocessor(spec, "lab", train)
    layout = feature_layout("lab", pre.columns, from_saved(pre.fitted(), "lab"), standardized=False)
    with seeded(0, "per_category"):  # a fixed model: the comparisons below cannot meet dead units by chance
        m = example("embedding_bag").per_category(layout.width, 8, layout=layout, dim=3, hidden=32)
    # region: 3 categories, no "other"; plan: "a" and the "other" bucket holding the rare "b"
    assert [(t.num_embeddings, t.embedding_dim) for t in m.tables] == [(4, 3), (3, 3)]
    x = torch.as_tensor(pre.transform(train))
    out = m(x)
    assert out.shape == (12, 8) and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    # a row's output depends on its numeric columns and on each block's category alone
    region = layout.block("region")
    assert region.categories == ("east", "north", "south") and not region.has_other
    rows = x[[0, 3]]  # both "north", plan "a", different ages
    same_age = rows.clone()
    same_age[1, 0] = rows[0, 0]
    y = m(same_age)
    assert torch.equal(y[0], y[1])
    other_region = same_age.clone()
    other_region[1, region.columns] = torch.tensor([0.0, 0.0, 1.0])  # "south"
    assert not torch.equal(m(other_region)[1], y[0])
    # an empty block (an unseen category without "other") takes the extra row, not category 0
    empty = same_age.clone()
    empty[1, region.columns] = 0.0
    first = same_age.clone()
    first[1, region.columns] = torch.tensor([1.0, 0.0, 0.0])  # "east", index 0
    assert not torch.equal(m(empty)[1], m(first)[1])
