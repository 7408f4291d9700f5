"""Threat-model suites (docs/design.md §6): each attack is strong on ``plain``, still
measurable under crypto-only, and reduced by the defense aimed at it.

Every run goes through the real launcher (one OS process per rank); the attacks
run afterwards on the ranks' saved views (securevfl.app.harness). Seeds are
fixed, so a ``plain`` run is deterministic on one machine. An ``mpc`` run is not:
CrypTen draws its sharing randomness from OS entropy (as it must), and fixed-point
rounding then moves training like another seed would (the undefended mpc attack
scored nmse 0.482, 0.504 and 0.595 in three runs). The margins come from the
values measured while writing the suite (2-core CPU, heavily shared), noted at
each assertion, from re-running the attacks with other attack seeds on the same
views (docs/attacks.md has the commands) and, under mpc, from repeated runs:
there the defense settings are ones whose effect exceeds that run-to-run spread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.protocols import load_yaml, small_digits
from tests.support.runs import run_doc

# A test's time includes the module fixtures it is the first to need (an mpc run
# is 1.5-5 minutes on a shared 2-core box); the membership pairs run twice.
pytestmark = pytest.mark.timeout(1200)

FR = {"name": "feature_reconstruction", "params": {"image_shape": [8, 4]}}
MPC = {"backend": "mpc", "params": {"provider": "TTP"}}
ONLINE = {"name": "online_reconstruction"}
LABEL_ATTACKS = [
    {"name": "label_norm"},
    {"name": "label_direction", "params": {"n_known": 10}},
    {"name": "model_completion", "params": {"n_known": 20}},
]


def _digits(**kw: Any) -> dict[str, Any]:
    doc = small_digits(epochs=5)
    doc["attacks"] = [FR, ONLINE, {"name": "membership_inference"}]
    doc.update(kw)
    return doc


def _breast_cancer(
    defenses: list[dict[str, Any]] | None = None, exchange: dict[str, Any] | None = None
) -> dict[str, Any]:
    doc = load_yaml("breast_cancer.yaml")
    if exchange:
        doc["exchange"] = exchange
    doc["privacy"] = {"noise_seed": 0}  # fixed seeds, defenses' noise and initial weights included
    for p in doc["parties"]["passive"]:
        p["model"]["init"] = "seeded"
    doc["training"]["epochs"] = 5
    doc["parties"]["active"]["defenses"] = defenses or []
    doc["attacks"] = LABEL_ATTACKS
    return doc


@pytest.fixture(scope="module")
def plain_digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("plain_digits")
    return {**run_doc(_digits(), out), "out_dir": str(out)}


@pytest.fixture(scope="module")
def plain_bc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_doc(_breast_cancer(), tmp_path_factory.mktemp("plain_bc"))


@pytest.fixture(scope="module")
def mpc_digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc = _digits(exchange=MPC)
    doc["attacks"] = [FR]
    return run_doc(doc, tmp_path_factory.mktemp("mpc_digits"))


@pytest.fixture(scope="module")
def mpc_bc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_doc(_breast_cancer(exchange=MPC), tmp_path_factory.mktemp("mpc_bc"))


def _baseline(request: pytest.FixtureRequest, backend: str, task: str) -> dict[str, Any]:
    """The undefended run of a task on a backend (a module fixture)."""
    return request.getfixturevalue(f"{backend}_{task}")


@pytest.mark.slow
def test_feature_reconstruction_from_plain_embeddings(plain_digits: dict[str, Any]) -> None:
    """A decodes the left half from h'_left with 20% of the training rows as aux.
    Measured (5 epochs, seed 0): nmse 0.273, ssim 0.84; attack seeds 0-4 give
    0.262-0.303, so the 0.5 bound leaves a ~0.2 margin."""
    fr = plain_digits["attacks"]["feature_reconstruction"]
    assert fr["adversary"] == "active" and fr["victim"] == "left"
    assert fr["used"]["input"].startswith("ledger 'embedding'")
    assert fr["used"]["aux_rows"] == round(0.2 * plain_digits["rows"]["train"])
    assert fr["nmse"] <= 0.5
    assert fr["ssim"] > 0.5
    import numpy as np

    grid = np.load(Path(plain_digits["out_dir"]) / fr["grid"])
    assert grid["original"].shape == grid["reconstruction"].shape == (16, 8, 4)


@pytest.mark.slow
def test_online_reconstruction_learns_during_training_and_noise_slows_it(
    plain_digits: dict[str, Any], tmp_path: Path
) -> None:
    """docs/methods/dravl.md §5 mode 1 over launcher runs: R_I, one step per batch A received,
    scored after every epoch. Measured (5 epochs, seed 0; attack seeds 0 / 1):
    plain nmse per epoch 1.18 0.97 0.71 0.52 0.45 (last 0.447 / 0.440); with
    gaussian_noise std 1 on both halves 1.23 1.11 0.99 0.91 0.80 (last 0.796 / 0.797)."""
    base = plain_digits["attacks"]["online_reconstruction"]
    assert base["used"]["train_steps_observed"] == plain_digits["train_steps"]
    assert len(base["nmse_per_pass"]) == 5
    assert base["nmse_last"] < 0.6
    assert base["nmse_last"] < base["nmse_per_pass"][0]
    doc = _digits()
    doc["attacks"] = [ONLINE]
    for p in doc["parties"]["passive"]:
        p["defenses"] = [{"name": "gaussian_noise", "params": {"std": 1.0}}]
    noisy = run_doc(doc, tmp_path)["attacks"]["online_reconstruction"]
    print(f"online nmse, last epoch: plain {base['nmse_last']:.3f}, noise {noisy['nmse_last']:.3f}")
    assert noisy["nmse_last"] >= base["nmse_last"] + 0.2


@pytest.mark.slow
def test_membership_inference_is_reported_near_chance(plain_digits: dict[str, Any]) -> None:
    """Small model, 5 epochs: the shadow attack is near chance (measured 0.550 /
    0.556 / 0.492 over attack seeds 0-2 on plain digits, 0.514 on breast_cancer);
    the test pins the record and a sane range, not a leak."""
    mi = plain_digits["attacks"]["membership_inference"]
    assert mi["n_eval"] >= 100
    assert 0.3 <= mi["accuracy"] <= 0.8


@pytest.mark.slow
def test_feature_reconstruction_under_mpc_is_weaker_but_measurable(
    plain_digits: dict[str, Any], mpc_digits: dict[str, Any]
) -> None:
    """Under mpc A only sees z (the sum over both halves through W): the same
    attack is measurably worse than on plain, and still beats the mean predictor.
    Measured (5 epochs, seed 0; attack seeds 0-2): plain nmse 0.273/0.262/0.293;
    mpc 0.482/0.484/0.487 in one run and 0.504/0.522/0.611 in another (CrypTen's
    randomness is not pinned): z still leaks about half of the left half's variance."""
    fr = mpc_digits["attacks"]["feature_reconstruction"]
    assert fr["used"]["input"].startswith("revealed z")
    plain = plain_digits["attacks"]["feature_reconstruction"]["nmse"]
    print(f"feature reconstruction nmse: plain {plain:.3f}, mpc {fr['nmse']:.3f}")
    assert fr["nmse"] > plain + 0.1
    assert fr["nmse"] < 0.75


@pytest.mark.slow
def test_label_inference_from_plain_gradients(plain_bc: dict[str, Any]) -> None:
    """p1 infers A's labels from dL/dh'_p1. Measured (5 epochs, seed 0): direction
    AUC 0.9998 with 10 known labels, model completion accuracy 0.908 / AUC 0.955
    with 20; the norm score is weak on this balanced-ish task (leak AUC 0.536).
    The norm record is checked through its raw AUC: ``auc`` is max(raw, 1 - raw),
    which lies in [0.5, 1] by construction, so only the raw value can show a
    missing or inconsistent score, or a norm leak far stronger than measured."""
    att = plain_bc["attacks"]
    assert att["label_direction"]["adversary"] == "p1"
    assert att["label_direction"]["auc"] >= 0.9
    assert att["model_completion"]["auc"] >= 0.9
    assert att["model_completion"]["accuracy"] >= 0.85
    norm = att["label_norm"]
    raw = norm["auc_raw"]  # None when the scored rows hold one class only
    assert raw is not None and 0.0 <= raw <= 1.0
    assert norm["auc"] == pytest.approx(0.5 + abs(raw - 0.5))  # the leak AUC is the raw one, sign-free
    assert abs(raw - 0.5) <= 0.25  # weak: measured 0.036 from chance


@pytest.mark.slow
def test_label_inference_from_mpc_gradients(mpc_bc: dict[str, Any]) -> None:
    """Secret sharing hides h'_i from A but p1 still receives its own dL/dh'_p1:
    the gradient attacks are as strong as on plain (measured: see LABEL_DP)."""
    att = mpc_bc["attacks"]
    assert att["label_direction"]["auc"] >= 0.9
    assert att["model_completion"]["auc"] >= 0.9


# Label DP at eps = 0.5 at A against direction scoring by p1, per backend:
# required AUC drop below the undefended run of the same backend. Measured
# direction AUC over attack seeds 0-2 (breast_cancer, 5 epochs):
#   plain 1.000 / 1.000 / 0.994; + label_dp 0.414 / 0.597 / 0.484 (re-run: 0.443)
#   mpc   0.994 / 0.998 / 0.990; + label_dp 0.581 / 0.489 / 0.474
LABEL_DP_DROP = {"plain": 0.25, "mpc": 0.25}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(LABEL_DP_DROP))
def test_label_dp_reduces_label_inference(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Randomized response at eps=0.5 (about 38% of labels flipped): the gradients
    carry the noisy labels, so direction scoring against the true labels falls to
    <= 0.65 AUC on every backend (measured: see docs/attacks.md)."""
    base = _baseline(request, backend, "bc")
    doc = _breast_cancer(
        [{"name": "label_dp", "params": {"epsilon": 0.5}}], MPC if backend == "mpc" else None
    )
    res = run_doc(doc, tmp_path)
    att = res["attacks"]
    print(backend, {k: v.get("auc") for k, v in att.items()})
    assert att["label_direction"]["auc"] <= 0.65
    assert att["label_direction"]["auc"] < base["attacks"]["label_direction"]["auc"] - LABEL_DP_DROP[backend]


# Defense pairs for feature reconstruction: (defenses on both passive parties,
# A's defenses, required nmse margin over the undefended run of the same backend,
# [code length]). Measured nmse over attack seeds
# 0-2 on the saved views (test accuracy of the run in brackets):
#   plain 0.273 / 0.262 / 0.293 [0.749] (seeds 3, 4: 0.303, 0.289)
#   hashvfl (16-bit codes) 0.461 / 0.471 / 0.540 [0.866]
#   embedding_dp vanilla eps=1 1.0 / 1.0 / 1.0 [0.078: the noise also destroys utility]
#   gaussian_noise std=1 0.765 / 0.732 / 0.827 [0.485]
#   dravl preset dcor_0.1 0.357 / 0.358 / 0.421 [0.351]
#   under mpc (A attacks z; consistency loss refused there, so hashing alone),
#   attack seed 0 over separate runs unless noted:
#   mpc 0.482, 0.504, 0.595, 0.560 [0.758-0.816]; attack seeds 0-2 of one run
#   0.504 / 0.522 / 0.611
#   mpc + embedding_dp vanilla eps=1 1.0 / 1.0 / 1.0 (attack seeds) [0.109]
#   mpc + gaussian_noise std 1 0.693 / 0.717 / 0.761 (attack seeds) [0.513]:
#   inside the spread; std 2 0.874 [0.284]
#   mpc + dravl dcor_0.1 0.601 / 0.652 / 0.807 (attack seeds) [0.501]: inside the
#   spread; alpha_d 1 1.0 [0.162]; all three weights at 0.1 0.942 [0.095]
#   mpc + hashvfl 16-bit codes 0.488 / 0.468 / 0.500 (attack seeds) [0.886] and
#   4-bit 0.615 / 0.637 / 0.645 [0.772]: inside the spread; 2-bit 0.688, 0.756
#   in two runs [0.596, 0.604]
# So under mpc the pairs use settings strong enough to clear the spread, at the
# utility cost in brackets; the last field is the bottoms' ``out`` (code length).
HASH = {"name": "hashvfl"}
FR_DEFENSES: dict[tuple[str, str], tuple[Any, ...]] = {
    ("plain", "hashvfl"): (
        [HASH],
        [{"name": "hashvfl_consistency", "params": {"codes": "random", "weight": 1.0}}],
        0.1,
    ),
    ("plain", "embedding_dp"): (
        [{"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 1.0}}],
        [],
        0.5,
    ),
    ("plain", "gaussian_noise"): ([{"name": "gaussian_noise", "params": {"std": 1.0}}], [], 0.3),
    ("plain", "dravl"): ([{"name": "dravl", "params": {"preset": "dcor_0.1"}}], [], 0.05),
    ("mpc", "hashvfl"): ([HASH], [], 0.05, 2),
    ("mpc", "embedding_dp"): (
        [{"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 1.0}}],
        [],
        0.3,
    ),
    ("mpc", "gaussian_noise"): ([{"name": "gaussian_noise", "params": {"std": 2.0}}], [], 0.15),
    ("mpc", "dravl"): ([{"name": "dravl", "params": {"alpha_d": 1.0}}], [], 0.3),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "defense"), sorted(FR_DEFENSES), ids=[f"{b}-{d}" for b, d in sorted(FR_DEFENSES)]
)
def test_embedding_defenses_reduce_feature_reconstruction(
    backend: str, defense: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    passive, active, margin, *out = FR_DEFENSES[backend, defense]
    base = _baseline(request, backend, "digits")
    doc = _digits(exchange=MPC) if backend == "mpc" else _digits()
    doc["attacks"] = [FR]
    for p in doc["parties"]["passive"]:
        p["defenses"] = passive
        if out:
            p["model"]["out"] = out[0]
    doc["parties"]["active"]["defenses"] = active
    res = run_doc(doc, tmp_path)
    fr = res["attacks"]["feature_reconstruction"]
    undefended = base["attacks"]["feature_reconstruction"]["nmse"]
    print(
        f"{backend} {defense}: nmse {fr['nmse']:.3f} ({backend} {undefended:.3f}), "
        f"test accuracy {res['test_accuracy']:.3f}"
    )
    assert fr["nmse"] >= undefended + margin


def _overfit(backend: str, defenses: list[dict[str, Any]]) -> dict[str, Any]:
    """An over-fitted model, the setting membership inference needs: 300
    training rows of a synthetic task with 20% random labels, wide MLPs, 60
    epochs (training loss ~1e-4, test accuracy ~0.73). The attack uses the
    loss-threshold model, which transfers from the shadows (the boosted model
    scored 0.51 / 0.63 / 0.60 over attack seeds on the same views)."""
    passive = [
        {"name": name, "columns": {"index": cols}, "model": {"kind": "mlp", "hidden": [128], "out": 32}}
        for name, cols in (("left", [0, 10]), ("right", [10, 20]))
    ]
    for p in passive:
        p["defenses"] = defenses
    return {
        "name": f"overfit_{backend}",
        "dataset": {
            "name": "synthetic",
            "test_fraction": 0.5,
            "synthetic": {"rows": 600, "features": 20, "informative": 6, "label_noise": 0.2},
        },
        "parties": {"active": {"name": "active"}, "passive": passive},
        "exchange": MPC if backend == "mpc" else {"backend": "plain"},
        "interactive": {"out": 32},
        "top": {"hidden": [128]},
        "training": {"epochs": 60, "batch_size": 32, "lr": 0.003, "optimizer": "adam", "seed": 0},
        "privacy": {"noise_seed": 0},
        "attacks": [{"name": "membership_inference", "params": {"attack_model": "threshold"}}],
    }


# Membership inference accuracy (0.5 = chance; 300 members + 300 non-members)
# over attack seeds 0-2 on the same views, [test accuracy]:
#   plain 0.657 / 0.660 / 0.653 [0.730]; + embedding_dp vanilla eps=2 (analytic)
#   0.500 / 0.500 / 0.500 [0.597] (the best cut on the shadows calls every record
#   alike: no loss gap left to exploit; AUC 0.61 / 0.57 / 0.62)
#   mpc 0.653 / 0.667 / 0.650 [0.737]; + embedding_dp 0.500 / 0.500 / 0.500 [0.620]
MI_DP = {"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 2.0, "calibration": "analytic"}}
MI_DROP = {"plain": 0.1, "mpc": 0.1}


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(MI_DROP))
def test_embedding_dp_reduces_membership_inference_on_an_overfitted_model(
    backend: str, tmp_path: Path
) -> None:
    base = run_doc(_overfit(backend, []), tmp_path / "undefended")
    res = run_doc(_overfit(backend, [MI_DP]), tmp_path / "embedding_dp")
    mi0 = base["attacks"]["membership_inference"]["accuracy"]
    mi = res["attacks"]["membership_inference"]["accuracy"]
    print(f"{backend}: membership accuracy {mi0:.3f} -> {mi:.3f} with embedding DP")
    assert mi0 >= 0.6  # the set-up does over-fit: the attack works without the defense
    assert mi <= mi0 - MI_DROP[backend]
