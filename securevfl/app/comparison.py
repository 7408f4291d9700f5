"""A comparison: which runs it holds (``securevfl compare``, and ``validate`` of a
comparison file). Which of them are already done, and running the rest, is
:mod:`securevfl.app.compare_runs`.

What is compared comes from protocol files (or folders of them) on the command
line, or from a comparison file (:class:`ComparisonFile`): each protocol, expanded
by its grid (:mod:`securevfl.app.grid`), runs once per seed. An axis applies to
the protocols whose file has the list element its key goes through: a sweep over
a defense's parameter leaves the undefended protocol compared with it unexpanded,
as the reference row (:func:`applicable`). The seed goes in as
``training.seed`` (the shared schedule and initialisation); protective noise keeps
drawing on each party's private entropy, as in any run.

The comparison folder is a cache: run ``r`` of seed ``s`` lives in
``OUT/<protocol>[/<grid point>]/seed<s>/`` with a marker file (:data:`MARKER`)
written only once the run and its attacks have finished, holding the protocol
digest and the SHA-256 of the ``result.json`` the run wrote. A run whose marker
and ``result.json`` carry the digest of the protocol now planned, and whose
``result.json`` is byte for byte the one the run wrote, is skipped; a changed
protocol, a missing marker (an interrupted or deleted run) or ``rerun`` runs it
again, replacing securevfl's own files there, and so does a ``result.json``
changed since (an edited metric never reaches the table), saying so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from securevfl.app.grid import Axis, check_axis, make_axis, missing_element, parse_axis, point_label, points
from securevfl.app.loader import (
    OWN,
    Allow,
    apply_override,
    load_checked,
    load_protocol,
    override_expr,
    parse_override,
)
from securevfl.app.yamldoc import load_yaml
from securevfl.components import CheckedProtocol
from securevfl.config import Protocol
from securevfl.config_errors import validation_error
from securevfl.errors import ConfigError

MARKER = "compare-run.json"


class Entry(BaseModel):
    """One protocol of a comparison file: the file (relative to the comparison
    file), its own ``--set`` overrides and its grid (key -> values)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    file: str
    overrides: list[str] = Field(default_factory=list, alias="set")
    grid: dict[str, list[Any]] = Field(default_factory=dict)


class ComparisonFile(BaseModel):
    """A comparison written down: ``comparison`` (its title) marks the file as one;
    ``seeds`` (default: each protocol's own seed), overrides for every protocol
    (``set``), and the protocols, each a file name or an :class:`Entry`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    comparison: str
    seeds: list[int] | None = None
    overrides: list[str] = Field(default_factory=list, alias="set")
    protocols: list[str | Entry] = Field(min_length=1)


@dataclass(frozen=True)
class Source:
    """A protocol file to expand: its overrides and grid axes."""

    path: Path
    overrides: tuple[str, ...] = ()
    axes: tuple[Axis, ...] = ()


@dataclass(frozen=True)
class Run:
    """One planned run: a protocol at one grid point and one seed."""

    label: str  # protocol name, plus "[grid point]"
    base: str  # protocol name
    point: dict[str, Any]  # grid key -> value
    seed: int
    checked: CheckedProtocol  # as the launcher runs it
    folder: Path

    @property
    def proto(self) -> Protocol:
        return self.checked.protocol

    @property
    def digest(self) -> str:
        return self.proto.digest()


@dataclass
class Plan:
    title: str
    runs: list[Run]
    axes: dict[str, list[str]] = field(default_factory=dict)  # protocol name -> grid keys


def read_comparison_file(path: Path) -> ComparisonFile | None:
    """The comparison file at ``path``, or None when it is a protocol file."""
    try:
        doc = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ConfigError):
        return None  # load_protocol reports what is wrong with it
    if not isinstance(doc, dict) or "comparison" not in doc:
        return None
    try:
        return ComparisonFile.model_validate(doc)
    except ValidationError as exc:
        raise validation_error(exc, source=str(path)) from None


def sources_from_args(
    files: list[str], overrides: list[str], grid: list[str]
) -> tuple[str, list[Source], list[int] | None]:
    """(title, sources, seeds from a comparison file) for the command line: files,
    folders of protocol files, or one comparison file. ``--set`` and ``--grid``
    apply to every protocol."""
    return sources_from_paths(files, overrides, [parse_axis(g) for g in grid])


def sources_from_paths(
    files: Sequence[str | Path], overrides: Sequence[str], axes: Sequence[Axis]
) -> tuple[str, list[Source], list[int] | None]:
    """:func:`sources_from_args` with the grid's axes already made."""
    axes = tuple(axes)
    overrides = list(overrides)
    found: list[Source] = []
    title, seeds = "securevfl compare", None
    for f in map(Path, files):
        paths = sorted(f.glob("*.yaml")) if f.is_dir() else [f]
        for p in paths:
            cf = read_comparison_file(p) if p.is_file() else None
            if cf is None:
                found.append(Source(p, tuple(overrides), axes))
                continue
            if f.is_dir():
                continue  # a folder stands for its protocol files only
            title, seeds = cf.comparison, cf.seeds
            for e in cf.protocols:
                entry = Entry(file=e) if isinstance(e, str) else e
                own = tuple(make_axis(k, v) for k, v in entry.grid.items())
                found.append(
                    Source(p.parent / entry.file, (*cf.overrides, *entry.overrides, *overrides), own + axes)
                )
    if not found:
        raise ConfigError(f"no protocol files in {', '.join(map(str, files))}", path="files")
    return title, found, seeds


def _doc(source: Source) -> dict[str, Any]:
    """The protocol document with its overrides, for the grid's kind checks (the
    loader reports anything else wrong with the file)."""
    try:
        doc = load_yaml(source.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ConfigError):
        doc = None
    if not isinstance(doc, dict):
        load_protocol(source.path, list(source.overrides), allow=OWN)  # raises the loader's error
        raise ConfigError("a protocol file must be a YAML mapping", source=str(source.path))
    for expr in source.overrides:
        apply_override(doc, *parse_override(expr))
    return doc


SAFE = re.compile(r"[^A-Za-z0-9_.=,+-]")
#: the longest folder name a protocol name or grid point gets (file systems allow 255 bytes)
MAX_FOLDER_NAME = 96


def folder_name(text: str) -> str:
    """The folder of a protocol name or a grid point: ``text`` itself where it is
    a short, plain name; else its characters outside :data:`SAFE` replaced by
    ``_``, cut to :data:`MAX_FOLDER_NAME`, and a digest of ``text`` added, so that
    distinct names (``a b``, ``a_b``, ``a/b``) never share a folder (nor a result)
    and no name reaches past the file system's limit or out of its parent
    (``..``)."""
    safe = SAFE.sub("_", text)
    if safe == text and 0 < len(text) <= MAX_FOLDER_NAME and not text.startswith("."):
        return text
    tag = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe[:MAX_FOLDER_NAME]}~{tag}"


MAX_RUNS = 10_000
"""The most runs one comparison holds (protocols x grid points x seeds): beyond
it a grid is more likely a mistake (an axis too many) than a plan, and its
points alone would take long to validate; split such a study into several
comparisons."""


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def count_runs(sources: list[Source], seeds: list[int] | None) -> tuple[int, int]:
    """(grid points over every protocol, runs) of a comparison, counted from the
    axes' lengths without expanding them."""
    n_points = sum(math.prod(len(a.values) for a in src.axes) for src in sources)
    return n_points, n_points * (len(seeds) if seeds is not None else 1)


def applicable(sources: list[Source]) -> list[tuple[Source, list[tuple[Axis, str]]]]:
    """Each source with only the grid axes that apply to it, and the axes it lost,
    each with the list element its file lacks (:func:`~securevfl.app.grid.missing_element`).
    An axis that applies to no source is kept on every one, so that loading the
    points names the missing element as for a single protocol."""
    lacks: list[dict[str, str]] = []
    for src in sources:
        doc = _doc(src) if src.axes else {}
        lacks.append({a.key: m for a in src.axes if (m := missing_element(doc, a.path)) is not None})
    somewhere = {
        a.key for src, lack in zip(sources, lacks, strict=True) for a in src.axes if a.key not in lack
    }
    out = []
    for src, lack in zip(sources, lacks, strict=True):
        dropped = [(a, lack[a.key]) for a in src.axes if a.key in lack and a.key in somewhere]
        kept = tuple(a for a in src.axes if a.key not in lack or a.key not in somewhere)
        out.append((dataclasses.replace(src, axes=kept) if dropped else src, dropped))
    return out


def _unexpanded(proto: Protocol, dropped: list[tuple[Axis, str]], expanded: bool) -> str:
    """What the plan says of a protocol some grid axes do not apply to."""
    keys = ", ".join(f"'{a.key}' (it has no {where})" for a, where in dropped)
    parties = [proto.parties.active, *proto.parties.passive]
    if expanded:
        then = "it is expanded by the other axes only"
    elif any(p.defenses for p in parties):
        then = "it runs once, unexpanded"
    else:
        then = "it runs once, as the undefended reference row the defended rows are measured against"
    return f"{proto.name}: the grid's {keys} does not apply to it; {then}"


def plan(
    title: str,
    sources: list[Source],
    seeds: list[int] | None,
    out: Path,
    *,
    say: Callable[[str], None] | None = None,
    allow: Allow = OWN,
) -> Plan:
    """Every run of the comparison, each protocol validated at every grid point
    before anything runs. With a grid, its size is said first (``say``, default
    stderr): validating a large one takes a while. An empty list of seeds and
    more than :data:`MAX_RUNS` runs are refused. ``allow``: the user code the
    protocols may import (:func:`~securevfl.app.loader.load_protocol`; default:
    each file's own, as the local launcher that runs them allows)."""
    if seeds is not None and not seeds:
        raise ConfigError("give at least one seed (an empty list would run nothing)", path="--seeds")
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds repeat: {seeds}", path="--seeds")
    narrowed = applicable(sources)
    sources = [src for src, _ in narrowed]
    n_points, n_runs = count_runs(sources, seeds)
    gridded = any(src.axes for src in sources)
    size = (
        f"{n_runs:,} runs ({_count(n_points, 'protocol and grid point')} x "
        + (_count(len(seeds), "seed") if seeds is not None else "each protocol's own seed")
        + ")"
    )
    if n_runs > MAX_RUNS:
        raise ConfigError(
            f"the comparison holds {size}; one comparison holds at most {MAX_RUNS:,} runs: use fewer grid "
            "values or seeds, or split it into several comparisons",
            path="--grid" if gridded else "--seeds",
        )
    if gridded:
        (say or say_stderr)(f"{title}: {size}; validating every point before any runs")
    runs: list[Run] = []
    axes_of: dict[str, list[str]] = {}
    for src, dropped in narrowed:
        doc = _doc(src)
        for axis in src.axes:
            check_axis(doc, axis, source=str(src.path))
        for i, pt in enumerate(points(list(src.axes))):
            label_pt = point_label(pt)
            sets = [override_expr(a.key, v) for a, v in pt]
            try:
                checked = load_checked(src.path, [*src.overrides, *sets], allow=allow)
                base = checked.protocol
            except ConfigError as exc:
                if pt:
                    exc.args = (f"{exc} (grid point {label_pt})",)
                raise
            axes_of[base.name] = [a.key for a in src.axes]
            if dropped and i == 0:
                (say or say_stderr)(_unexpanded(base, dropped, bool(src.axes)))
            for seed in seeds if seeds is not None else [base.training.seed]:
                seeded = (
                    checked
                    if seeds is None
                    else load_checked(src.path, [*src.overrides, *sets, f"training.seed={seed}"], allow=allow)
                )
                folder = out / folder_name(base.name)
                if pt:
                    folder = folder / folder_name(label_pt)
                runs.append(
                    Run(
                        label=f"{base.name}[{label_pt}]" if pt else base.name,
                        base=base.name,
                        point={a.key: v for a, v in pt},
                        seed=seed,
                        checked=seeded,
                        folder=folder / f"seed{seed}",
                    )
                )
    seen: dict[tuple[str, int], Run] = {}
    where: dict[Path, Run] = {}
    for r in runs:
        if (r.label, r.seed) in seen:
            raise ConfigError(
                f"two protocols are both named '{r.base}' (grid point and seed alike): "
                "protocol names must be distinct to compare them",
                path="name",
            )
        seen[(r.label, r.seed)] = r
        if r.folder in where:  # distinct names get distinct folders (folder_name): never reached
            raise ConfigError(
                f"runs {where[r.folder].label} and {r.label} would share the folder {r.folder}",
                path="--grid",
            )
        where[r.folder] = r
    return Plan(title, runs, axes_of)


def say_stderr(msg: str) -> None:
    """Progress of a comparison, on standard error."""
    print(msg, file=sys.stderr, flush=True)
