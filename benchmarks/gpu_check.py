"""``make gpu-check``: what securevfl does on a CUDA device, in one JSON file.

On a machine whose torch sees a CUDA device it runs, within a budget of 8 minutes:

1. every test marked ``cuda`` (``pytest -m cuda``): the device runs of ``plain``
   and ``mpc`` end to end, ``mpc``'s ring products on CrypTen's CUDA kernel, the
   exchange benchmark on the device;
2. a user's own bottom model (a factory in a module beside the protocol file,
   ``model: {factory: ...}``) trained on the device with ``plain`` and ``mpc``
   through ``securevfl run``; the module records the device its first forward
   ran on in each passive rank;
3. the reference benchmark (``benchmarks/exchange.py --quick``) for ``plain`` and
   ``mpc`` on the device at batch 256 (digits) and 4096 (synthetic data of
   digits' shapes); ``mpc`` runs its joint layout there (CrypTen's own CUDA path).

and writes one JSON file: the machine (device, torch, CUDA), each test's outcome
and time, each benchmark row (time and bytes per step, x plain, CPU per step),
every stage's wall time, and ``ok``. Without a CUDA device it prints so and exits
0 without writing anything; on a machine with an NVIDIA device whose torch is a
CPU build (``make install``'s) it says which Python to use instead and exits 2.
The exit status is 1 when a stage failed (the JSON says which and keeps the tail
of its output).

Usage:  python benchmarks/gpu_check.py [--out PATH]
        (PATH: --out, else $SECUREVFL_GPU_CHECK_OUT, else runs/gpu-check.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT_ENV = "SECUREVFL_GPU_CHECK_OUT"
BUDGET_S = 480.0  # the whole check
TESTS_S = 210.0  # the cuda-marked tests, at most
USER_MODEL_S = 120.0  # the user model's two runs, at most
BATCHES = (256, 4096)
TAIL = 4000  # characters of a failed stage's output kept in the JSON


def machine() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "devices": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def run(cmd: list[str], timeout: float) -> tuple[int | None, str, float]:
    """(exit status or None when it ran out of time, its output, wall seconds)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, timeout), env=os.environ.copy()
        )
        code, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        parts = (exc.stdout, exc.stderr)
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in parts)
    return code, out, time.perf_counter() - t0


def cuda_tests(timeout: float) -> dict[str, Any]:
    """pytest -m cuda over the whole suite, outcomes read from its JUnit report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        # a test module that cannot be imported here (a missing optional package) is
        # reported as an error and keeps the others' cuda tests running
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
        cmd += ["--continue-on-collection-errors"]
        code, out, wall = run([*cmd, f"--junitxml={report}", "tests"], timeout)
        cases = []
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                outcome, message = "passed", ""
                for tag in ("failure", "error", "skipped"):
                    el = case.find(tag)
                    if el is not None:
                        outcome = {"failure": "failed"}.get(tag, tag)
                        message = (el.get("message") or "")[:500]
                cases.append(
                    {
                        "test": f"{case.get('classname')}::{case.get('name')}",
                        "outcome": outcome,
                        "time_s": float(case.get("time") or 0.0),
                        "message": message,
                    }
                )
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    ok = code == 0 and counts["passed"] > 0 and not counts["failed"] and not counts["error"]
    res: dict[str, Any] = {"ok": ok, "exit": code, "wall_s": wall, "counts": counts, "cases": cases}
    if not ok:
        res["output_tail"] = out[-TAIL:]
    return res


#: the user's module of the user-model stage, written beside its protocol file
USER_MODULE = """
import os
from pathlib import Path

from torch import nn


class Bottom(nn.Module):
    def __init__(self, in_features, out, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Linear(hidden, out), nn.Tanh()
        )
        self.seen = False

    def forward(self, x):
        if not self.seen:
            self.seen = True
            marks = os.environ.get("GPU_CHECK_MARKS")
            if marks:
                device = next(self.parameters()).device
                Path(marks, str(os.getpid())).write_text(f"{x.device} {device}")
        return self.net(x)


def bottom(in_features, out, *, hidden=64):
    return Bottom(in_features, out, hidden)
"""

USER_PROTOCOL = """
name: gpu-user-model
dataset: {name: digits}
parties:
  active: {name: active}
  passive:
    - name: left
      columns: {glob: "px_?_[0-3]"}
      model: {factory: "gpu_user_models:bottom", params: {hidden: 64}, out: 16}
    - name: right
      columns: {glob: "px_?_[4-7]"}
      model: {factory: "gpu_user_models:bottom", params: {hidden: 64}, out: 16}
interactive: {out: 16}
training: {epochs: 2, batch_size: 128, lr: 0.01, device: cuda}
"""


def user_model(timeout: float) -> dict[str, Any]:
    """A user's own bottom model trained on the device with plain and mpc: each
    run's accuracy, time per step, and the device each passive rank's module ran on."""
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "gpu_user_models.py").write_text(USER_MODULE)
        proto = folder / "protocol.yaml"
        proto.write_text(USER_PROTOCOL)
        for i, backend in enumerate(("plain", "mpc")):
            marks = folder / f"marks-{backend}"
            marks.mkdir()
            out = folder / f"run-{backend}"
            cmd = [sys.executable, "-m", "securevfl", "run", str(proto), "--out", str(out), "--quiet"]
            cmd += ["--set", f"exchange.backend={backend}"]
            os.environ["GPU_CHECK_MARKS"] = str(marks)
            try:
                left = timeout - (time.perf_counter() - t0)
                code, output, wall = run(cmd, left / (2 - i))
            finally:
                os.environ.pop("GPU_CHECK_MARKS", None)
            row: dict[str, Any] = {"backend": backend, "exit": code, "wall_s": wall}
            devices = sorted(f.read_text() for f in marks.iterdir())
            row["module_devices"] = devices  # "<input device> <parameter device>" per passive rank
            if (out / "result.json").exists():
                res = json.loads((out / "result.json").read_text())
                row.update(
                    device=res["device"],
                    test_accuracy=res["test_accuracy"],
                    train_steps=res["train_steps"],
                    s_per_step=res["time_per_step_s"],
                )
            row["ok"] = (
                code == 0
                and row.get("device") == "cuda"
                and len(devices) == 2
                and all(d.split()[0].startswith("cuda") and d.split()[1].startswith("cuda") for d in devices)
            )
            if not row["ok"]:
                row["output_tail"] = output[-TAIL:]
            rows.append(row)
    return {"ok": all(r["ok"] for r in rows), "wall_s": time.perf_counter() - t0, "runs": rows}


def benchmark(batch: int, timeout: float) -> dict[str, Any]:
    """The reference benchmark for plain and mpc on the device at one batch size."""
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "bench.json"
        cmd = [
            sys.executable,
            "benchmarks/exchange.py",
            "--quick",
            "--backends",
            "plain,mpc",
            "--device",
            "cuda",
            "--batch",
            str(batch),
            "--max-steps",
            "3",
            "--mpc-steps",
            "3",
            "--plain-steps",
            "8",
            "--channel-ab",
            "0",
            "--no-op-counts",
            f"--json={js}",
        ]
        code, out, wall = run(cmd, timeout)
        rows = json.loads(js.read_text())["rows"] if js.exists() else []
    ok = code == 0 and {r["backend"] for r in rows} == {"plain", "mpc"}
    res: dict[str, Any] = {"ok": ok, "exit": code, "wall_s": wall, "batch": batch, "rows": rows}
    if not ok:
        res["output_tail"] = out[-TAIL:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get(OUT_ENV) or str(ROOT / "runs" / "gpu-check.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        if not torch.version.cuda and (shutil.which("nvidia-smi") or Path("/dev/nvidiactl").exists()):
            print(
                f"gpu-check: this machine has an NVIDIA device but {sys.executable} holds torch "
                f"{torch.__version__} ({built}); run it with a Python whose torch is a CUDA build and "
                "that has securevfl's requirements: make gpu-check GPU_PYTHON=/path/to/python",
                file=sys.stderr,
            )
            return 2
        print(f"gpu-check: no CUDA device visible to torch {torch.__version__} ({built}); nothing to check")
        return 0
    t0 = time.perf_counter()

    def left() -> float:
        return BUDGET_S - (time.perf_counter() - t0)

    doc: dict[str, Any] = {
        "check": "securevfl gpu-check",
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": machine(),
    }
    print(f"gpu-check on {doc['machine']['device']}: cuda-marked tests ...", flush=True)
    doc["tests"] = cuda_tests(min(TESTS_S, left() - 60 * len(BATCHES) - USER_MODEL_S))
    print(f"  {doc['tests']['counts']} in {doc['tests']['wall_s']:.0f} s", flush=True)
    print("gpu-check: a user's own bottom model with plain and mpc ...", flush=True)
    doc["user_model"] = user_model(min(USER_MODEL_S, left() - 60 * len(BATCHES)))
    for r in doc["user_model"]["runs"]:
        acc = r.get("test_accuracy")
        shown = "-" if acc is None else f"{acc:.3f}"
        print(f"  {r['backend']:5s} ok={r['ok']} accuracy {shown} on {r.get('device')}", flush=True)
    doc["benchmarks"] = []
    for i, batch in enumerate(BATCHES):
        print(f"gpu-check: benchmark plain, mpc at batch {batch} ...", flush=True)
        res = benchmark(batch, left() / (len(BATCHES) - i) if i < len(BATCHES) - 1 else left())
        doc["benchmarks"].append(res)
        for r in res["rows"]:
            print(
                f"  {r['backend']:5s} {r['s_per_step'] * 1e3:9.1f} ms/step  x{r['ratio_to_plain']:.1f} plain",
                flush=True,
            )
        if not res["ok"]:
            print(f"  failed (exit {res['exit']}, {res['wall_s']:.0f} s)", flush=True)
    doc["wall_s"] = time.perf_counter() - t0
    doc["ok"] = doc["tests"]["ok"] and doc["user_model"]["ok"] and all(b["ok"] for b in doc["benchmarks"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"gpu-check: {'ok' if doc['ok'] else 'FAILED'} in {doc['wall_s']:.0f} s; wrote {out}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
