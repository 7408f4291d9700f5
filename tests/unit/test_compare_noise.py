"""Figures of a comparison that cannot be trusted as they stand: an interval over
seeds is clipped to its metric's range (an accuracy's at 1, a time's at 0), a
figure whose 95% interval is wider than itself is marked noisy and explained
under the table, and a long plot title wraps instead of running off the figure."""

from __future__ import annotations

import json
import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from securevfl.report import markdown as literal
from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.compare import NOISY, cell, write_comparison
from securevfl.report.plots import wrap_title
from securevfl.report.rows import metric_range
from securevfl.report.stats import mean_interval


def _result(acc: float, ap: float, step_s: float) -> dict[str, object]:
    return {
        "protocol": "plain",
        "backend": "plain",
        "dataset": "digits",
        "test_accuracy": acc,
        "time_per_step_s": step_s,
        "bytes_per_step": 2048,
        "defenses": {},
        "privacy": {},
        "attacks": {"label_leak": {"ap": ap, "chance": 0.5}},
    }


def _records(accs: list[float], aps: list[float], steps: list[float]) -> list[RunRecord]:
    return [
        RunRecord("plain", "plain", seed, _result(acc, ap, s))
        for seed, (acc, ap, s) in enumerate(zip(accs, aps, steps, strict=True))
    ]


def test_an_interval_is_clipped_to_its_metrics_range() -> None:
    # mean 0.98, s = 0.034641, half = 4.303 * 0.034641 / sqrt(3) = 0.086057: past 1 unclipped
    iv = mean_interval([0.94, 1.0, 1.0], bounds=metric_range("test_accuracy"))
    assert iv is not None and iv.half == pytest.approx(0.086057, abs=1e-5)
    assert iv.hi == 1.0 and iv.lo == pytest.approx(0.98 - 0.086057, abs=1e-5) and iv.clipped
    assert cell("test_accuracy", iv) == "0.9800 [0.8939, 1.0000]"
    free = mean_interval([0.94, 1.0, 1.0])
    assert free is not None and free.hi == pytest.approx(1.066057, abs=1e-5) and not free.clipped
    assert metric_range("attack:label_leak") == (-math.inf, 1.0)  # 1 - nMSE may be negative
    assert metric_range("time_per_step_s") == (0.0, math.inf)


def test_the_comparison_files_hold_scores_within_their_range(tmp_path) -> None:
    recs = _records([0.94, 1.0, 1.0], [0.93, 1.0, 0.99], [0.010, 0.011, 0.012])
    summary = summarize(recs)
    g = summary.groups[0]
    assert g.metrics["test_accuracy"].hi == 1.0  # type: ignore[union-attr]
    assert g.metrics["attack:label_leak"].hi == 1.0  # type: ignore[union-attr]
    paths = write_comparison(tmp_path, recs)
    metrics = json.loads(paths["json"].read_text())["protocols"][0]["metrics"]
    assert metrics["test_accuracy"]["hi"] == 1.0 and metrics["attack:label_leak"]["hi"] == 1.0
    header, row = paths["csv"].read_text().splitlines()[:2]
    csv = dict(zip(header.split(","), row.split(","), strict=True))
    assert float(csv["test_accuracy_hi"]) == 1.0 and float(csv["attack:label_leak_hi"]) == 1.0
    md = paths["markdown"].read_text()
    assert literal.cell("0.9800 [0.8939, 1.0000]") in md and "`mean [lo, hi]`" in md
    assert literal.cell(NOISY) + "0" not in md and "marks a noisy figure" not in md  # nothing here is noisy


def test_a_figure_whose_interval_is_wider_than_itself_is_marked_noisy(tmp_path) -> None:
    # time per step 2, 20, 8 ms: mean 10 ms, half = 4.303 * 9.165 / sqrt(3) = 22.77 ms > the mean
    recs = _records([0.90, 0.91, 0.92], [0.60, 0.61, 0.62], [0.002, 0.020, 0.008])
    paths = write_comparison(tmp_path, recs)
    g = summarize(recs).groups[0]
    time = g.metrics["time_per_step_s"]
    assert time is not None and time.noisy and time.lo == 0.0  # a time is never negative
    assert cell("time_per_step_s", time) == f"{NOISY}10.00 ms [0.00 ms, 32.77 ms]"
    acc = g.metrics["test_accuracy"]
    assert acc is not None and not acc.noisy and not cell("test_accuracy", acc).startswith(NOISY)
    md = paths["markdown"].read_text()
    assert literal.cell(f"{NOISY}10.00 ms [0.00 ms, 32.77 ms]") in md  # report.md shows cells literally
    assert "marks a noisy figure: its 95% interval over seeds is wider than the figure itself" in md
    doc = json.loads(paths["json"].read_text())["protocols"][0]["metrics"]
    assert doc["time_per_step_s"]["noisy"] is True and doc["test_accuracy"]["noisy"] is False


def _title_fits(text: str, width: float) -> bool:
    fig = Figure(figsize=(width, 3.8))
    ax = fig.subplots()
    title = ax.set_title(text, fontsize=9)
    fig.tight_layout()
    FigureCanvasAgg(fig).draw()
    box, edge = title.get_window_extent(), fig.bbox
    return box.x0 >= edge.x0 and box.x1 <= edge.x1


def test_a_long_plot_title_wraps_instead_of_being_clipped() -> None:
    long = (
        "my-study-with-a-long-name [parties.passive[*].defenses[0].params.epsilon=0.5, "
        "training.lr=0.01]: label_leak_by_gradient_direction"
    )
    assert not _title_fits(long, 4.4)  # as it was: past both edges of a grid-curve panel
    wrapped = wrap_title(long, 4.0, 9)
    assert "\n" in wrapped and wrapped.replace("\n", " ").split() == long.split()
    assert _title_fits(wrapped, 4.4)
    assert wrap_title("short title", 4.0, 9) == "short title"
