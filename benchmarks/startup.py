"""Start-up benchmark: how long a user waits before securevfl does anything.

Two measurements, each interleaved over one or more source trees (a checkout
of another commit beside this one, to compare before and after under the same
load), every command a fresh interpreter:

* ``commands``: wall time of ``securevfl --help``, ``securevfl list`` and
  ``securevfl validate protocols/plain.yaml`` against ``python -c "import torch"``
  in the same rounds, with each command's ratio to the torch import (medians).
* ``ranks``: for ``securevfl run PROTOCOL --set training.max_steps=STEPS``, the
  time from launch to the first training step of the active party (rank 0), and
  to the command's exit. The rank records its own phases (``phase_s`` of
  ``result.json``: start-up, data, alignment, set-up before training) and its
  wall time from the start of its clock (``wall_time_s``) to the moment it
  writes ``result.json``; with that file's modification time as the end of the
  clock, the first step begins at ``mtime - wall_time_s + startup + data +
  alignment + setup`` (the untimed instants between phases are left out: the
  figure is a lower bound by at most milliseconds). ``launch -> rank clock``
  is what precedes the rank's own clock: the command's imports, the fork
  server's imports and the rank's start.

The machine's load average is printed before and after: on a shared machine
compare the trees measured in the same run, not runs of different days.

Usage:  python benchmarks/startup.py commands [--tree DIR ...] [--rounds 3]
        python benchmarks/startup.py ranks [--tree DIR ...] [--rounds 3]
                                           [--protocols plain,mpc] [--steps 2]
A ``--tree`` is the root of a securevfl checkout (default: this one); the
interpreter is this one (``sys.executable``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRE_TRAINING = ("startup", "data", "alignment", "setup")
COMMANDS: dict[str, list[str]] = {
    "--help": ["-m", "securevfl", "--help"],
    "list": ["-m", "securevfl", "list"],
    "validate plain.yaml": ["-m", "securevfl", "validate", "protocols/plain.yaml"],
}
TORCH = ["-c", "import torch"]


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _timed(args: list[str], tree: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=tree, env=_env(tree), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} in {tree} failed:\n{proc.stderr[-2000:]}")
    return seconds


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def commands(trees: list[Path], rounds: int) -> None:
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for tree in trees:
            times.setdefault((str(tree), "import torch"), []).append(_timed(TORCH, tree))
            for name, args in COMMANDS.items():
                times.setdefault((str(tree), name), []).append(_timed(args, tree))
    for tree in trees:
        torch_s = statistics.median(times[(str(tree), "import torch")])
        print(f"{tree}:")
        label = 'python -c "import torch"'
        print(f"  {label:30s} median {torch_s:6.2f} s  {_runs(times[(str(tree), 'import torch')])}")
        for name in COMMANDS:
            runs = times[(str(tree), name)]
            med = statistics.median(runs)
            print(
                f"  {'securevfl ' + name:30s} median {med:6.2f} s  {_runs(runs)}  {med / torch_s:.2f}x torch"
            )


def _runs(runs: list[float]) -> str:
    return "(" + ", ".join(f"{r:.2f}" for r in runs) + ")"


def _first_step(tree: Path, protocol: str, steps: int) -> tuple[float, float, float]:
    """(launch -> rank 0's clock, launch -> first training step, launch -> exit) in seconds."""
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        out = Path(tmp) / "run"
        args = ["-m", "securevfl", "run", f"protocols/{protocol}.yaml", "--out", str(out), "--quiet"]
        args += ["--set", f"training.max_steps={steps}"]
        t_launch = time.time()
        proc = subprocess.run(
            [sys.executable, *args], cwd=tree, env=_env(tree), capture_output=True, text=True
        )
        t_exit = time.time()
        if proc.returncode != 0:
            raise SystemExit(f"securevfl run {protocol} in {tree} failed:\n{proc.stderr[-2000:]}")
        result_file = out / "result.json"
        result = json.loads(result_file.read_text())
        clock_start = result_file.stat().st_mtime - result["wall_time_s"]
        phases = result["phase_s"]["0"]
        first = clock_start + sum(phases.get(p, 0.0) for p in PRE_TRAINING)
        return clock_start - t_launch, first - t_launch, t_exit - t_launch


def ranks(trees: list[Path], rounds: int, protocols: list[str], steps: int) -> None:
    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(rounds):
        for protocol in protocols:
            for tree in trees:
                got.setdefault((protocol, str(tree)), []).append(_first_step(tree, protocol, steps))
    for protocol in protocols:
        print(f"securevfl run protocols/{protocol}.yaml --set training.max_steps={steps} --quiet:")
        for tree in trees:
            runs = got[(protocol, str(tree))]
            clock, first, done = (statistics.median(r[i] for r in runs) for i in range(3))
            print(
                f"  {tree}: launch -> rank clock {clock:6.2f} s, -> first step {first:6.2f} s "
                f"{_runs([r[1] for r in runs])}, -> exit {done:6.2f} s {_runs([r[2] for r in runs])}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("commands", "ranks"))
    ap.add_argument("--tree", action="append", type=Path, help="a securevfl checkout (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--protocols", default="plain,mpc")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, {_load()}")
    if args.what == "commands":
        commands(trees, args.rounds)
    else:
        ranks(trees, args.rounds, args.protocols.split(","), args.steps)
    print(f"after: {_load()}")


if __name__ == "__main__":
    main()
