"""User errors through the command line (``python -m securevfl.cli``): exit code 2,
a one-paragraph message naming the YAML path (or party and column), and no
traceback unless ``--debug``.

Protocol errors that stop the command before any rank starts run in-process
through :func:`securevfl.cli.main` (the console script's code path minus the
interpreter start-up, as in test_protocol_fuzz.py); a missing file under each
command, ``--debug``, a valid file and a data error in a rank run as real
subprocesses, for the exit code and output the shell sees."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_psi import csv_protocol, make_ids

from securevfl.app.loader import load_protocol
from securevfl.app.predict import parse_data_overrides
from securevfl.cli import main
from securevfl.config import CsvSource
from securevfl.data.party_data import load_party_data
from securevfl.errors import ConfigError, DataError
from tests.support.protocols import PROTOCOLS, load_yaml, write_yaml
from tests.support.runs import cli


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``securevfl ARGS`` through :func:`securevfl.cli.main` in this process, with its
    exit code and output as :func:`tests.support.runs.cli` reports a subprocess's."""
    capsys.readouterr()  # drop anything printed before
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["securevfl", *args], code, out.out, out.err)


def error_text(proc) -> str:
    """The CLI's final error paragraph, whitespace-normalized (it is wrapped)."""
    err = proc.stderr
    assert "securevfl: error:" in err, err
    return " ".join(err[err.index("securevfl: error:") :].split())


def assert_clean_user_error(proc, *expected: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    text = error_text(proc)
    for part in expected:
        assert part in text, (part, text)


def unknown_key_doc() -> dict[str, Any]:
    doc = load_yaml("plain.yaml")
    doc["parties"]["passive"][0]["model"]["foo"] = 1
    return doc


def wrong_type_doc() -> dict[str, Any]:
    doc = load_yaml("plain.yaml")
    doc["training"]["epochs"] = "ten"
    return doc


CASES = {
    "unknown_key": (unknown_key_doc, ["parties.passive[0].model.foo", "unknown key"]),
    "wrong_type": (wrong_type_doc, ["training.epochs", "'ten'"]),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_protocol_exits_2_with_yaml_path(tmp_path, capsys, command, case):
    make, expected = CASES[case]
    f = write_yaml(tmp_path / "bad.yaml", make())
    out = tmp_path / "out"
    args = [command, str(f)] + (["--out", str(out), "--quiet"] if command == "run" else [])
    proc = in_process(capsys, *args)
    assert_clean_user_error(proc, str(f), *expected)
    assert not out.exists(), "no rank may start for an invalid protocol"


def test_debug_shows_the_traceback(tmp_path):
    f = write_yaml(tmp_path / "bad.yaml", unknown_key_doc())
    proc = cli("validate", str(f), "--debug", timeout=120)
    assert proc.returncode not in (0, 2)
    assert "Traceback" in proc.stderr
    assert "ConfigError" in proc.stderr
    assert "parties.passive[0].model.foo" in proc.stderr


def test_bad_override_exits_2(capsys):
    proc = in_process(capsys, "validate", str(PROTOCOLS / "plain.yaml"), "--set", "training.epochs=ten")
    assert_clean_user_error(proc, "training.epochs")


@pytest.mark.parametrize("command", ["validate", "run"])
def test_missing_file_exits_2(tmp_path, command):
    missing = tmp_path / "nope.yaml"
    proc = cli(command, str(missing), timeout=120)
    assert_clean_user_error(proc, "not found", str(missing))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: plain\ndataset: {name: digits\nparties: [\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_malformed_yaml_exits_2(tmp_path, capsys, text, expected):
    f = tmp_path / "broken.yaml"
    f.write_text(text)
    proc = in_process(capsys, "validate", str(f))
    assert_clean_user_error(proc, str(f), expected)


def test_validate_ok_for_comparison():
    """The same command on a good file succeeds (the error tests are not vacuous)."""
    proc = cli("validate", str(PROTOCOLS / "plain.yaml"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ok:" in proc.stdout


# -- data errors surface from the ranks ---------------------------------------------------------


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    lines = [",".join(header)] + [",".join("" if v is None else str(v) for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.timeout(90)
def test_run_with_nan_in_a_csv_names_party_and_column(tmp_path):
    ids = [f"cust-{i:05d}" for i in range(60)]
    write_csv(tmp_path / "bank.csv", ["id", "label"], [[i, n % 2] for n, i in enumerate(ids)])
    shop_rows = [[i, n * 0.5, n % 7] for n, i in enumerate(ids)]
    shop_rows[17][2] = None  # a NaN in column 'visits' at ID cust-00017
    write_csv(tmp_path / "shop.csv", ["id", "spend", "visits"], shop_rows)
    write_csv(tmp_path / "telco.csv", ["id", "minutes"], [[i, n] for n, i in enumerate(ids)])
    model = {"kind": "mlp", "hidden": [8], "out": 4}
    doc = {
        "name": "nan-check",
        "dataset": {"name": "csv"},
        "parties": {
            "active": {"name": "bank", "source": {"path": "bank.csv", "label_column": "label"}},
            "passive": [
                {"name": "shop", "source": {"path": "shop.csv"}, "model": model},
                {"name": "telco", "source": {"path": "telco.csv"}, "model": model},
            ],
        },
        "training": {"epochs": 1},
    }
    f = write_yaml(tmp_path / "nan.yaml", doc)
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = cli("run", str(f), "--out", str(out), "--quiet", timeout=85)
    elapsed = time.monotonic() - t0
    ended = time.time()
    assert_clean_user_error(proc, "'shop'", "'visits'", "cust-00017")
    assert "'spend'" not in error_text(proc)
    # the root cause is the passive party's DataError, not the peers' PartyFailure
    assert error_text(proc).startswith("securevfl: error: rank 1 (passive 'shop'):")
    # it fails at load: the peers end on their own soon after the failing rank
    # reports (killing them after the launcher's grace period would take 45 s)
    reported = (out / "ranks" / "rank1.error.json").stat().st_mtime
    assert ended - reported < 20, f"peers took {ended - reported:.1f} s to stop"
    assert elapsed < 60, f"a bad file must fail fast, took {elapsed:.1f} s"


@pytest.mark.parametrize(
    "label", ["../../../../tmp/x", "/tmp/x", "sub/dir/x", "..", ".hidden", "a\\b", "x" * 101]
)
def test_an_attack_label_that_is_no_plain_name_is_refused_at_load(tmp_path, capsys, label):
    """A label names ``OUT/attacks/<label>.npz`` (the victim's true features and their
    reconstructions): one that is a path, or too long a name, is refused before any
    rank starts, naming its YAML path, instead of writing outside ``--out`` or failing
    after training."""
    doc = load_yaml("demo/5_mpc_embedding_dp.yaml")
    doc["attacks"][0]["params"]["label"] = label
    f = write_yaml(tmp_path / "bad.yaml", doc)
    out = tmp_path / "out"
    for args in (["validate", str(f)], ["run", str(f), "--out", str(out), "--quiet"]):
        proc = in_process(capsys, *args)
        assert_clean_user_error(proc, str(f), "attacks[0].params.label", "is not a plain name")
    assert not out.exists(), "no rank may start for an invalid protocol"
    assert not (tmp_path / "x.npz").exists()


def test_plain_attack_labels_pass(tmp_path, capsys):
    doc = load_yaml("demo/5_mpc_embedding_dp.yaml")
    for j, label in enumerate(["recon left", "fr-2.b", "dlg#1", "ü_x"]):
        doc["attacks"][j % len(doc["attacks"])]["params"]["label"] = label
        f = write_yaml(tmp_path / f"ok{j}.yaml", doc)
        assert in_process(capsys, "validate", str(f)).returncode == 0


@pytest.mark.parametrize(("command", "tail"), [("run", "x" * 300), ("compare", "/".join(["y" * 200] * 25))])
def test_an_out_path_past_the_file_system_limits_is_refused(tmp_path, capsys, command, tail):
    """A folder name longer than the file system's NAME_MAX (or a path past PATH_MAX)
    is refused naming the argument, before anything runs: no raw OSError."""
    out = tmp_path / tail
    proc = in_process(capsys, command, str(PROTOCOLS / "plain.yaml"), "--out", str(out), "--quiet")
    assert_clean_user_error(proc, "at 'out'", "its file system allows", "choose a shorter path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "link_to_dev_zero", "folder"])
def test_a_data_path_that_is_no_regular_file_is_refused_at_load(tmp_path, capsys, kind):
    """A party's CSV path that leads to ``/dev/zero`` (read without end) or a named
    pipe (blocks the rank until its timeout) is refused at load, naming the party's
    YAML path, before any rank starts; the rank's reader refuses it too (a file
    swapped after the load), and so does ``predict --data``."""
    doc = csv_protocol(tmp_path, {name: make_ids(40, seed=1) for name in ("bank", "shop", "telco")})
    shop = tmp_path / "shop.csv"
    shop.unlink()
    said = {"fifo": "a named pipe (FIFO)", "folder": "a folder"}.get(kind, "a character device")
    if kind == "fifo":
        os.mkfifo(shop)
    elif kind == "dev_zero":
        doc["parties"]["passive"][0]["source"]["path"] = "/dev/zero"
    elif kind == "link_to_dev_zero":
        shop.symlink_to("/dev/zero")
    else:
        shop.mkdir()
    f = write_yaml(tmp_path / "p.yaml", doc)
    out = tmp_path / "out"
    for args in (["validate", str(f)], ["run", str(f), "--out", str(out), "--quiet"]):
        proc = in_process(capsys, *args)
        assert_clean_user_error(proc, "parties.passive[0].source.path", "party 'shop'", f"is {said}")
    assert not out.exists(), "no rank may start"
    path = doc["parties"]["passive"][0]["source"]["path"]
    with pytest.raises(DataError, match=f"party 'shop': its data file is {re.escape(said)}, not a file"):
        load_party_data(CsvSource(path=path), "shop", is_active=False)
    with pytest.raises(ConfigError, match=f"party 'shop': .* is {re.escape(said)}, not a CSV file"):
        parse_data_overrides([f"shop={path}"], load_protocol(f))
