"""``securevfl attack RUN --attack NAME``: an attack run again on a finished run's saved
views, through the command line (docs/attacks.md, "Attacking a finished run")."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl import api
from securevfl.attacks.base import ATTACKS
from securevfl.cli import main
from securevfl.config import Protocol
from securevfl.errors import ConfigError
from tests.support import user_components as uc
from tests.support.protocols import small_digits


def test_an_attack_reruns_on_a_finished_runs_views_and_leaves_its_result(
    undefended_short_run: tuple[dict[str, Any], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(undefended_short_run[1], run)
    before = (run / "result.json").read_bytes()
    loads: list[Any] = []
    real_load = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        loads.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    code = main(
        ["attack", str(run), "--attack", "label_norm", "--param", "party=right", "--param", "positive=3"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    entry = json.loads((run / "attacks" / "label_norm.json").read_text())
    assert entry["attack"] == "label_norm" and entry["adversary"] == "right"
    assert entry["params"] == {"party": "right", "positive": 3}
    assert 0.0 <= entry["ap"] <= 1.0 and f"{entry['ap']:.4f}" in out
    assert loads and all(w is True for w in loads)  # every view loaded with weights_only=True
    assert (run / "result.json").read_bytes() == before  # the run's own result is left as it was


def test_an_unknown_attack_a_bad_option_or_a_run_without_views_is_refused(
    undefended_short_run: tuple[dict[str, Any], Path],
    small_cli_run: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = undefended_short_run[1]
    assert main(["attack", str(run), "--attack", "nope"]) == 2
    assert "unknown attack 'nope'" in capsys.readouterr().err
    assert main(["attack", str(run), "--attack", "label_norm", "--param", "party=nobody"]) == 2
    assert "nobody" in capsys.readouterr().err
    assert main(["attack", str(run), "--attack", "label_norm", "--param", "colour"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["attack", str(small_cli_run.out), "--attack", "label_norm"]) == 2  # saved no views
    err = capsys.readouterr().err
    assert "runtime.dump_views" in err and "Traceback" not in err
    assert not (small_cli_run.out / "attacks").exists()


PROBE = '''
"""A user's attack module, named to `securevfl attack` by its path."""
from securevfl.plugins import register_attack
from tests.support.usercode.svfl_test_plugin import GradNorm as _GradNorm


@register_attack
class FileProbe(_GradNorm):
    name = "{name}"
'''


@pytest.fixture
def isolated() -> Iterator[None]:
    """Undo what a test's imports leave behind in this process: the attacks its
    plugins registered, the modules they imported and the finders installed."""
    attacks, modules, finders = set(ATTACKS), set(sys.modules), list(sys.meta_path)
    yield
    for name in set(ATTACKS) - attacks:
        ATTACKS.remove(name)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.meta_path[:] = finders


def _probe_file(folder: Path, attack: str) -> Path:
    """A plugin file that registers attack ``attack``, under a fresh module name."""
    path = folder / f"svfl_probe_{uuid.uuid4().hex[:10]}.py"
    path.write_text(PROBE.format(name=attack))
    return path


def test_an_attack_of_a_file_given_by_plugin_reruns(
    undefended_short_run: tuple[dict[str, Any], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    isolated: None,
) -> None:
    """``--plugin ./file.py`` imports that very file (by path, as --allow-plugin
    does), and the attack it registers runs; a bare name is looked up as an
    installed module, never as a file beside the run."""
    run = tmp_path / "run"
    shutil.copytree(undefended_short_run[1], run)
    plugin = _probe_file(tmp_path, "test_file_probe")
    code = main(
        ["attack", str(run), "--attack", "test_file_probe", "--plugin", str(plugin), "--param", "party=right"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    entry = json.loads((run / "attacks" / "test_file_probe.json").read_text())
    assert entry["attack"] == "test_file_probe" and 0.0 <= entry["auc"] <= 1.0
    assert sys.modules[plugin.stem].__file__ == str(plugin)
    # the same module by bare name, from a file beside the run: not imported
    marker = tmp_path / "imported"
    beside = run / "svfl_beside_run.py"
    beside.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["attack", str(run), "--attack", "label_norm", "--plugin", "svfl_beside_run"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # unwrapped
    assert "no module named 'svfl_beside_run'" in err and "--plugin" in err and "Traceback" not in err
    assert not marker.exists()


@pytest.fixture(scope="module")
def api_attack_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short plain run through :func:`api.run` whose protocol lists an attack
    class of the caller's own (registered for that call only)."""
    doc = small_digits(epochs=1, max_steps=3)
    doc["attacks"] = [uc.Idle]
    out = tmp_path_factory.mktemp("api_attack_run") / "run"
    api.run(doc, out=out, progress=False)
    assert "test_idle" not in ATTACKS  # the call's own registration is gone
    return out


def test_a_run_listing_the_callers_own_attack_class_can_be_attacked_again(
    api_attack_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    isolated: None,
) -> None:
    """The saved protocol names an attack this process does not know: another
    attack reruns all the same (the saved attack is not rerun, and the saved
    protocol is vouched for by its digest, not by resolving it); that attack
    itself reruns once --plugin registers it (an installed module, by name,
    imported before the saved protocol is checked), and without it is refused,
    naming it."""
    run = tmp_path / "run"
    shutil.copytree(api_attack_run, run)
    assert main(["attack", str(run), "--attack", "label_norm", "--param", "party=right"]) == 0
    assert json.loads((run / "attacks" / "label_norm.json").read_text())["adversary"] == "right"
    capsys.readouterr()
    assert main(["attack", str(run), "--attack", "test_idle"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # unwrapped
    assert "attacks[0].name" in err and "unknown attack 'test_idle'" in err and "Traceback" not in err
    lib = tmp_path / "lib"
    lib.mkdir()
    module = f"svfl_idle_{uuid.uuid4().hex[:10]}"
    (lib / f"{module}.py").write_text(
        "from securevfl.plugins import register_attack\n"
        "from tests.support.user_components import Idle\n\n"
        "register_attack(Idle)\n"
    )
    monkeypatch.syspath_prepend(str(lib))  # installed: on the Python path
    code = main(["attack", str(run), "--attack", "test_idle", "--plugin", module])
    assert code == 0, capsys.readouterr().err
    assert json.loads((run / "attacks" / "test_idle.json").read_text())["attack"] == "test_idle"


def test_the_saved_protocol_is_still_held_to_its_digest(
    api_attack_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its attacks are not resolved, but the protocol a rerun works under is the one
    the run's manifest vouches for: another digest is refused, naming the field."""
    monkeypatch.setattr(Protocol, "digest", lambda self: "v2-0123456789abcdef")
    assert main(["attack", str(api_attack_run), "--attack", "label_norm", "--param", "party=right"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # unwrapped
    assert "field 'protocol' does not match the manifest's protocol digest" in err and "Traceback" not in err
    assert not (api_attack_run / "attacks").exists()


def test_api_attack_reruns_by_name_and_by_the_callers_own_class(
    api_attack_run: Path, tmp_path: Path, isolated: None
) -> None:
    """``api.attack``: the command's rerun from Python, by a registered name (the
    run given as its folder or its RunResult) and by an Attack subclass of the
    caller's own, registered for that call only; mistakes are ConfigErrors naming
    the argument, and nothing is written for them."""
    run = tmp_path / "run"
    shutil.copytree(api_attack_run, run)
    again = api.attack(run, "label_norm", params={"party": "right"})
    assert again.key == "label_norm" and again.path == run / "attacks" / "label_norm.json"
    assert again.metrics["adversary"] == "right" and 0.0 <= again.score <= 1.0
    assert json.loads(again.path.read_text())["ap"] == again.score
    own = api.attack(run, uc.Idle)
    assert own.key == "test_idle" and own.path.is_file() and "test_idle" not in ATTACKS
    for bad, field in (
        ({"attack": 5}, "attack"),
        ({"attack": "label_norm", "params": ["party=right"]}, "params"),
        ({"attack": "label_norm", "plugins": "mylab"}, "plugins"),
    ):
        with pytest.raises(ConfigError) as info:
            api.attack(run, **bad)  # type: ignore[arg-type]
        assert info.value.path == field
    with pytest.raises(ConfigError, match="unknown attack 'nope'"):
        api.attack(run, "nope")
    assert sorted(p.name for p in (run / "attacks").iterdir()) == ["label_norm.json", "test_idle.json"]
