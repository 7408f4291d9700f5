"""A comparison's size and its report under unusual input: a large grid says its
size before it validates anything, one beyond the stated limit is refused at
once naming it, an empty list of seeds is refused, and a ``|`` in a grid value
stays inside its cell of report.md's table."""

from __future__ import annotations

import re
import time

import pytest

from securevfl.app.comparison import Source, plan
from securevfl.app.grid import make_axis
from securevfl.errors import ConfigError
from securevfl.report.aggregate import RunRecord
from securevfl.report.compare import write_comparison
from securevfl.report.stats import mean_interval
from tests.support.protocols import PROTOCOLS


def _source(*axes) -> Source:
    return Source(PROTOCOLS / "plain.yaml", (), tuple(axes))


def test_a_large_grid_says_its_size_before_validating_any_point():
    # 1,000 learning rates, the first one invalid: the size comes before that error
    values = [-1.0] + [0.001 * (k + 1) for k in range(999)]
    said: list[str] = []
    with pytest.raises(ConfigError, match=r"training\.lr"):
        plan("sweep", [_source(make_axis("training.lr", values))], [0, 1], PROTOCOLS, say=said.append)
    assert said == [
        "sweep: 2,000 runs (1,000 protocol and grid points x 2 seeds); validating every point before any runs"
    ]


def test_a_grid_beyond_the_limit_is_refused_at_once_naming_it():
    lr = make_axis("training.lr", [0.001 * (k + 1) for k in range(101)])
    bs = make_axis("training.batch_size", list(range(1, 101)))
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        plan("big", [_source(lr, bs)], None, PROTOCOLS, say=lambda _: None)
    assert time.monotonic() - t0 < 5  # not one point validated, the product never expanded
    assert info.value.path == "--grid"
    assert "10,100 runs (10,100 protocol and grid points x each protocol's own seed)" in str(info.value)
    assert "one comparison holds at most 10,000 runs" in str(info.value)


def test_an_empty_list_of_seeds_is_refused():
    with pytest.raises(ConfigError, match="at least one seed") as info:
        plan("t", [_source()], [], PROTOCOLS)
    assert info.value.path == "--seeds"


CELL = re.compile(r"(?<!\\)\|")


def test_a_pipe_in_a_grid_value_stays_in_its_cell(tmp_path):
    records = [
        RunRecord(
            label=f"plain[description={text}]",
            base="plain",
            seed=0,
            result={"protocol": "plain", "backend": "plain", "dataset": "digits", "test_accuracy": 0.5},
            point={"description": text},
        )
        for text in ("a|b", "c||d\\", "two\nlines")
    ]
    files = write_comparison(tmp_path, records, {"plain": ["description"]})
    table = [line for line in files["markdown"].read_text().splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(records)  # header, rule, one line per protocol
    widths = {len(CELL.split(line)) for line in table}
    assert len(widths) == 1, table
    assert "plain\\[description=a\\|b\\]" in table[2]  # brackets escaped too: no link can form


def test_a_metric_that_is_not_a_number_counts_as_missing():
    iv = mean_interval(["0.999", 0.5, None, {"x": 1}, True, float("nan"), 0.7])
    assert iv is not None and iv.values == (0.5, 0.7)
    assert mean_interval(["abc"]) is None
