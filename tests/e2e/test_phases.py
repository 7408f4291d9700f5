"""Where a run's time goes: every rank reports its wall time per phase and its
peak memory, and the progress display announces entity alignment."""

from __future__ import annotations

import json

from conftest import cli, small_digits, write_yaml

PHASES = {"startup", "data", "alignment", "setup", "training", "evaluation", "write_out"}


def test_result_reports_phases_and_memory_per_rank(tmp_path):
    proto = write_yaml(tmp_path / "p.yaml", small_digits(epochs=1, max_steps=3))
    proc = cli("run", str(proto), "--out", str(tmp_path / "run"))  # progress on
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert set(result["phase_s"]) == {"0", "1", "2"}
    for rank, phases in result["phase_s"].items():
        assert set(phases) == PHASES, rank
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= result["wall_time_s"] + 1.0
        assert 10 < result["peak_rss_mib"][rank] < 4096
    assert result["phase_s"]["0"]["training"] > 0
    # the active rank says when alignment starts and how many rows it found
    err = " ".join(proc.stderr.split())
    assert "entity alignment: 1797 IDs against 2 passive parties" in err
    assert f"entity alignment: {result['rows']['aligned']} rows in common" in err
