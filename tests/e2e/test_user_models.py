"""A user's own models and plugins end to end (securevfl.plugins; SECURITY.md §4b).

A protocol whose passive parties name ``factory: "my_models:bottom"``, a module
beside the protocol file (tests/support/usercode, copied next to each test's
file), trains through ``securevfl run`` (on ``plain``, ``mpc``, ``ckks`` and
``paillier``) and through ``securevfl party`` processes that allow it (on
``plain``, ``mpc`` and ``ckks``). The module records every process that imports
it and every call, which shows that only the passive parties' ranks run it
(never the active rank, the dealer or the launcher, which imports it to check it
at load). A party refuses code its invocation does not allow, before anything is
imported; a factory that cannot be imported or called as named is refused at
load, before any rank starts; one that raises, returns no module or one of the
wrong width stops the run with exit code 2 naming the party and the factory,
once, without a traceback.
A plugin's defense and attack are known to ``validate`` and run in ``compare``.
The factory is called again for prediction and for a resumed run, which then
equals an uninterrupted one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.app.launcher import free_port
from securevfl.app.training import KILL_ENV
from securevfl.report.result import read_own_reports
from tests.support.protocols import write_yaml
from tests.support.runs import cli, party_process

pytestmark = pytest.mark.timeout(600)

USERCODE = Path(__file__).resolve().parents[1] / "support" / "usercode"
MARKS_ENV = "SVFL_FACTORY_MARKS"


def user_doc(backend: str, factory: str = "my_models:bottom", **training: Any) -> dict[str, Any]:
    """A small synthetic task: two passive parties with the user's bottom model
    (small embeddings: tanh-bounded, 4 columns), a label-only active party."""
    return {
        "name": f"user-{backend}",
        "dataset": {"name": "synthetic", "synthetic": {"rows": 240, "features": 8, "classes": 2}},
        "parties": {
            "active": {"name": "active"},
            "passive": [
                {"name": "left", "columns": {"index": [0, 4]}, "model": {"factory": factory, "out": 4}},
                {
                    "name": "right",
                    "columns": {"index": [4, 8]},
                    "model": {"factory": "my_models:bottom", "params": {"hidden": 8}, "out": 4},
                },
            ],
        },
        "exchange": {"backend": backend},
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 64, "max_steps": 3, "lr": 0.01, **training},
    }


def bundle(folder: Path, doc: dict[str, Any]) -> Path:
    """The protocol file with the user's modules beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in USERCODE.glob("*.py"):
        shutil.copy(f, folder)
    return write_yaml(folder / "protocol.yaml", doc)


def marks(folder: Path, kind: str) -> set[int]:
    """The processes that imported (``import``) or called (``call``) the factory module."""
    return {int(f.name.split("-")[1]) for f in folder.glob(f"{kind}-*")}


def rank_pids(out: Path) -> dict[int, int]:
    return {
        int(f.name.split(".")[0].removeprefix("rank")): json.loads(f.read_text())["pid"]
        for f in (out / "ranks").glob("rank*.summary.json")
    }


@pytest.mark.parametrize(
    "backend", ["plain", "mpc", "ckks", pytest.param("paillier", marks=pytest.mark.slow)]
)
def test_a_factory_beside_the_file_trains_under_run_in_the_passive_ranks_alone(tmp_path: Path, backend: str):
    proto = bundle(tmp_path / "bundle", user_doc(backend))
    seen = tmp_path / "marks"
    seen.mkdir()
    out = tmp_path / "out"
    p = cli("run", str(proto), "--out", str(out), "--quiet", env={MARKS_ENV: str(seen)})
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["backend"] == backend and result["train_steps"] == 3
    assert 0.0 <= result["test_accuracy"] <= 1.0
    pids = rank_pids(out)
    assert len(pids) == (4 if backend == "mpc" else 3)
    passive = {pids[1], pids[2]}
    # each passive rank imported and called its own factory; no other rank imported it, and the
    # launcher imported it once to check it at load, without calling it
    assert marks(seen, "call") == passive
    launcher = marks(seen, "import") - passive
    assert len(launcher) == 1 and not launcher & set(pids.values())


def _allow(*modules: str) -> list[str]:
    return [a for m in modules for a in ("--allow-plugin", m)]


def _finish(procs: list[Any]) -> list[tuple[int, str, str]]:
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=500)
        finally:
            if p.poll() is None:
                p.kill()
        outs.append((p.returncode, out, err))
    return outs


@pytest.mark.parametrize(
    "backend",
    ["plain", pytest.param("mpc", marks=pytest.mark.slow), pytest.param("ckks", marks=pytest.mark.slow)],
)
def test_a_factory_trains_through_party_processes_that_allow_it(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
):
    """Each organization starts its own rank; the passive parties allow the module
    that builds their own bottom model (one by the file's path, one by its pinned
    digest), the active party and the dealer allow nothing (they import none of it)."""
    proto = bundle(tmp_path / "bundle", user_doc(backend))
    seen = tmp_path / "marks"
    seen.mkdir()
    monkeypatch.setenv(MARKS_ENV, str(seen))
    world = 4 if backend == "mpc" else 3
    port = free_port()
    digest = hashlib.sha256((proto.parent / "my_models.py").read_bytes()).hexdigest()
    allow = {1: _allow(str(proto.parent / "my_models.py")), 2: _allow(f"my_models=sha256:{digest}")}
    procs = [
        party_process(proto, r, port, tmp_path / f"rank{r}", "--quiet", *allow.get(r, []))
        for r in range(world)
    ]
    outs = _finish(procs)
    for r, (code, _, err) in enumerate(outs):
        assert code == 0, (r, err[-3000:])
    result = json.loads((tmp_path / "rank0" / "result.json").read_text())
    assert result["backend"] == backend and result["train_steps"] == 3
    pids = {
        r: json.loads((tmp_path / f"rank{r}" / "ranks" / f"rank{r}.summary.json").read_text())["pid"]
        for r in range(world)
    }
    assert marks(seen, "call") == marks(seen, "import") == {pids[1], pids[2]}


def test_a_party_refuses_code_its_invocation_does_not_allow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Before it imports anything or contacts a peer: the factory of its own party
    without --allow-plugin, a plugin, and the same for a prediction; an allowed
    name covers its own module only. Exit code 2, the module named, no traceback."""
    doc = user_doc("plain")
    doc["plugins"] = ["svfl_test_plugin"]
    proto = bundle(tmp_path / "bundle", doc)
    seen = tmp_path / "marks"
    seen.mkdir()
    monkeypatch.setenv(MARKS_ENV, str(seen))
    port = free_port()
    cases = [
        # (rank, extra arguments, what the refusal names)
        (
            1,
            _allow(str(proto.parent / "svfl_test_plugin.py"), "my_model"),
            ["model factory 'my_models:bottom' of party 'left'"],
        ),
        (0, [], ["plugin 'svfl_test_plugin'"]),
        (
            2,
            [*_allow(str(proto.parent / "my_models.py")), "--predict", str(tmp_path)],
            ["plugin 'svfl_test_plugin'"],
        ),
    ]
    procs = [party_process(proto, r, port, tmp_path / f"rank{r}", *extra) for r, extra, _ in cases]
    for (_, _, named), (code, _, stderr) in zip(cases, _finish(procs), strict=True):
        assert code == 2, stderr
        err = " ".join(stderr.split())  # the message is wrapped
        assert all(n in err for n in named) and "--allow-plugin" in err and "Traceback" not in err
    assert not list(seen.iterdir())  # nothing was imported
    assert not (tmp_path / "bundle" / "__pycache__").exists()


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("my_models:raising", "factory 'my_models:raising' raised ValueError"),
        ("my_models:not_a_module", "factory 'my_models:not_a_module' returned a dict, not a torch.nn.Module"),
        ("my_models:wrong_width", "to shape (8, 5); the exchange needs (8, 4)"),
    ],
)
def test_a_factory_that_cannot_build_the_bottom_stops_the_run_naming_party_and_factory(
    tmp_path: Path, factory: str, says: str
):
    proto = bundle(tmp_path / "bundle", user_doc("plain", factory=factory))
    p = cli("run", str(proto), "--out", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 2, p.stderr[-3000:]
    err = " ".join(p.stderr.split())  # the message is wrapped
    assert "rank 1 (passive 'left')" in err and f"bottom model of party 'left': factory '{factory}'" in err
    assert says in err and "at 'parties.passive[0].model" in err
    assert "Traceback" not in p.stderr
    assert err.count(says) == 1, p.stderr  # reported once, by the launcher, not by every rank as well


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (
            {"factory": "broken_models:bottom"},
            "module 'broken_models' failed while it was imported (ImportError)",
        ),
        ({"factory": "my_models:botom"}, "module 'my_models' has no 'botom'"),
        ({"factory": "my_models:bottom", "params": {"hiden": 8}}, "unexpected keyword argument 'hiden'"),
    ],
)
def test_a_factory_that_cannot_be_called_as_named_is_refused_before_any_rank_starts(
    tmp_path: Path, model: dict[str, Any], says: str
):
    doc = user_doc("plain")
    doc["parties"]["passive"][0]["model"] = {**model, "out": 4}
    proto = bundle(tmp_path / "bundle", doc)
    out = tmp_path / "out"
    p = cli("run", str(proto), "--out", str(out), "--quiet")
    assert p.returncode == 2, p.stderr[-3000:]
    err = " ".join(p.stderr.split())  # the message is wrapped
    assert "at 'parties.passive[0].model.factory': bottom model of party 'left': factory" in err
    assert err.count(says) == 1 and "Traceback" not in p.stderr
    assert not (out / "ranks").exists()  # no rank started


def test_a_plugin_defense_and_attack_in_validate_and_compare(tmp_path: Path):
    """``validate`` knows the plugin's names once the plugin is allowed (and refuses
    the file otherwise); ``compare`` runs mpc against mpc with the plugin's
    defense, both attacked by the plugin's attack."""
    base = user_doc("mpc")
    base["plugins"] = ["svfl_test_plugin"]
    base["attacks"] = [{"name": "test_grad_norm", "params": {"party": "left"}}]
    defended = json.loads(json.dumps(base))
    defended["name"] = "user-mpc-scaled"
    defended["parties"]["passive"][0]["defenses"] = [{"name": "test_scale", "params": {"factor": 0.25}}]
    a = bundle(tmp_path / "bundle", base)
    b = write_yaml(tmp_path / "bundle" / "scaled.yaml", defended)

    p = cli("validate", str(a), str(b))
    assert p.returncode == 2 and "plugin 'svfl_test_plugin'" in p.stderr and "Traceback" not in p.stderr
    p = cli("validate", str(a), str(b), "--allow-plugin", "svfl_test_plugin")
    assert p.returncode == 2 and "svfl_test_plugin=sha256:" in p.stderr  # beside the file: by path or digest
    p = cli("validate", str(a), str(b), "--allow-plugin", str(a.parent / "svfl_test_plugin.py"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("ok:") == 2

    out = tmp_path / "compare"
    p = cli("compare", str(a), str(b), "--out", str(out), "--quiet", timeout=500)
    assert p.returncode == 0, p.stderr[-3000:]
    for name, defenses in (("user-mpc", []), ("user-mpc-scaled", ["test_scale"])):
        result = json.loads((out / name / "seed0" / "result.json").read_text())
        assert result["backend"] == "mpc" and result["defenses"].get("left", []) == defenses
        attack = result["attacks"]["test_grad_norm"]
        assert attack["adversary"] == "left" and 0.5 <= attack["auc"] <= 1.0
    scaled = json.loads((out / "user-mpc-scaled" / "seed0" / "result.json").read_text())
    assert scaled["defense_report"]["left"]["test_scale"] == {"params": {"factor": 0.25}}  # public: options
    own = read_own_reports(out / "user-mpc-scaled" / "seed0")["left"].defenses
    assert own["test_scale"] == {"factor": 0.25}  # the defense's own report, kept by its party


def test_a_factory_model_is_saved_and_called_again_for_prediction(tmp_path: Path):
    """The trained factory model is saved with the run; ``securevfl predict``
    calls the factory again, in the passive prediction ranks alone, and loads
    the saved weights into it."""
    proto = bundle(tmp_path / "bundle", user_doc("plain", max_steps=None))
    seen = tmp_path / "marks"
    seen.mkdir()
    out = tmp_path / "out"
    p = cli("run", str(proto), "--out", str(out), "--quiet", env={MARKS_ENV: str(seen)})
    assert p.returncode == 0, p.stderr[-3000:]
    trained = marks(seen, "call")
    pred = tmp_path / "pred"
    p = cli("predict", str(out), "--out", str(pred), env={MARKS_ENV: str(seen)})
    assert p.returncode == 0, p.stderr[-3000:]
    rows = (pred / "predictions.csv").read_text().splitlines()
    assert len(rows) == 241 and rows[0].startswith("id,")
    predicting = marks(seen, "call") - trained
    summaries = {
        json.loads(f.read_text())["rank"]: json.loads(f.read_text())["pid"]
        for f in (pred / "ranks").glob("rank*.predict_summary.json")
    }
    assert predicting == {summaries[1], summaries[2]}
    # besides those ranks, each launcher (run, predict) imported it to check it at load
    launchers = marks(seen, "import") - trained - predicting
    assert len(launchers) == 2 and not launchers & set(summaries.values())


@pytest.mark.slow
def test_a_resumed_factory_run_equals_an_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run killed after its epoch-1 checkpoint and resumed: each passive rank
    calls its factory again and loads its checkpoint into the module; with
    seeded initial weights the result is the uninterrupted run's, bit for bit."""
    doc = user_doc("plain", epochs=3, max_steps=None, checkpoint_every=1)
    for p in doc["parties"]["passive"]:
        p["model"]["init"] = "seeded"
    doc["runtime"] = {"peer_timeout_s": 5}
    proto = bundle(tmp_path / "bundle", doc)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert cli("run", str(proto), "--out", str(full), "--quiet").returncode == 0
    p = cli("run", str(proto), "--out", str(cut), "--quiet", env={KILL_ENV: "1:1"})
    assert p.returncode == 3, p.stderr[-2000:]
    p = cli("run", str(proto), "--out", str(cut), "--quiet", "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    for r in (1, 2):
        a = torch.load(full / "ranks" / f"rank{r}.state.pt", weights_only=True)
        b = torch.load(cut / "ranks" / f"rank{r}.state.pt", weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["plain", "mpc"])
def test_a_factory_model_trains_on_the_gpu(tmp_path: Path, backend: str):
    """With ``training.device: cuda`` the user's module trains on the device in
    each passive rank (its parameters are there at every training step)."""
    proto = bundle(tmp_path / "bundle", user_doc(backend, device="cuda", epochs=2, max_steps=None))
    seen = tmp_path / "marks"
    seen.mkdir()
    out = tmp_path / "out"
    p = cli("run", str(proto), "--out", str(out), "--quiet", env={MARKS_ENV: str(seen)})
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["device"] == "cuda" and result["backend"] == backend
    pids = rank_pids(out)
    devices = {int(f.name.split("-")[1]): f.read_text() for f in seen.glob("device-*")}
    assert set(devices) == {pids[1], pids[2]} and all(d.startswith("cuda") for d in devices.values())
