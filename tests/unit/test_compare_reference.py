"""A defense's cost against its reference row (securevfl.report.rows.defense_cost):
the undefended protocol a defended one is measured against, on the same dataset and
backend (else plain), gives the main performance lost and the time and bytes per
step as multiples, seed by seed; report.md names the reference row."""

from __future__ import annotations

import pytest

from securevfl.report import markdown as literal
from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.compare import markdown_summary, write_comparison
from securevfl.report.rows import rows


def _result(name: str, acc: float, step_s: float, nbytes: int, defended: bool) -> dict[str, object]:
    return {
        "protocol": name,
        "backend": "plain",
        "dataset": "digits",
        "test_accuracy": acc,
        "time_per_step_s": step_s,
        "bytes_per_step": nbytes,
        "defenses": {"active": ["label_dp"]} if defended else {},
        "privacy": {},
        "attacks": {},
    }


def _sweep(seed: int) -> list[RunRecord]:
    """``compare base.yaml ldp.yaml --grid EPS=0.5,2``: the reference row, then the sweep."""
    drift = 0.01 * seed
    return [
        RunRecord("base", "base", seed, _result("base", 0.95 + drift, 0.010, 1000, False)),
        RunRecord(
            "ldp[epsilon=0.5]", "ldp", seed, _result("ldp", 0.80 + drift, 0.012, 1000, True), {"eps": 0.5}
        ),
        RunRecord("ldp[epsilon=2]", "ldp", seed, _result("ldp", 0.90 + drift, 0.011, 2000, True), {"eps": 2}),
    ]


def test_a_defended_row_carries_its_cost_against_the_reference() -> None:
    table, _ = rows([r.result | {"protocol": r.label} for r in _sweep(0)])
    base, low, high = table
    assert base["mp_drop"] is None and base["reference"] is None  # the reference itself
    assert low["reference"] == "base" and high["reference"] == "base"
    assert low["mp_drop"] == pytest.approx(0.15) and low["time_ratio"] == pytest.approx(1.2)
    assert high["mp_drop"] == pytest.approx(0.05) and high["bytes_ratio"] == pytest.approx(2.0)


def test_the_report_adds_cost_columns_and_names_the_reference_row(tmp_path) -> None:
    recs = _sweep(0) + _sweep(1)
    summary = summarize(recs)
    table = markdown_summary(summary)
    head = table.splitlines()[0]
    assert "MP drop vs ref" in head and "s/step vs ref" in head and "bytes vs ref" in head
    low = next(
        line for line in table.splitlines() if line.startswith("| " + literal.cell("ldp[epsilon=0.5]"))
    )
    assert "15.0 pts" in low and "1.20x" in low
    md = write_comparison(tmp_path, recs)["markdown"].read_text()
    assert "Reference row: `base`." in md
    # without a defended row there is no cost to show
    alone = markdown_summary(summarize([r for r in recs if r.label == "base"]))
    assert "vs ref" not in alone
