"""Runs at the same time, with real processes: two ``securevfl run`` commands into
one output folder, and ``api.run`` from several threads of one script (into one
folder, and into different folders). A second run into a folder another run
holds is refused naming the first, and the first's result is the one kept;
threads into different folders both finish (the registries' lazy imports are
thread-safe)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.protocols import ROOT, small_digits, write_yaml
from tests.support.runs import cli

pytestmark = pytest.mark.timeout(300)


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.1)


def test_a_second_cli_run_into_a_folder_in_use_is_refused_naming_the_first(tmp_path):
    """The second asks to --overwrite: without the lock it would run beside the
    first and replace its files (both exit 0, one result lost)."""
    # the first runs until it is stopped; the second would take one epoch
    proto = write_yaml(tmp_path / "p.yaml", small_digits(epochs=1_000_000))
    out = tmp_path / "r"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "securevfl",
            "run",
            str(proto),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "training.seed=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        _wait_for(out / "ranks" / "launcher_pids.json", first, 120)  # its ranks are running
        second = cli(  # at most one epoch: without the lock it would run, beside the first
            *("run", str(proto), "--out", str(out), "--quiet", "--overwrite"),
            *("--set", "training.seed=2", "--set", "training.epochs=1"),
        )
        still_running = first.poll() is None
        err = " ".join(second.stderr.split())
        assert second.returncode == 2, second.stderr[-2000:]
        assert still_running
        assert "Traceback" not in second.stderr
        assert f"is in use by another securevfl run (pid {first.pid} (thread 'MainThread')" in err, err
        assert str(proto) in err  # the first's command line
        # the refused run wrote nothing: no staging folder, no result (the first's mark: it writes in place)
        held = [f".securevfl-fresh-{first.pid}", ".securevfl-lock", "data", "ranks"]
        assert sorted(p.name for p in out.iterdir()) == held
        first.terminate()  # it stops every rank it started
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 143
    assert not (out / ".securevfl-lock").exists() and not (out / "result.json").exists()


SCRIPT = """
import json
import sys
import threading

from securevfl import api

if __name__ == "__main__":
    doc = json.loads(sys.argv[1])
    root = sys.argv[2]
    results = {}

    def go(name, out, seed):
        try:
            result = api.run(doc, out=out, overrides={"training.seed": seed}, progress=False)
            results[name] = ["ok", result.seed]
        except Exception as exc:
            results[name] = [type(exc).__name__, str(exc)]

    jobs = [("a", root + "/same", 1), ("b", root + "/same", 2), ("c", root + "/other", 3)]
    threads = [threading.Thread(target=go, args=job, name="run-" + job[0]) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))
"""


def test_api_run_from_threads(tmp_path):
    """In a fresh interpreter (the registries' lazy imports not done yet): of two
    threads into one folder exactly one runs and the other is refused naming the
    first's thread; a third thread into another folder finishes too."""
    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    doc = small_digits(epochs=2)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(doc), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["c"] == ["ok", 3], results
    same = sorted([results["a"], results["b"]], key=lambda r: r[0] != "ok")
    assert same[0][0] == "ok", results
    assert same[1][0] == "ConfigError", results
    assert "is in use by another securevfl run (this process (thread 'run-" in same[1][1], results
    kept = json.loads((tmp_path / "same" / "result.json").read_text())
    assert kept["seed"] == same[0][1]
