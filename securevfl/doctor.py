"""``python -m securevfl.doctor``: check the environment against securevfl's
declared dependencies.

The declared set is the one in ``pyproject.toml``, read from the installed
package's metadata: the core dependencies, and each extra (``crypto``, ``dev``)
that is installed, meaning that at least one of its distributions is. Every
distribution of that set must be installed at a version its declaration allows,
and every runtime one (core and ``crypto``) must import; CrypTen imports through
securevfl's torch-2.x shim (:mod:`securevfl._compat`). ``dev`` holds tools and
test-only references (linters, pytest, the reference PSI and fuzzy c-means the
tests compare against), checked by version only.

Run by ``make install``, so that a dependency conflict surfaces at set-up time,
not in the middle of a run.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re
import sys
from dataclasses import dataclass

from securevfl._compat import import_crypten

PACKAGE = "securevfl"
RUNTIME_EXTRAS = ("crypto",)  # extras whose distributions securevfl imports

#: the module a distribution is imported as, where it is not its own name
IMPORT_NAMES = {
    "scikit-learn": "sklearn",
    "PyYAML": "yaml",
    "dp-accounting": "dp_accounting",
}

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;(.*))?$")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_CLAUSE = re.compile(r"^(==|!=|>=|<=|>|<|~=)\s*([0-9][0-9A-Za-z.*+!-]*)$")


@dataclass(frozen=True)
class Requirement:
    """One declared distribution: its name, version specifier and group (core or an extra)."""

    name: str
    specifier: str
    group: str


def parse_requirement(text: str) -> Requirement:
    """A ``Requires-Dist`` line: ``name[extras] specifier; extra == "group"``."""
    m = _REQUIREMENT.match(text)
    if m is None:
        raise ValueError(f"cannot read the requirement {text!r}")
    name, spec, marker = m.group(1), m.group(2).strip().strip("()"), m.group(3) or ""
    extra = _EXTRA.search(marker)
    return Requirement(name, spec.replace(" ", ""), extra.group(1) if extra else "core")


def declared() -> list[Requirement]:
    """securevfl's declared dependencies, from its installed metadata."""
    return [parse_requirement(r) for r in metadata.requires(PACKAGE) or []]


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.13.0+cpu`` -> (2, 13, 0))."""
    parts = []
    for piece in re.split(r"[.+!-]", version):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets every clause of ``specifier`` (``>=2.13,<2.14``),
    comparing numeric releases (enough for the declarations securevfl makes)."""
    have = _release(version)
    for clause in filter(None, specifier.split(",")):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"cannot read the version clause {clause!r}")
        op, want_text = m.groups()
        if want_text.endswith(".*"):
            prefix = _release(want_text[:-2])
            ok = have[: len(prefix)] == prefix
            if not (ok if op == "==" else not ok):
                return False
            continue
        want = _release(want_text)
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        if op == "~=":
            ok = a >= b and a[: len(want) - 1] == want[:-1]
        else:
            ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _import(name: str) -> None:
    if name == "crypten":
        import_crypten()
    else:
        importlib.import_module(IMPORT_NAMES.get(name, name.replace("-", "_")))


def check() -> list[str]:
    """One line per declared distribution of the core set and the installed
    extras (its version, or why it fails), then ``FAILED`` if any failed."""
    try:
        reqs = declared()
    except metadata.PackageNotFoundError:
        return [
            f"FAIL {PACKAGE} is not installed (pip install --no-deps -e .): its declared set is unknown",
            "FAILED",
        ]
    groups = {"core": True}
    for r in reqs:
        if r.group != "core" and _installed(r.name) is not None:
            groups[r.group] = True
    lines: list[str] = []
    failed = False
    for r in reqs:
        if r.group not in groups:
            continue
        label = f"{r.name} ({r.group})"
        version = _installed(r.name)
        if version is None:
            failed = True
            lines.append(f"FAIL {label}: not installed")
            continue
        if r.specifier and not satisfies(version, r.specifier):
            failed = True
            lines.append(f"FAIL {label}: {version} installed, {r.specifier} declared")
            continue
        if r.group == "core" or r.group in RUNTIME_EXTRAS:
            try:
                _import(r.name)
            except Exception as exc:  # report every failure, not only the first
                failed = True
                lines.append(f"FAIL {label}: {type(exc).__name__}: {exc}")
                continue
        lines.append(f"ok   {r.name} {version} ({r.group})")
    missing = sorted({r.group for r in reqs} - set(groups))
    if missing:
        lines.append(f"--   extras not installed: {', '.join(missing)}")
    if failed:
        lines.append("FAILED")
    return lines


def main() -> int:
    lines = check()
    print("\n".join(lines))
    return 1 if lines and lines[-1] == "FAILED" else 0


if __name__ == "__main__":
    sys.exit(main())
