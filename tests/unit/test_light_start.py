"""``securevfl --help``, ``list`` and ``validate`` start light: they read the
protocol schema and the registries' names and declarations, and import none of
the heavy libraries a rank needs (torch, scikit-learn, pandas, matplotlib, SciPy,
dp_accounting, the crypto libraries). A user's first contact and every check in
an editor loop would otherwise pay seconds for them (docs/benchmarks.md §7).

Each command runs in a fresh interpreter under ``python -X importtime``, which
names every module the process imports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.runs import cli

HEAVY = frozenset(
    {"torch", "sklearn", "pandas", "matplotlib", "scipy", "dp_accounting", "crypten", "tenseal", "phe"}
)

_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", re.MULTILINE)


def _heavy_imports(stderr: str) -> list[str]:
    """The heavy top-level packages among the modules ``-X importtime`` listed."""
    names = _IMPORTED.findall(stderr)
    assert names, "no -X importtime lines in the child's stderr:\n" + stderr[-2000:]
    return sorted({n.partition(".")[0] for n in names} & HEAVY)


@pytest.mark.parametrize(
    "args,says",
    [
        (["--help"], "usage: securevfl"),
        (["list"], "exchange backends: "),
        (["validate", "protocols/plain.yaml"], "ok: protocols/plain.yaml"),
        (["validate", "protocols/mpc.yaml"], "ok: protocols/mpc.yaml"),
        (["validate", "protocols/paillier.yaml"], "ok: protocols/paillier.yaml"),
    ],
)
def test_help_list_and_validate_import_nothing_heavy(args: list[str], says: str) -> None:
    proc = cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert says in proc.stdout
    heavy = _heavy_imports(proc.stderr)
    assert not heavy, f"securevfl {' '.join(args)} imports {heavy}"


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary\x00", b""], ids=["binary", "empty"])
@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_broken_protocol_file_is_refused_before_anything_heavy(
    tmp_path: Path, command: str, content: bytes
) -> None:
    """``run`` and ``compare`` read and check their protocol files before they
    import the launching modules (and before the ranks' fork server starts, which
    would log its own imports here too): a binary or empty file is refused at once,
    exit code 2, naming the file. Before, ``run`` imported torch and pandas first
    (about 14 s at load 12 on 2 cores) and the fork server held the command's
    stderr open until its own imports ended."""
    f = tmp_path / "protocol.yaml"
    f.write_bytes(content)
    proc = cli(
        command, str(f), "--out", str(tmp_path / "out"), env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert f"securevfl: error: {f}" in " ".join(" ".join(errors).split())
    heavy = _heavy_imports(proc.stderr)
    assert not heavy, f"securevfl {command} of a broken file imports {heavy}"
    assert not (tmp_path / "out").exists()


def test_the_import_log_is_read() -> None:
    """The parser sees an import named in an ``-X importtime`` line (the test
    above would pass vacuously otherwise)."""
    log = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   torch._C\n"
        "import time:        80 |        900 | securevfl.cli\n"
    )
    assert _heavy_imports(log) == ["torch"]
