"""Every shipped protocol file trains to completion with its own settings and
reaches the floor written for it in protocols/floors.toml (``make test-shipped``;
.ci/run runs it after the default suite).

The files are found by glob (protocols/*.yaml and protocols/demo/*.yaml), so a new
file is covered as soon as it exists, and fails the tier until it has a floor. Each
runs the way its documentation tells a user to run it, through the real command line:

- a protocol file: ``securevfl run FILE``;
- a file of the demo (``protocols/demo/``): ``securevfl compare FILE``, as ``make
  demo`` runs it, into one comparison folder shared by the session;
- the comparison file (protocols/demo/comparison.yaml): ``securevfl compare`` into
  that folder. Its runs that are a member file at the file's own settings (the same
  protocol digest) are found there, done and checked by that file's test, and not
  run twice; the others (its grid points) run and must each meet the comparison's
  floor. Run alone, the comparison runs everything;
- a file whose header gives ``securevfl party`` commands (multihost-loopback.yaml):
  those commands, one process per rank, on a free loopback port.

The files run two at a time (:data:`AT_ONCE`, one per core of the 2-core CI box;
a run's ranks wait on each other for much of a step, so two runs side by side
finish the tier in about two thirds of the time one after another), the costliest
first (the demo's job second): the tier's first test starts every selected file in a pool, and each test
waits for its own file. The demo's files and the comparison share one folder, so
they run one after another, as one job of the pool.

The terminal summary lists every file's metric, floor and its own wall time.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from securevfl.app.comparison import Run, plan, read_comparison_file, sources_from_paths
from securevfl.app.launcher import free_port
from securevfl.app.loader import load_protocol
from tests.support.protocols import PROTOCOLS, ROOT
from tests.support.runs import cli

FLOORS_FILE = PROTOCOLS / "floors.toml"
FILES = sorted(PROTOCOLS.glob("*.yaml")) + sorted((PROTOCOLS / "demo").glob("*.yaml"))
#: what a floor may name: a number result.json holds
METRICS = ("test_accuracy", "test_auc", "test_r2", "test_rmse", "test_mae")
#: one command's limit, a guard against a hang (the longest file takes minutes)
RUN_TIMEOUT_S = 3600
#: files trained at the same time
AT_ONCE = 2
#: what a run costs, most first: the pool starts the costly ones first
COST_ORDER = ("paillier", "ckks", "mpc", "plain")


def key(path: Path) -> str:
    """A file's name in floors.toml: its path under protocols/."""
    return path.relative_to(PROTOCOLS).as_posix()


@dataclass(frozen=True)
class Floor:
    """``metric`` at least ``bound`` (accuracy, R^2: ``at_least``) or at most
    ``bound`` (RMSE, MAE: ``at_most``)."""

    metric: str
    direction: str
    bound: float
    #: the recorded results the bound was set from (tests/shipped/floor_rule.py)
    runs: tuple[float, ...] = ()

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.direction == "at_least" else value <= self.bound

    def __str__(self) -> str:
        return f"{'>=' if self.direction == 'at_least' else '<='} {self.bound:g}"


#: a file's floor; a comparison file's may be one per run, by run label
Floors = Floor | dict[str, Floor]


def read_floors() -> dict[str, Floors]:
    """floors.toml: per file, ``metric``, one of ``at_least`` / ``at_most`` and
    ``runs`` (the results the bound was set from): a number and a list, or (a
    comparison file) tables of run label -> number and run label -> list."""
    doc = tomllib.loads(FLOORS_FILE.read_text())
    floors: dict[str, Floors] = {}
    for name, entry in doc.items():
        where = f"protocols/{FLOORS_FILE.name}: '{name}'"
        assert isinstance(entry, dict), f"{where} must be a table"
        assert entry.get("metric") in METRICS, f"{where}: metric must be one of {METRICS}"
        (direction, *more) = [d for d in ("at_least", "at_most") if d in entry] or [None]
        assert direction and not more, f"{where} needs exactly one of at_least, at_most"
        assert set(entry) == {"metric", direction, "runs"}, (
            f"{where}: keys are metric, {direction} and runs, not {sorted(entry)}"
        )
        bound, runs = entry[direction], entry["runs"]
        bounds = bound if isinstance(bound, dict) else {"": bound}
        samples = runs if isinstance(runs, dict) else {"": runs}
        assert bounds and all(isinstance(v, int | float) for v in bounds.values()), (
            f"{where}: {direction} is a number or a table of numbers"
        )
        assert sorted(samples) == sorted(bounds), (
            f"{where}: runs name {sorted(samples)}, not {sorted(bounds)}"
        )
        assert all(
            isinstance(r, list) and all(isinstance(v, int | float) for v in r) for r in samples.values()
        ), f"{where}: runs is a list of numbers (or a table of them, as {direction} is)"
        each = {
            label: Floor(entry["metric"], direction, float(v), tuple(float(x) for x in samples[label]))
            for label, v in bounds.items()
        }
        floors[name] = each[""] if not isinstance(bound, dict) else each
    return floors


def floor_of(path: Path) -> Floors:
    floors = read_floors()
    assert key(path) in floors, (
        f"{key(path)} is a shipped protocol file with no floor in protocols/{FLOORS_FILE.name}: "
        "run it and add its metric and floor there (that file's header says how floors are set)"
    )
    return floors[key(path)]


def metric(result: dict[str, Any], floor: Floor, what: str) -> float:
    value = result.get(floor.metric)
    assert isinstance(value, int | float) and math.isfinite(value), (
        f"{what}: result.json holds no number for {floor.metric} ({value!r}; task {result.get('task')})"
    )
    return float(value)


def header_party_commands(path: Path) -> list[list[str]]:
    """The ``securevfl party ...`` command lines of a file's header comment, the way
    it says to run it (those without identity keys), without the leading ``securevfl``."""
    lines = [ln.lstrip("#").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
    commands = [shlex.split(ln)[1:] for ln in lines if ln.startswith("securevfl party ")]
    return [c for c in commands if "--key" not in c]


def securevfl(*args: str) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=RUN_TIMEOUT_S)


def failure(command: list[str], rc: int | None, stderr: str) -> str:
    return f"`securevfl {' '.join(command)}` exited {rc}:\n{stderr[-3000:]}"


def run_parties(path: Path, commands: list[list[str]], tmp: Path) -> Path:
    """The header's party commands, each its own process in ``tmp`` (the file
    copied to where they name it) on a free port instead of the header's;
    rank 0's result.json."""
    port = free_port()
    copy = tmp / path.relative_to(ROOT)
    copy.parent.mkdir(parents=True)
    copy.write_text(path.read_text())
    commands = [
        [re.sub(r":\d+$", f":{port}", a) if a.startswith("tcp://") else a for a in c] for c in commands
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "securevfl", *cmd, "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        for cmd in commands
    ]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        errors.append(err)
    for cmd, p, err in zip(commands, procs, errors, strict=True):
        assert p.returncode == 0, failure(cmd, p.returncode, err)
    rank0 = commands[0]
    return tmp / rank0[rank0.index("--out") + 1] / "result.json"


def compare_runs(path: Path, out: Path) -> list[Run]:
    """Every run ``securevfl compare PATH --out OUT`` holds, with its folder."""
    return plan(*sources_from_paths([path], [], []), out).runs


def compare(path: Path, out: Path) -> list[Run]:
    cmd = ["compare", str(path), "--out", str(out), "--quiet"]
    proc = securevfl(*cmd)
    assert proc.returncode == 0, failure(cmd, proc.returncode, proc.stderr)
    return compare_runs(path, out)


def result_of(run: Run) -> dict[str, Any]:
    return json.loads((run.folder / "result.json").read_text())


def test_floors_name_exactly_the_shipped_files():
    """Default suite: a protocol file without a floor, or a floor of a file that is
    gone, fails here in seconds."""
    floors = read_floors()
    missing = [key(f) for f in FILES if key(f) not in floors]
    stale = sorted(set(floors) - {key(f) for f in FILES})
    assert not missing, f"shipped protocol files with no floor in protocols/{FLOORS_FILE.name}: {missing}"
    assert not stale, f"floors in protocols/{FLOORS_FILE.name} for files that do not exist: {stale}"


def test_a_file_without_a_floor_fails_by_name():
    with pytest.raises(AssertionError, match=r"new_protocol\.yaml is a shipped protocol file with no floor"):
        floor_of(PROTOCOLS / "new_protocol.yaml")


def test_the_party_commands_are_found_in_a_header():
    commands = header_party_commands(PROTOCOLS / "multihost-loopback.yaml")
    assert [c[c.index("--rank") + 1] for c in commands] == ["0", "1", "2"]
    assert header_party_commands(PROTOCOLS / "plain.yaml") == []


def check_comparison(path: Path, floors: Floors, out: Path) -> tuple[dict[str, tuple[float, Floor]], str]:
    """Run the comparison file into ``out``; (value, floor) of each run that is not
    a member file at that file's own settings, and a line for the summary."""
    runs = compare(path, out)
    own = {load_protocol(s.path).digest() for s in sources_from_paths([path], [], [])[1]}
    extra = [r for r in runs if r.digest not in own]
    assert extra, f"{key(path)}: every run is a member file at its own settings; its floor checks nothing"
    if isinstance(floors, dict):
        labels = [r.label for r in extra]
        assert sorted(floors) == sorted(labels), (
            f"protocols/{FLOORS_FILE.name}: '{key(path)}' has floors for {sorted(floors)}; "
            f"its runs beyond its member files' own are {labels}"
        )
    checked = {}
    for r in extra:
        floor = floors[r.label] if isinstance(floors, dict) else floors
        checked[f"{key(path)} {r.label}"] = (metric(result_of(r), floor, f"{key(path)} {r.label}"), floor)
    return checked, f"compare: {len(runs) - len(extra)} member runs reused, {len(extra)} more"


def check_protocol(path: Path, floor: Floor, tmp: Path, demo_folder: Path) -> tuple[float, str]:
    """Run one protocol file the way it says; its metric and how it ran."""
    if commands := header_party_commands(path):
        result = json.loads(run_parties(path, commands, tmp).read_text())
        how = f"{len(commands)} party commands"
    elif path.parent.name == "demo":
        (run,) = compare(path, demo_folder)
        result, how = result_of(run), "compare"
    else:
        cmd = ["run", str(path), "--out", str(tmp / "run"), "--quiet"]
        proc = securevfl(*cmd)
        assert proc.returncode == 0, failure(cmd, proc.returncode, proc.stderr)
        result, how = json.loads((tmp / "run" / "result.json").read_text()), "run"
    return metric(result, floor, key(path)), how


@dataclass(frozen=True)
class FileOutcome:
    """A file's checked values (label -> (value, floor)), how it ran and its own wall time."""

    checked: dict[str, tuple[float, Floor]]
    how: str
    seconds: float


def check_file(path: Path, tmp: Path, demo_folder: Path) -> FileOutcome:
    """Run one shipped file the way it says and read its metric(s)."""
    floors = floor_of(path)
    t0 = time.monotonic()
    if read_comparison_file(path) is not None:
        checked, how = check_comparison(path, floors, demo_folder)
    else:
        assert isinstance(floors, Floor), f"protocols/{FLOORS_FILE.name}: {key(path)} takes one floor"
        value, how = check_protocol(path, floors, tmp, demo_folder)
        checked = {key(path): (value, floors)}
    return FileOutcome(checked, how, time.monotonic() - t0)


def cost_rank(path: Path) -> int:
    """Where a file's backend stands in :data:`COST_ORDER`."""
    backend = load_protocol(path).exchange.backend
    return COST_ORDER.index(backend) if backend in COST_ORDER else len(COST_ORDER)


class Pool:
    """Every selected file's run, :data:`AT_ONCE` at a time: the costly ones first,
    the demo's files (one folder) as one job in file order, second."""

    def __init__(self, files: list[Path], base: Path):
        self.base = base
        self.demo_folder = base / "demo"
        self.executor = ThreadPoolExecutor(max_workers=AT_ONCE)
        self.futures: dict[Path, Future[FileOutcome]] = {}
        demo = [f for f in files if f.parent.name == "demo"]
        rest = sorted((f for f in files if f not in demo), key=cost_rank)
        # the demo's chain is as long as a costly run: it starts after the costliest one
        for f in rest[:1]:
            self.futures[f] = self.executor.submit(check_file, f, self.tmp(f), self.demo_folder)
        if demo:
            for f in demo:
                self.futures[f] = Future()
            chain: Future[None] = self.executor.submit(self.run_demo, demo)
            chain.add_done_callback(lambda done: self.fail_rest(demo, done))
        for f in rest[1:]:
            self.futures[f] = self.executor.submit(check_file, f, self.tmp(f), self.demo_folder)

    def tmp(self, path: Path) -> Path:
        folder = self.base / key(path).replace("/", "_")
        folder.mkdir(parents=True)
        return folder

    def run_demo(self, demo: list[Path]) -> None:
        for f in demo:
            try:
                self.futures[f].set_result(check_file(f, self.tmp(f), self.demo_folder))
            except BaseException as exc:  # the test of that file reports it
                self.futures[f].set_exception(exc)

    def fail_rest(self, demo: list[Path], done: Future[None]) -> None:
        for f in demo:
            if not self.futures[f].done():
                self.futures[f].set_exception(done.exception() or RuntimeError("the demo job stopped"))

    def outcome(self, path: Path) -> FileOutcome:
        return self.futures[path].result(timeout=len(self.futures) * RUN_TIMEOUT_S)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The pool of every file the session selected (``-k`` selects fewer)."""
    selected = [
        item.callspec.params["path"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_shipped_protocol_reaches_its_floor"
    ]
    runs = Pool(selected, tmp_path_factory.mktemp("shipped"))
    yield runs
    runs.close()


@pytest.mark.shipped
@pytest.mark.timeout(len(FILES) * RUN_TIMEOUT_S)
@pytest.mark.parametrize("path", FILES, ids=key)
def test_shipped_protocol_reaches_its_floor(path: Path, pool: Pool, record: Callable[..., None]):
    outcome = pool.outcome(path)
    for label, (value, floor) in outcome.checked.items():
        record(
            file=label,
            metric=floor.metric,
            floor=str(floor),
            value=value,
            seconds=outcome.seconds,
            how=outcome.how,
        )
    below = {
        label: f"{v:.4f} ({floor})" for label, (v, floor) in outcome.checked.items() if not floor.holds(v)
    }
    assert not below, f"below the floor of protocols/{FLOORS_FILE.name}: {below}"
