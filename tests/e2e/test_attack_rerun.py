"""``securevfl attack RUN --attack NAME``: an attack run again on a finished run's saved
views, through the command line (docs/attacks.md, "Attacking a finished run")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.cli import main


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
