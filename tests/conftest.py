"""The suite's fixtures (the shared runs, launched once per session) and hooks; the
helpers they and the tests use are in tests/support/."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from securevfl.app.cache_key import KEY_ENV
from tests.support.protocols import SHORT_STEPS, short_sgd_digits, small_digits, write_yaml
from tests.support.runs import CliRun, cli, run_doc


@pytest.fixture(scope="session", autouse=True)
def _cache_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The comparison cache's key (securevfl.app.cache_key) in a folder of the
    session's own, for the tests and the commands they start, never the user's."""
    old = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(tmp_path_factory.mktemp("cache-key") / "compare-cache.key")
    yield
    if old is None:
        os.environ.pop(KEY_ENV, None)
    else:
        os.environ[KEY_ENV] = old


@pytest.fixture
def digits_doc() -> dict[str, Any]:
    return small_digits()


@pytest.fixture(scope="session")
def undefended_short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """``short_sgd_digits(SHORT_STEPS)`` without any defense: (result, output folder).
    The vanilla run DRAVL's and embedding_dp's identity checks compare with, launched
    once for both."""
    out = tmp_path_factory.mktemp("undefended_short")
    return run_doc(short_sgd_digits(SHORT_STEPS), out), out


@pytest.fixture(scope="session")
def small_cli_run(tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """One short undefended plain run (3 steps of small digits) through the CLI with
    progress on, shared by every test that only reads a finished run or works on a
    copy of its folder (phases, re-runs into a result folder, party commands that
    reproduce it, a run without a privacy record): one launch instead of one each.
    Tests must not write into ``out``; copy it first."""
    tmp = tmp_path_factory.mktemp("small_cli_run")
    proto = write_yaml(tmp / "p.yaml", small_digits(epochs=1, max_steps=3))
    proc = cli("run", str(proto), "--out", str(tmp / "run"))  # progress on
    assert proc.returncode == 0, proc.stderr
    return CliRun(proto, proc, json.loads((tmp / "run" / "result.json").read_text()), tmp / "run")
