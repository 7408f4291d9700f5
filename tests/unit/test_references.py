"""Every cross-reference in securevfl's code and documents points inside the repository.

Scanned: ``securevfl/`` (every ``.py``), ``docs/`` (every ``.md``), README.md and SECURITY.md.

* A ``§`` reference names a section: ``docs/design.md §4``, ``SECURITY.md §4a``,
  ``docs/methods/crdp-fl.md §2.5(e)``, ``§2.2-2.4`` (both ends), ``[SECURITY.md](SECURITY.md) §7``.
  The document is the one named right before the ``§``; a bare ``§N`` means the document
  named last before it in the same paragraph, else the document it stands in (when that
  has numbered headings), else the document named last above it in the file, and the
  first of these that has a heading numbered N is taken. A section resolves when the
  document has a heading that starts with its number (``## 4a. ...``, ``### 2.5 ...``); a
  letter suffix ``(e)`` is an item of that section. ``RFC NNNN §x`` cites a published
  standard and is not checked.
* A quoted heading after a document (``README, "Prediction"``) names a heading of it.
* A relative link in README.md or docs/ names a file that exists, and its ``#anchor`` (if
  any) a heading of that file (GitHub's slugs).
* A Sphinx role naming something of securevfl by its dotted path (``:mod:`securevfl.csprng```,
  ``:class:`~securevfl.csprng.SecretStream```) names a module of the package: the whole
  path for ``:mod:``, else the path less its last part (a name in the module) or, after
  a capitalized part (a class), its last two (a member of the class).
* Nothing names a document outside the repository (``../shared``, ``shared/DESIGN``,
  ``specs/0..``, ``specs/anchors-``) or an issue (``issue #N``).

New documents and sections need no change here: every ``.md`` file of the repository can
be named, and its headings are read when the test runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("securevfl", "docs", "README.md", "SECURITY.md")
LINKED = ("README.md", "docs")

#: a document named in prose: a path to a markdown file, a link, a published standard,
#: or a name that no longer resolves (a design or spec file outside the repository)
MENTION = re.compile(
    r"\[[^\]\n]*\]\((?P<link>[^)\s#]+\.md)(?:#[^)\s]*)?\)"
    r"|(?P<path>(?<![\w/.-])(?:\.\./|\./)*(?:[\w-]+/)*[\w.-]+\.md)\b"
    r"|(?P<readme>\bREADME\b(?!\.md))"
    r"|(?P<external>\bRFC\s?\d+)"
    r"|(?P<legacy>\bDESIGN\b|\b[Ss]pecs?\s\d{3}\b|\b[Ss]pec(?:'s)?(?:\s+own)?(?=\s+§)|\banchors-[\w-]+"
    r"|\b[Ii]ssue\s+#?\d+)"
)
#: what may stand between a document and its "§": "docs/design.md §4", "SECURITY.md's §3",
#: "the spec's own §8.2", "docs/design.md\n        §12"
JOINER = re.compile(r"^(?:'s)?(?:\s+own)?,?\s*$")
SECTION = re.compile(
    r"§\s?(?P<sec>\d+[a-z]?(?:\.\d+)*)(?:\([a-z]\))?"  # §2.5, §4a, §2.5(e): item (e) of §2.5
    r"(?:\s?[-\u2013]\s?(?P<end>\d+[a-z]?(?:\.\d+)*))?"  # a range: §2.2-2.4
)
NUMBERED = re.compile(r"^#{1,6}\s+(?:Appendix\s+)?(?P<num>\d+[a-z]?(?:\.\d+)*)\.?(?:\s|$)")
QUOTED = re.compile(
    r"(?P<doc>\bREADME(?:\.md)?|(?<![\w/.-])(?:[\w-]+/)*[\w.-]+\.md),?\s+\"(?P<heading>[^\"\n]+)\""
)
LINK = re.compile(r"!?\[[^\]\n]*\]\((?P<target>[^)\s]+)\)")
OUTSIDE = re.compile(r"\.\./shared|shared/DESIGN|\bspecs/0\d|\bspecs/anchors-")
ISSUE = re.compile(r"\b[Ii]ssue\s+#?\d+\b")
BLANK = re.compile(r"\n[ \t#]*\n")
NO_NUMBER = re.compile(r"§(?!\s?\d)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
ROLE = re.compile(r":(?P<role>mod|class|func|meth|attr|data|exc):`~?(?P<name>securevfl(?:\.\w+)+)`")


@dataclass
class Doc:
    """A markdown document's headings: their numbers, texts and GitHub anchors."""

    numbers: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    anchors: set[str] = field(default_factory=set)


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", text.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def doc(path: Path) -> Doc | None:
    """The headings of a markdown file (fenced code skipped), or None if it does not exist."""
    if not path.is_file() or path.suffix != ".md":
        return None
    out = Doc()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"^#{1,6}\s", line):
            continue
        text = line.lstrip("#").strip()
        out.texts.append(text)
        if m := NUMBERED.match(line):
            out.numbers.add(m.group("num"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.anchors.add(base if n == 0 else f"{base}-{n}")
    return out


def resolve_path(name: str, source: Path) -> Path | None:
    """A document named in ``source``: relative to the repository root, else to the file."""
    for base in (ROOT, source.parent):
        p = (base / name).resolve()
        if p.is_file() and ROOT in p.parents:
            return p
    return None


@dataclass
class Mention:
    start: int
    end: int
    kind: str  # "doc" (a markdown file here), "missing", "external", "legacy"
    name: str
    path: Path | None = None

    @property
    def sectioned(self) -> bool:
        d = doc(self.path) if self.path else None
        return self.kind in ("external", "legacy", "missing") or bool(d and d.numbers)


def mentions(text: str, source: Path) -> list[Mention]:
    out: list[Mention] = []
    for m in MENTION.finditer(text):
        name = m.group(m.lastgroup or 0)
        if m.lastgroup in ("link", "path", "readme"):
            path = resolve_path("README.md" if m.lastgroup == "readme" else name, source)
            out.append(Mention(m.start(), m.end(), "doc" if path else "missing", name, path))
        else:
            out.append(Mention(m.start(), m.end(), m.lastgroup or "legacy", name))
    return out


def paragraph_start(text: str, pos: int) -> int:
    """Where the paragraph holding ``pos`` begins (after the last blank or comment-only line)."""
    blank = None
    for m in BLANK.finditer(text, 0, pos):
        blank = m
    return blank.end() if blank else 0


def has_section(target: Mention, sec: str, end: str | None) -> bool:
    if target.kind == "external":
        return True
    d = doc(target.path) if target.kind == "doc" and target.path else None
    return bool(d) and sec in d.numbers and (end is None or end in d.numbers)


def check_sections(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    found = mentions(text, path)
    own = doc(path) if path.suffix == ".md" else None
    me = Mention(0, 0, "doc", path.name, path) if own and own.numbers else None
    for m in SECTION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        context = text[max(0, m.start() - 40) : m.end()].split("\n")[-1]
        where = f"{path.relative_to(ROOT)}:{line}: {context!r}"
        sec, end = m.group("sec"), m.group("end")
        before = [x for x in found if x.end <= m.start()]
        named = before[-1] if before and JOINER.match(text[before[-1].end : m.start()]) else None
        if named is not None:
            candidates = [named]
        else:
            para = paragraph_start(text, m.start())
            candidates = [x for x in reversed(before) if x.start >= para and x.sectioned][:1]
            if me is not None:
                candidates.append(me)
            earlier = [x for x in reversed(before) if x.sectioned and x.kind in ("doc", "missing")][:1]
            candidates += [x for x in earlier if x not in candidates]
        if not candidates:
            problems.append(f"{where} -> names no document, and none is named above it")
            continue
        if any(has_section(c, sec, end) for c in candidates):
            continue
        first = candidates[0]
        if first.kind == "legacy":
            why = f"'{first.name}' is not a document in the repository"
        elif first.kind == "missing":
            why = f"{first.name} does not exist"
        else:
            shown = ", ".join(c.name for c in candidates)
            why = f"no heading numbered {sec}{'-' + end if end else ''} in {shown}"
        problems.append(f"{where} -> {why}")
    for m in NO_NUMBER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        problems.append(f"{path.relative_to(ROOT)}:{line}: '§' -> no section number after it")
    return problems


def check_quoted(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    for m in QUOTED.finditer(text):
        name = "README.md" if m.group("doc").startswith("README") else m.group("doc")
        target = resolve_path(name, path)
        d = doc(target) if target else None
        wanted = m.group("heading").strip().lower()
        if d is not None and any(wanted in t.lower() for t in d.texts):
            continue
        line = text.count("\n", 0, m.start()) + 1
        problems.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r} -> no such heading in {name}")
    return problems


def check_links(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        line = INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)
        for m in LINK.finditer(line):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            where = f"{path.relative_to(ROOT)}:{i}: ({target})"
            if not dest.exists() or ROOT not in [dest, *dest.parents]:
                problems.append(f"{where} -> no file {name}")
            elif anchor:
                d = doc(dest)
                if d is None or anchor not in d.anchors:
                    shown = dest.relative_to(ROOT)
                    problems.append(f"{where} -> no heading with anchor #{anchor} in {shown}")
    return problems


def check_outside(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    for pattern, why in ((OUTSIDE, "a file outside the repository"), (ISSUE, "an issue, not a document")):
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r} -> refers to {why}")
    return problems


def is_module(parts: list[str]) -> bool:
    p = ROOT.joinpath(*parts)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def check_modules(path: Path, text: str) -> list[str]:
    problems: list[str] = []
    for m in ROLE.finditer(text):
        parts = m.group("name").split(".")
        if m.group("role") == "mod":
            ok = is_module(parts)
        else:  # a name in a module, or a class's member (the class capitalized)
            ok = is_module(parts[:-1]) or (parts[-2][:1].isupper() and is_module(parts[:-2]))
        if ok:
            continue
        line = text.count("\n", 0, m.start()) + 1
        problems.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r} -> no such module in securevfl")
    return problems


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        p = ROOT / name
        if p.is_file():
            files.append(p)
        else:
            files += sorted(p.rglob("*.py" if name == "securevfl" else "*.md"))
    return files


def report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


def test_every_section_reference_resolves() -> None:
    problems: list[str] = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8")
        problems += check_sections(path, text) + check_quoted(path, text)
    assert not problems, report(problems, "unresolved references")


def test_every_relative_link_resolves() -> None:
    problems: list[str] = []
    for name in LINKED:
        p = ROOT / name
        for path in [p] if p.is_file() else sorted(p.rglob("*.md")):
            problems += check_links(path, path.read_text(encoding="utf-8"))
    assert not problems, report(problems, "broken links")


def test_every_module_reference_resolves() -> None:
    problems: list[str] = []
    for path in scanned_files():
        problems += check_modules(path, path.read_text(encoding="utf-8"))
    assert not problems, report(problems, "references to modules that do not exist")


def test_nothing_refers_outside_the_repository() -> None:
    problems: list[str] = []
    for path in scanned_files():
        problems += check_outside(path, path.read_text(encoding="utf-8"))
    assert not problems, report(problems, "references outside the repository")


# -- the checker itself, on text with known answers ----------------------------------------
# reference-check: fixtures (the strings below are meant not to resolve; keep them as they are)


def test_the_checker_finds_what_does_not_resolve(tmp_path: Path) -> None:
    source = ROOT / "securevfl" / "example.py"  # a name for messages; never written
    good = (
        "SECURITY.md §4a; docs/methods/crdp-fl.md §2.5(e), §2.3-2.6; RFC 9380 §8.5 and §6.7.1;\n"
        "docs/design.md §4.\n\nA bare §12 means the document named last above it, the design page."
    )
    assert check_sections(source, good) == []
    assert check_sections(source, "A bare §2 with no document anywhere above it.") != []
    assert check_sections(source, "docs/methods/crdp-fl.md §2.9 and §2.2-2.99") != []
    bad = "DESIGN §4; docs/design.md §99; docs/nowhere.md §1; spec 003 §2.5"
    problems = check_sections(source, bad)
    assert len(problems) == 4, problems
    assert "securevfl/example.py:1:" in problems[0] and "'DESIGN' is not a document" in problems[0]
    assert "no heading numbered 99" in problems[1]
    assert "docs/nowhere.md does not exist" in problems[2]
    assert check_outside(source, "see ../shared/DESIGN.md and issue #18") != []
    assert check_quoted(source, 'README, "Prediction"') == []
    assert check_quoted(source, 'README, "No such heading anywhere"') != []
    page = ROOT / "docs" / "example.md"
    assert check_links(page, "[design](design.md#4-exchange-backends-what-each-party-learns)") == []
    assert check_links(page, "[design](design.md#no-such-anchor) [x](missing.md)") != []
    assert slug("The comparison (`make demo`)") == "the-comparison-make-demo"
    known = (
        ":mod:`securevfl.csprng`, :class:`~securevfl.csprng.SecretStream`, "
        ":meth:`securevfl.csprng.SecretStream.child`"
    )
    assert check_modules(source, known) == []
    missing = (
        ":mod:`securevfl.privacy.sampling`; :func:`securevfl.privacy.sampling.snap`; "
        ":mod:`securevfl.csprng.SecretStream`"
    )
    assert len(check_modules(source, missing)) == 3
