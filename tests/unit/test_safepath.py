"""The import path securevfl's own processes start with (securevfl.runtime.safepath;
the planted-module tests are in tests/threat_model/test_plugin_trust.py)."""

from __future__ import annotations

import os
from pathlib import Path

import securevfl
from securevfl.runtime.safepath import drop_working_directory

CHECKOUT = str(Path(securevfl.__file__).resolve().parents[1])


def test_the_working_directory_python_m_put_first_is_dropped():
    assert drop_working_directory(["/work/x", "/lib", "/site"], "/work/x") == ["/lib", "/site"]
    assert drop_working_directory(["", "/lib"], "/work/x") == ["/lib"]


def test_a_path_that_does_not_start_with_it_is_kept():
    assert drop_working_directory(["/bin", "/lib", "/work/x"], "/work/x") == ["/bin", "/lib", "/work/x"]
    assert drop_working_directory([], "/work/x") == []


def test_a_source_checkout_run_in_place_goes_last_so_its_children_still_import_it():
    assert drop_working_directory([CHECKOUT, "/lib"], CHECKOUT) == ["/lib", CHECKOUT]
    assert drop_working_directory(["", "/lib"], CHECKOUT) == ["/lib", CHECKOUT]
    assert os.path.isdir(os.path.join(CHECKOUT, "securevfl"))


def test_the_safe_path_holds_for_the_block_alone(monkeypatch):
    """A program that launches runs through securevfl.api keeps its own environment for
    what it starts itself: the variable is set while securevfl starts its children only."""
    import os

    from securevfl.runtime.safepath import SAFE_PATH_ENV, safe_children, safe_env

    monkeypatch.delenv(SAFE_PATH_ENV, raising=False)
    with safe_children():
        assert os.environ[SAFE_PATH_ENV] == "1"
    assert SAFE_PATH_ENV not in os.environ
    monkeypatch.setenv(SAFE_PATH_ENV, "")
    with safe_children():
        assert os.environ[SAFE_PATH_ENV] == "1"
    assert os.environ[SAFE_PATH_ENV] == ""
    assert safe_env({"A": "b"}) == {"A": "b", SAFE_PATH_ENV: "1"}
