"""Wrong arguments to the Python API raise :mod:`securevfl.errors`' ConfigError
naming the argument, as docs/api.md promises, not a raw TypeError, and before
anything runs or is written; an empty list of seeds is refused; a prediction
folder inside the training run's folder is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from securevfl import api
from securevfl.app.predict import check_out
from securevfl.errors import ConfigError
from tests.support.protocols import PROTOCOLS

PLAIN = PROTOCOLS / "plain.yaml"


def _refused(call: Any, path: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.path == path, str(info.value)
    assert text in str(info.value)


@pytest.mark.parametrize(
    ("call", "path", "text"),
    [
        (lambda tmp: api.run(PLAIN, out=123), "out", "out is a path (a string or a pathlib.Path), not int"),
        (lambda tmp: api.run(PLAIN, out=tmp / "r", overrides=3), "overrides", "not int"),
        (lambda tmp: api.run(PLAIN, out=tmp / "r", overrides=[("training.epochs", 1)]), "overrides", "tuple"),
        (lambda tmp: api.run(PLAIN, out=tmp / "r", data_dir=7), "data_dir", "not int"),
        (lambda tmp: api.run(PLAIN, out=tmp / "r", overwrite="yes"), "overwrite", "True or False"),
        (lambda tmp: api.load_protocol(PLAIN, overrides=3.5), "overrides", "not float"),
        (lambda tmp: api.compare([PLAIN], seeds=0, out=tmp / "c"), "seeds", "a list of integers, not int"),
        (lambda tmp: api.compare([PLAIN], seeds=["0"], out=tmp / "c"), "seeds", "got '0' (str)"),
        (lambda tmp: api.compare([PLAIN], seeds=[], out=tmp / "c"), "--seeds", "at least one seed"),
        (lambda tmp: api.compare([PLAIN], grid=5, out=tmp / "c"), "--grid", "not int"),
        (lambda tmp: api.compare([PLAIN], out=None), "out", "not NoneType"),
        (lambda tmp: api.predict(123, out=tmp / "p"), "run", "not int"),
        (lambda tmp: api.predict(tmp, out=None), "out", "not NoneType"),
        (lambda tmp: api.predict(tmp, out=tmp / "p", data={"shop": 5}), "data['shop']", "not int"),
        (lambda tmp: api.predict(tmp, out=tmp / "p", data=5), "--data", "not int"),
        (
            lambda tmp: api.predict(tmp, out=tmp / "p", data=["shop=a.csv", 5]),
            "--data",
            "a data item is a PARTY=PATH string, not int",
        ),
        (lambda tmp: api.party(PLAIN, rank="0", rendezvous="tcp://127.0.0.1:1"), "rank", "not str"),
        (lambda tmp: api.compare(5, out=tmp / "c"), "sources", "not int"),
        (lambda tmp: api.compare(None, out=tmp / "c"), "sources", "not NoneType"),
        (lambda tmp: api.compare([PLAIN, 5], out=tmp / "c"), "sources", "a source is a protocol file"),
        (lambda tmp: api.compare([], out=tmp / "c"), "sources", "name no protocol"),
        (lambda tmp: api.run(PLAIN, out=tmp / "r", on_epoch=5), "on_epoch", "a function (or None), not int"),
        (lambda tmp: api.run(PLAIN, out=str(tmp / "r\0x")), "out", "NUL character"),
        (lambda tmp: api.run(str(PLAIN) + "\0", out=tmp / "r"), "protocol", "NUL character"),
        (lambda tmp: api.compare([PLAIN], out=tmp / "c\0"), "out", "NUL character"),
        (lambda tmp: api.predict(str(tmp) + "\0", out=tmp / "p"), "run", "NUL character"),
    ],
    ids=[
        "run-out",
        "run-overrides",
        "run-override-item",
        "run-data_dir",
        "run-overwrite",
        "load-overrides",
        "compare-seeds",
        "compare-seed-item",
        "compare-no-seeds",
        "compare-grid",
        "compare-out",
        "predict-run",
        "predict-out",
        "predict-data-item",
        "predict-data",
        "predict-data-list-item",
        "party-rank",
        "compare-int",
        "compare-none",
        "compare-item",
        "compare-empty",
        "run-on_epoch",
        "run-out-nul",
        "run-protocol-nul",
        "compare-out-nul",
        "predict-run-nul",
    ],
)
def test_wrong_argument_types_are_config_errors(tmp_path: Path, call, path, text):
    _refused(lambda: call(tmp_path), path, text)
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists() and not (tmp_path / "p").exists()


def test_a_prediction_folder_inside_the_training_run_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "ranks" / "rank1" / "model").mkdir(parents=True)
    (run / "result.json").write_text("{}")
    for inside in (run / "ranks" / "rank1", run / "data", run / "preds", run / "ranks" / ".." / "x"):
        with pytest.raises(ConfigError) as info:
            check_out(inside, run)
        assert info.value.path == "--out"
        assert "lies inside the training run's folder" in str(info.value)
    check_out(tmp_path / "elsewhere", run)  # beside it: fine
