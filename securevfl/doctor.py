"""``python -m securevfl.doctor``: check that every library of the mission imports.

Run by ``make install`` so that a dependency conflict surfaces at set-up time, not
in the middle of a run.
"""

from __future__ import annotations

import importlib
import sys

from securevfl._compat import import_crypten

MODULES = [
    ("torch", "torch"),
    ("tenseal", "tenseal"),
    ("phe", "phe"),
    ("gmpy2", "gmpy2"),
    ("skfuzzy", "scikit-fuzzy"),
    ("private_set_intersection.python", "openmined-psi"),
    ("cryptography", "cryptography"),
    ("cffi", "cffi"),
    ("dp_accounting", "dp-accounting"),
    ("onnx", "onnx"),
    ("sklearn", "scikit-learn"),
    ("pydantic", "pydantic"),
    ("yaml", "PyYAML"),
    ("rich", "rich"),
    ("matplotlib", "matplotlib"),
]


def check() -> list[str]:
    """Return one line per library: its version or the import error."""
    lines = []
    failed = False
    for mod, dist in MODULES:
        try:
            m = importlib.import_module(mod)
            lines.append(f"ok   {dist} {getattr(m, '__version__', '')}".rstrip())
        except Exception as exc:  # report every failure, not only the first
            failed = True
            lines.append(f"FAIL {dist}: {type(exc).__name__}: {exc}")
    try:
        crypten = import_crypten()
        lines.append(f"ok   crypten {getattr(crypten, '__version__', '')} (with torch-2.x shim)")
    except Exception as exc:
        failed = True
        lines.append(f"FAIL crypten: {type(exc).__name__}: {exc}")
    if failed:
        lines.append("FAILED")
    return lines


def main() -> int:
    lines = check()
    print("\n".join(lines))
    return 1 if lines and lines[-1] == "FAILED" else 0


if __name__ == "__main__":
    sys.exit(main())
