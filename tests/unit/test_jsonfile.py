"""The files a run writes are strict JSON (RFC 8259): an unbounded epsilon or an
attack's infinite score is written as the string "Infinity", a NaN as null, and
both read back through securevfl.jsonfile as the run wrote them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from securevfl import jsonfile
from securevfl.records import ResultRecord
from securevfl.report.result import write_result


def _strict(text: str) -> Any:
    """Parse as a strict JSON parser does: no Infinity, -Infinity or NaN tokens."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_have_one_json_spelling_and_read_back() -> None:
    value = {"eps": math.inf, "low": -math.inf, "ap": math.nan, "rows": [1.5, math.inf, (math.nan,)], "n": 3}
    text = jsonfile.dumps(value)
    assert _strict(text) == {
        "eps": "Infinity",
        "low": "-Infinity",
        "ap": None,
        "rows": [1.5, "Infinity", [None]],
        "n": 3,
    }
    back = jsonfile.loads(text)
    assert back["eps"] == math.inf and back["low"] == -math.inf and back["ap"] is None
    assert back["rows"][1] == math.inf and back["n"] == 3 and isinstance(back["n"], int)
    assert jsonfile.loads('{"eps": Infinity}')["eps"] == math.inf  # as an older securevfl wrote it


def test_a_result_record_with_infinities_is_written_as_strict_json(tmp_path: Path) -> None:
    record = ResultRecord.model_construct(
        protocol="p",
        attacks={"probe": {"ap": math.inf, "chance": math.nan}},
        privacy={"parties": {"left": {"total": {"epsilon": math.inf, "delta": 1e-5}}}},
    )
    path = write_result(tmp_path, record)
    text = path.read_text()
    doc = _strict(text)  # before: "Infinity" and "NaN" tokens, which a strict parser refuses
    assert doc["attacks"]["probe"] == {"ap": "Infinity", "chance": None}
    assert doc["privacy"]["parties"]["left"]["total"]["epsilon"] == "Infinity"
    assert jsonfile.loads(text)["privacy"]["parties"]["left"]["total"]["epsilon"] == math.inf
