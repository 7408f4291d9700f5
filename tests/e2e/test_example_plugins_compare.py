"""examples/plugins/comparison.yaml through the real command line: ``securevfl
compare`` runs mpc against mpc with the plugin defense ``topk_embedding``, both
with the user's factory models (residual CNN, embedding bag) and attacked by the
plugin attack ``ink_probe``; the table shows both rows with the attack's column."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.runs import cli

pytestmark = pytest.mark.timeout(400)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "comparison.yaml"


def test_the_plugins_example_comparison_runs_end_to_end(tmp_path: Path):
    out = tmp_path / "cmp"
    p = cli("compare", str(EXAMPLE), "--out", str(out), timeout=380)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "AP ink_probe" in p.stdout
    rows = {line.split("│")[1].strip(): line for line in p.stdout.splitlines() if line.startswith("│")}
    assert set(rows) == {"plugins_mpc", "plugins_mpc_topk"}
    assert "topk_embedding" in rows["plugins_mpc_topk"]
    for name, defenses in (("plugins_mpc", []), ("plugins_mpc_topk", ["topk_embedding"])):
        result = json.loads((out / name / "seed0" / "result.json").read_text())
        assert result["backend"] == "mpc" and result["defenses"].get("left", []) == defenses
        probe = result["attacks"]["ink_probe"]
        assert probe["adversary"] == "active" and probe["n_test"] == 359 and math.isfinite(probe["ap"])
        assert result["test_accuracy"] > 0.5  # the user's models learn (chance: 0.1)
    topk = json.loads((out / "plugins_mpc_topk" / "seed0" / "result.json").read_text())
    assert topk["defense_report"]["left"]["topk_embedding"] == {"params": {"k": 2}}  # its options
