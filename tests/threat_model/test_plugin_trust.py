"""What a party allows is the code it chose (SECURITY.md §4b).

The adversary is the author of a protocol file another organization runs with
``securevfl party``: it controls the file and the folder the file arrives in,
and may plant files in the working directory the party starts from. Each test
plants code that writes a marker file when it runs, and checks the marker:

* a ``NAME.py`` (or a package ``NAME/``) beside the protocol never replaces the
  party's own installed module ``NAME`` that ``--allow-plugin NAME`` allows, and
  a module beside the protocol runs only when the party names that file, by its
  path or by a SHA-256 digest it pins;
* a ``module:callable`` reference names a callable defined in the allowed module
  itself, never one reached through it in another module (``mylab:os.system``);
* a process securevfl spawns (a PSI worker holding the party's PSI scalar, a
  rank) starts with a safe import path: a ``multiprocessing/`` package planted
  in the working directory never runs in it, and ``python -m securevfl`` does not
  keep the working directory on the path its children inherit.
"""

from __future__ import annotations

import hashlib
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from securevfl.app.loader import load_protocol_dict
from securevfl.data import dh_psi
from securevfl.errors import UserCodeError
from securevfl.usercode import CodePolicy
from tests.support.protocols import ROOT, load_yaml
from tests.support.runs import cli

PLANTED = "open({marker!r}, 'a').write('ran\\n')\nSOURCE = 'planted'\n"


@pytest.fixture
def isolated():
    """Undo what a test's imports leave behind: the modules it imported, the
    finders it installed and the path entries it added."""
    modules, finders, path = set(sys.modules), list(sys.meta_path), list(sys.path)
    yield
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.meta_path[:] = finders
    sys.path[:] = path


def _doc(plugin: str) -> dict[str, Any]:
    """The shipped plain protocol with one plugin."""
    return {**load_yaml("plain.yaml"), "plugins": [plugin]}


def _installed_and_planted(tmp_path: Path, dotted: bool) -> tuple[str, Path, Path]:
    """An installed module (a folder on sys.path: the party's own) and a planted
    one of the same name beside the protocol; (module to allow, protocol folder, marker)."""
    name = f"svfl_lab_{uuid.uuid4().hex[:8]}"
    site, folder, marker = tmp_path / "site", tmp_path / "bundle", tmp_path / "planted-ran"
    site.mkdir()
    folder.mkdir()
    if dotted:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        (site / name / "models.py").write_text("SOURCE = 'installed'\n")
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(PLANTED.format(marker=str(marker)))
        (folder / name / "models.py").write_text(PLANTED.format(marker=str(marker)))
        module = f"{name}.models"
    else:
        (site / f"{name}.py").write_text("SOURCE = 'installed'\n")
        (folder / f"{name}.py").write_text(PLANTED.format(marker=str(marker)))
        module = name
    sys.path.insert(0, str(site))
    return module, folder, marker


@pytest.mark.parametrize("dotted", [False, True], ids=["module", "package"])
def test_an_installed_module_is_never_shadowed_by_the_protocols_folder(
    tmp_path: Path, isolated, dotted: bool
):
    """``--allow-plugin mylab`` (or ``mylab.models``) imports the party's installed
    module: a planted ``mylab.py`` beside the protocol, or a planted
    ``mylab/__init__.py``, never runs."""
    module, folder, marker = _installed_and_planted(tmp_path, dotted)
    load_protocol_dict(_doc(module), allow=[module], beside=folder)
    assert not marker.exists(), "code planted beside the protocol ran in place of the installed module"
    assert sys.modules[module].SOURCE == "installed"


def test_a_module_beside_the_protocol_runs_only_when_the_party_names_that_file(tmp_path: Path, isolated):
    """By name alone it is refused (nothing runs, the message says how to allow
    it); by its path or by its pinned digest it runs; a digest that does not
    match the file refuses it."""
    name = f"svfl_own_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "ran"
    folder = tmp_path / "bundle"
    folder.mkdir()
    f = folder / f"{name}.py"
    f.write_text(PLANTED.format(marker=str(marker)))
    digest = hashlib.sha256(f.read_bytes()).hexdigest()

    with pytest.raises(UserCodeError) as err:
        load_protocol_dict(_doc(name), allow=[name], beside=folder)
    msg = " ".join(str(err.value).split())
    assert f"plugin '{name}'" in msg and f"{name}=sha256:{digest}" in msg and "--allow-plugin" in msg
    assert not marker.exists()

    wrong = "0" * 64
    with pytest.raises(UserCodeError, match=f"{name}.py.*does not match the pinned sha256"):
        load_protocol_dict(_doc(name), allow=[f"{name}=sha256:{wrong}"], beside=folder)
    assert not marker.exists()

    load_protocol_dict(_doc(name), allow=[f"{name}=sha256:{digest}"], beside=folder)
    assert marker.read_text() == "ran\n" and sys.modules[name].SOURCE == "planted"
    del sys.modules[name]
    load_protocol_dict(_doc(name), allow=[str(f)], beside=folder)
    assert marker.read_text() == "ran\nran\n"


REFS = """
import os
import numpy as np
from os import getcwd as here

def bottom(in_features, out):
    return None

class Models:
    system = os.system

    @staticmethod
    def build(in_features, out):
        return None
"""


def test_a_reference_names_a_callable_defined_in_its_module(tmp_path: Path, isolated):
    """``mylab:os.system`` and the like resolve to code of another module the
    file's author chose, called with arguments the file chooses: refused at
    load, naming the reference."""
    name = f"svfl_refs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(REFS)
    policy = CodePolicy(frozenset({name}))
    sys.path.insert(0, str(tmp_path))
    for attr in ("os.system", "np.load", "here", "Models.system", "os"):
        with pytest.raises(UserCodeError, match=f"'{name}:{attr}' .*not .*defined in module '{name}'"):
            policy.load(f"{name}:{attr}", what="factory", path="f")
    assert policy.load(f"{name}:bottom", what="factory", path="f").__name__ == "bottom"
    assert policy.load(f"{name}:Models.build", what="factory", path="f").__name__ == "build"


PLANTED_MP = "open({marker!r}, 'a').write('ran\\n')\n"


def _plant_multiprocessing(cwd: Path) -> Path:
    marker = cwd.parent / "multiprocessing-ran"
    (cwd / "multiprocessing").mkdir(parents=True)
    (cwd / "multiprocessing" / "__init__.py").write_text(PLANTED_MP.format(marker=str(marker)))
    return marker


def test_a_psi_worker_starts_with_a_safe_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The PSI worker holds the party's PSI scalar: a ``multiprocessing``
    package in the working directory never runs in it."""
    cwd = tmp_path / "cwd"
    marker = _plant_multiprocessing(cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONSAFEPATH", "")  # as a shell that never set it
    key = dh_psi.Key.fresh()
    packed = dh_psi.hash_to_group([f"id{i}" for i in range(8)])
    failed: BaseException | None = None
    with dh_psi.Blinder(key, workers=2, min_parallel=0, slice_elements=4) as blinder:
        try:
            blinded = blinder.submit(packed).result()
        except Exception as exc:  # a worker broken by the planted package
            failed = exc
    assert not marker.exists(), "a multiprocessing package planted in the working directory ran"
    assert failed is None and blinded == dh_psi.multiply(key, packed)


def test_a_spawned_rank_starts_with_a_safe_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A rank started under the ``spawn`` method (rank_context) likewise."""
    from securevfl.app.rank_server import START_METHOD_ENV, rank_context, start_processes

    cwd = tmp_path / "cwd"
    marker = _plant_multiprocessing(cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONSAFEPATH", "")
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    p = rank_context().Process(target=time.sleep, args=(0,))
    start_processes([p])
    p.join(60)
    assert not marker.exists(), "a multiprocessing package planted in the working directory ran"
    assert p.exitcode == 0


def test_python_m_securevfl_keeps_the_working_directory_off_the_path(tmp_path: Path):
    """``python -m securevfl`` puts the working directory first on sys.path (and
    the children it spawns copy its path): the command drops it before it
    imports anything from there."""
    cwd = tmp_path / "cwd"
    marker = _plant_multiprocessing(cwd)
    p = cli("validate", str(ROOT / "protocols" / "plain.yaml"), cwd=cwd, env={"PYTHONSAFEPATH": ""})
    assert not marker.exists(), "a multiprocessing package planted in the working directory ran"
    assert p.returncode == 0, p.stderr[-2000:]
