"""``securevfl --help``, ``list`` and ``validate`` start light: they read the
protocol schema and the registries' names and declarations, and import none of
the heavy libraries a rank needs (torch, scikit-learn, pandas, matplotlib, SciPy,
dp_accounting, the crypto libraries). A user's first contact and every check in
an editor loop would otherwise pay seconds for them (docs/benchmarks.md §7).

Each command runs in a fresh interpreter under ``python -X importtime``, which
names every module the process imports."""

from __future__ import annotations

import re

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


def test_the_import_log_is_read() -> None:
    """The parser sees an import named in an ``-X importtime`` line (the test
    above would pass vacuously otherwise)."""
    log = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   torch._C\n"
        "import time:        80 |        900 | securevfl.cli\n"
    )
    assert _heavy_imports(log) == ["torch"]
