"""The comparison report: rows, privacy and attack columns, DCS, files and plots,
from result records alone."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from securevfl.report.aggregate import RunRecord, summarize
from securevfl.report.compare import epsilon_spent, markdown_table, print_summary, rows, write_comparison


def result(name, backend, acc, *, defenses=None, eps=None, attacks=None):
    priv = {}
    if eps is not None:
        priv = {"parties": {"left": {"total": {"epsilon": eps}}, "active": {"total": {"epsilon": 0.5}}}}
    return {
        "protocol": name,
        "backend": backend,
        "dataset": "digits",
        "test_accuracy": acc,
        "test_auc": None,
        "time_per_step_s": 0.01,
        "bytes_per_step": 2048,
        "defenses": defenses or {},
        "privacy": priv,
        "attacks": attacks or {},
    }


RESULTS = [
    result(
        "plain",
        "plain",
        0.96,
        attacks={"recon": {"ap": 0.8, "nmse": 0.2}, "mia": {"ap": 0.7, "chance": 0.5}},
    ),
    result("mpc", "mpc", 0.95, attacks={"recon": {"ap": 0.3}, "mia": {"ap": 0.6, "chance": 0.5}}),
    result(
        "mpc_dp",
        "mpc",
        0.90,
        defenses={"left": ["embedding_dp"]},
        eps=3.0,
        attacks={"recon": {"ap": 0.1}, "mia": {"ap": 0.5, "chance": 0.5}},
    ),
]


def test_rows_carry_eps_attacks_and_dcs_against_the_same_backend() -> None:
    table, attacks = rows(RESULTS)
    assert attacks == ["mia", "recon"]
    by = {r["protocol"]: r for r in table}
    assert by["plain"]["epsilon"] is None and by["mpc_dp"]["epsilon"] == 3.0
    assert by["mpc_dp"]["defenses"] == "embedding_dp" and by["mpc"]["defenses"] == "none"
    assert by["mpc_dp"]["attack:recon"] == 0.1
    # DCS of the defended run: reference is undefended mpc (MP 0.95); mia at chance 0.5
    d_recon = 1 / (1 + math.sqrt(0.5 * 0.1**2 + 0.5 * 0.05**2))
    d_mia = 1 / (1 + math.sqrt(0.5 * 0.0**2 + 0.5 * 0.05**2))
    assert by["mpc_dp"]["dcs"] == pytest.approx((d_recon + d_mia) / 2)
    # an undefended run scored against itself only measures the attack
    assert by["mpc"]["dcs"] < by["mpc_dp"]["dcs"]


def test_epsilon_is_the_worst_party() -> None:
    assert epsilon_spent(RESULTS[2]) == 3.0
    assert epsilon_spent(RESULTS[0]) is None


def test_markdown_has_one_row_per_run_and_attack_columns() -> None:
    md = markdown_table(RESULTS).splitlines()
    assert len(md) == 2 + 3
    assert "AP recon" in md[0] and "DCS" in md[0] and "eps" in md[0]
    assert "| mpc_dp | mpc | embedding_dp |" in md[4]


def test_files_and_plots_are_written(tmp_path) -> None:
    run = tmp_path / "plain" / "attacks"
    run.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(run / "recon.npz", original=rng.random((12, 8, 4)), reconstruction=rng.random((12, 8, 4)))
    res = [dict(r) for r in RESULTS]
    res[0] = {**res[0], "attacks": {**res[0]["attacks"], "recon": {"ap": 0.8, "grid": "attacks/recon.npz"}}}
    paths = write_comparison(tmp_path, res)
    assert set(paths) == {
        "json",
        "csv",
        "runs_csv",
        "markdown",
        "privacy_utility",
        "cost",
        "reconstruction_grid",
    }
    assert paths["privacy_utility"].stat().st_size > 10_000
    assert paths["reconstruction_grid"].stat().st_size > 5_000
    assert paths["cost"].stat().st_size > 5_000
    md = paths["markdown"].read_text()
    assert "privacy_utility.png" in md and "reconstruction_grid.png" in md and "cost.png" in md
    doc = json.loads(paths["json"].read_text())
    assert len(doc["protocols"]) == 3 and len(doc["runs"]) == 3
    assert paths["csv"].read_text().splitlines()[0].startswith("protocol,backend,defenses,dataset,n_seeds")


def test_no_attacks_no_attack_plots(tmp_path) -> None:
    paths = write_comparison(tmp_path, [result("plain", "plain", 0.9)])
    assert set(paths) == {"json", "csv", "runs_csv", "markdown", "cost"}


def test_grid_curves_and_per_seed_values_are_written(tmp_path) -> None:
    recs = []
    for eps in (0.5, 1.0, 4.0):
        for seed in (0, 1, 2):
            r = result("ldp", "mpc", 0.8 + eps / 40 + seed / 100, defenses={"active": ["label_dp"]}, eps=eps)
            r["attacks"] = {"label_direction": {"ap": 0.5 + eps / 10 + seed / 50, "auc": 0.5}}
            recs.append(RunRecord(f"ldp[epsilon={eps:g}]", "ldp", seed, r, point={"eps_key": eps}))
    paths = write_comparison(tmp_path, recs, {"ldp": ["eps_key"]})
    assert paths["grid_curves"].stat().st_size > 10_000
    assert "grid_curves.png" in paths["markdown"].read_text()
    doc = json.loads(paths["json"].read_text())
    assert len(doc["runs"]) == 9 and [g["point"] for g in doc["protocols"]] == [
        {"eps_key": 0.5},
        {"eps_key": 1.0},
        {"eps_key": 4.0},
    ]
    ap = doc["protocols"][0]["metrics"]["attack:label_direction"]
    assert ap["values"] == pytest.approx([0.55, 0.57, 0.59]) and ap["mean"] == pytest.approx(0.57)
    assert ap["half"] == pytest.approx(4.303 * 0.02 / math.sqrt(3), abs=1e-4)
    assert doc["chance"] == {"label_direction": 0.5}


def test_regression_metrics_show_only_where_some_run_has_them() -> None:
    assert "test R²" not in markdown_table(RESULTS).splitlines()[0]
    reg = {**result("reg", "plain", None), "test_r2": 0.61, "test_rmse": 0.7}
    md = markdown_table([reg]).splitlines()
    assert "test R²" in md[0] and "test RMSE" in md[0]
    assert "| 0.6100 | 0.700 |" in md[2]


def test_the_terminal_table_keeps_the_grid_labels(capsys) -> None:
    """Grid rows differ by their label only ("ldp [epsilon=0.5]"): the terminal table
    prints it as text (a bracket is console markup to rich, and was dropped)."""
    recs = [
        RunRecord(f"ldp [epsilon={eps:g}]", "ldp", 0, result("ldp", "mpc", 0.8 + eps / 40), point={"e": eps})
        for eps in (0.5, 1.0)
    ]
    print_summary(summarize(recs), title="t [x]")
    out = capsys.readouterr().out
    assert "ldp [epsilon=0.5]" in out and "ldp [epsilon=1]" in out, out


def test_hostile_names_and_titles_reach_report_md_as_literal_text(tmp_path) -> None:
    """A title, protocol, defense, attack or party name holding a line break, a
    backtick, markdown or HTML is shown as what it is: report.md rendered (CommonMark,
    markdown-it as rich ships it) has the one title heading and no tag of the sender's."""
    from markdown_it import MarkdownIt

    img = "<img src=x onerror=alert(1)>"
    hostile = [
        result("plain", "plain", 0.96, attacks={f"rec`on\n# pwn {img}": {"ap": 0.8}}),
        result(
            "dp`\n## owned\n<script>alert(2)</script>",
            "plain",
            0.90,
            defenses={"left": [f"{img}|x", "*bold* [link](javascript:alert(3))"]},
            eps=20.0,
            attacks={f"rec`on\n# pwn {img}": {"ap": 0.1}},
        ),
    ]
    paths = write_comparison(tmp_path, hostile, title="T\n# second title\n<script>alert(4)</script>")
    md = paths["markdown"].read_text()
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert html.count("<h1>") == 1 and "<h1>T\\n# second title" in html.replace("&lt;", "<")
    assert "<h2>owned" not in html and "<h1>pwn" not in html
    for tag in ("<script", "<img src=x", "<a href", "<em>bold", "<strong>bold"):
        assert tag not in html, tag
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown, not run
    headings = [ln for ln in md.splitlines() if ln.startswith("#")]
    assert headings[0].startswith(r"# T\\n\# second title") and all(h.startswith("## ") for h in headings[1:])
