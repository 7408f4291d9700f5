"""Another user of the host reads a party's secrets from its output folder (SECURITY.md §5,
"Checkpoints and saved models"; §7, "Outputs at rest").

Threat: a run's folder holds, per rank, its weight shares (``ranks/rank<R>.state.pt``,
the saved model, checkpoints: two parties' shares add up to W_i), its defenses' noise
keys (checkpoints), its bottom model and fitted preprocessing, its view and its
defenses' own statistics; the attack harness saves the victim's rows beside their
reconstructions (``attacks/*.npz``). Any of them readable by another local account
hands it what the protocol hides. The test plays that account: after a real run
written under a umask that lets everyone read (umask 0), and into a folder holding
an earlier result (so the run is staged and moved into place, the path a re-run
takes), every file under ``ranks/`` and ``attacks/`` must be its owner's alone (0600)
and every folder there 0700; so must a secret key written by ``securevfl keygen``
into a folder it creates. (A checkpoint is written by the same code as the saved
model, ``write_state``, into the same private rank folder; a run cannot both keep
checkpoints and run attacks, so ``tests/unit/test_checkpoints.py`` covers it.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from securevfl.runtime.secure.keys import Identity
from tests.support.protocols import small_digits
from tests.support.runs import run_doc

PRIVATE = ("ranks", "attacks")  # the folders of a run that hold a party's secrets


def _doc() -> dict:
    doc = small_digits(epochs=1, batch_size=64, max_steps=2)
    doc["privacy"] = {}  # fresh noise keys
    doc["parties"]["passive"][0]["defenses"] = [
        {"name": "embedding_dp", "params": {"variant": "vanilla", "epsilon": 2.0, "clip": 1.0}}
    ]
    doc["exchange"] = {"backend": "plain"}
    doc["runtime"] = {"dump_views": True}
    params = {"image_shape": [8, 4], "hidden": [8], "grid_rows": 2}
    doc["attacks"] = [{"name": "feature_reconstruction", "params": params}]
    return doc


def _modes(root: Path) -> dict[str, int]:
    """Every entry under ``root``'s private folders (and those folders) by path, with its mode."""
    out = {}
    for top in PRIVATE:
        base = root / top
        for p in [base, *base.rglob("*")]:
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("at-rest") / "run"
    (out / "ranks").mkdir(parents=True)  # an earlier run's, as loose as it may be
    os.chmod(out / "ranks", 0o755)
    (out / "result.json").write_text("{}")
    old = os.umask(0)  # the ranks inherit it
    try:
        run_doc(_doc(), out, overwrite=True)
    finally:
        os.umask(old)
    return out


def test_every_file_of_a_partys_secrets_is_its_owners_alone(run_folder: Path) -> None:
    modes = _modes(run_folder)
    # the run wrote what the threat names: shares, model, checkpoint, view, report, reconstructions
    names = set(modes)
    for must in (
        "ranks/rank1.state.pt",
        "ranks/rank1/model/models.pt",
        "ranks/rank1/model/defenses.json",
        "ranks/rank1.view.pt",
        "ranks/rank1.defense_report.json",
        "attacks/feature_reconstruction.npz",
    ):
        assert must in names, f"the run wrote no {must}"
    loose = {p: f"{m:o}" for p, m in modes.items() if m != (0o700 if (run_folder / p).is_dir() else 0o600)}
    assert not loose, f"readable by others or not private: {loose}"


def test_a_keygen_secret_key_lies_in_a_folder_of_its_own(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        secret, public = Identity.generate().write(tmp_path / "keys" / "new", "left")
    finally:
        os.umask(old)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert public.read_text().endswith(" left\n")
