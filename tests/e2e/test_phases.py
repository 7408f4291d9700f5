"""Where a run's time goes: every rank reports its wall time per phase and its
peak memory, and the progress display announces entity alignment."""

from __future__ import annotations

import json

import torch

from securevfl.app.harness import _VIEW_GLOBALS
from tests.support.protocols import small_digits
from tests.support.runs import CliRun, run_doc

PHASES = {"startup", "data", "alignment", "setup", "training", "evaluation", "write_out"}


def test_result_reports_phases_and_memory_per_rank(small_cli_run: CliRun):
    """On the shared short CLI run (progress on, neither attacks nor a view dump)."""
    proc, result = small_cli_run.proc, small_cli_run.result
    assert set(result["phase_s"]) == {"0", "1", "2"}
    for rank, phases in result["phase_s"].items():
        assert set(phases) == PHASES, rank
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= result["wall_time_s"] + 1.0
        assert 10 < result["peak_rss_mib"][rank] < 4096
    assert result["phase_s"]["0"]["training"] > 0
    for rank, cpu in result["phase_cpu_s"].items():  # CPU seconds of the timed set-up phases
        assert set(cpu) == {"data", "alignment", "setup"}, rank
        assert all(0 <= v <= result["phase_s"][rank][k] * 2 + 0.5 for k, v in cpu.items()), rank
    # the active rank says when alignment starts and how many rows it found
    err = " ".join(proc.stderr.split())
    assert "entity alignment: 1797 IDs against 2 passive parties" in err
    assert f"entity alignment: {result['rows']['aligned']} rows in common" in err


def test_a_run_without_attacks_or_dump_keeps_no_received_tensor(small_cli_run: CliRun):
    result, run = small_cli_run.result, small_cli_run.out
    ranks = run / "ranks"
    for rank in result["phase_s"]:
        summary = json.loads((ranks / f"rank{rank}.summary.json").read_text())
        assert summary["view_tags"] == [], rank  # nothing kept, nothing saved
    assert not list(ranks.glob("*.view.pt")) and not list(ranks.glob("*.received.*"))


def test_a_dumped_view_is_spilled_past_its_memory_cap_and_saved_whole(tmp_path):
    doc = small_digits(epochs=1, max_steps=6)
    doc["runtime"] = {"dump_views": True, "view_memory_mib": 0.01}  # ~10 KiB: spills often
    result = run_doc(doc, tmp_path / "run")
    ranks = tmp_path / "run" / "ranks"
    with torch.serialization.safe_globals(_VIEW_GLOBALS):
        view = torch.load(ranks / "rank1.view.pt", weights_only=True)
    grads = view["received"]["embedding_grad"]
    steps = result["train_steps"]
    assert [r for r, _ in grads][:steps] == list(range(steps))  # every step's gradient, in order
    assert all(t.shape == (128, 16) for _, t in grads[:steps])
    assert not list(ranks.glob("*.received.*"))  # the spill files are gone once the view is saved
