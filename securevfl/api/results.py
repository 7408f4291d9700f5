"""The Python API's typed results: a run's record (:class:`RunResult`), a
prediction's (:class:`Prediction`), a comparison's (:class:`Comparison`, one
:class:`ComparisonRow` per compared protocol) and an attack's run again on a
finished run (:class:`AttackRerun`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from securevfl import jsonfile
from securevfl.app.predict import PredictionRecord, read_predictions
from securevfl.records import PartyPrivacy, ResultRecord
from securevfl.report.aggregate import RunRecord, Summary
from securevfl.report.stats import Interval


class RunResult(ResultRecord):
    """The result record of a finished run (``result.json``: metrics, privacy
    spent, attacks, bytes and time per step, every rank's ledger), every field
    typed, and the output folder it lies in (``folder``). The privacy each party
    spent: ``result.privacy_of("left").epsilon`` (and ``.delta``, ``.mechanisms``),
    ``result.privacy_report`` for the whole record typed; ``result.privacy`` is
    the mapping as written in result.json."""

    folder: Path

    def to_json(self) -> dict[str, Any]:
        """``result.json`` as written (without ``folder``): an infinity as the string
        ``"Infinity"``, a NaN as None (:mod:`securevfl.jsonfile`)."""
        out: dict[str, Any] = jsonfile.finite(self.model_dump(mode="json", exclude={"folder"}))
        return out


class Prediction(PredictionRecord):
    """What a finished prediction did (``prediction.json``: rows per party and
    aligned, bytes, time) and where its files are: ``folder``, ``path`` (the
    predictions file) and ``frame`` (that file as a pandas DataFrame: the ID
    column, then the task's columns)."""

    folder: Path

    @property
    def path(self) -> Path:
        """``predictions.csv``: one row per aligned record."""
        return self.folder / self.predictions

    @property
    def frame(self) -> pd.DataFrame:
        """The predictions, read from :attr:`path` (IDs kept as text, each cell as
        the run wrote it: :func:`~securevfl.app.predict.read_predictions`)."""
        return read_predictions(self.path)


@dataclass(frozen=True)
class AttackRerun:
    """An attack run again on a finished run's saved views (``securevfl attack``):
    its result key (``key``, as in ``result.json["attacks"]``), its entry
    (``metrics``: the attack's scores and what it used, as ``result.json`` would
    hold it) and the file it was written to (``path``, ``RUN/attacks/<key>.json``)."""

    key: str
    metrics: Mapping[str, Any]
    path: Path

    @property
    def score(self) -> Any:
        """The attack's headline score (its entry's ``ap``)."""
        return self.metrics.get("ap")


@dataclass(frozen=True)
class ComparisonRow:
    """One compared protocol (a protocol at one grid point) over its seeds, typed:
    its label (``protocol``), grid point, backend, defenses, dataset, seeds, every
    metric of the table as an :class:`~securevfl.report.stats.Interval` (mean,
    95% bounds, per-seed values; None where no run has it) and its runs' results.
    The privacy each party spent: ``row.privacy_of("left").epsilon``."""

    protocol: str
    point: dict[str, Any]
    backend: str
    defenses: str
    dataset: str
    seeds: tuple[int, ...]
    metrics: dict[str, Interval | None]
    results: tuple[RunResult, ...]

    def mean(self, metric: str) -> float | None:
        """A metric's mean over the seeds (``"test_accuracy"``, ``"attack:membership_inference"``)."""
        iv = self.metrics.get(metric)
        return None if iv is None else iv.mean

    @property
    def test_accuracy(self) -> float | None:
        return self.mean("test_accuracy")

    @property
    def privacy(self) -> dict[str, PartyPrivacy]:
        """Every party that spent privacy, at its largest epsilon over the seeds
        (the same for every seed unless a mechanism's accounting depends on the data)."""
        out: dict[str, PartyPrivacy] = {}
        for r in self.results:
            report = r.privacy_report
            for party, spent in (report.parties if report is not None else {}).items():
                if party not in out or spent.epsilon > out[party].epsilon:
                    out[party] = spent
        return out

    def privacy_of(self, party: str) -> PartyPrivacy | None:
        """``party``'s privacy (as :attr:`privacy`); None when it ran no DP
        mechanism; a name that is no party of these runs is refused."""
        for r in self.results:
            r.privacy_of(party)  # refuses a name that is no party
        return self.privacy.get(party)


@dataclass(frozen=True)
class Comparison:
    """A finished comparison: every run (``records``, one per protocol, grid point
    and seed), their summary over seeds (``summary``) and the files written to
    ``folder`` (``files``: compare.json, compare.csv, runs.csv, report.md and the
    figures, by kind)."""

    title: str
    folder: Path
    records: list[RunRecord]
    summary: Summary
    files: dict[str, Path]

    @cached_property
    def frame(self) -> pd.DataFrame:
        """One row per compared protocol (a protocol at one grid point): protocol,
        the grid's keys (their values at that point; absent without a grid),
        backend, defenses, dataset, n_seeds, then per metric its mean and the
        bounds of its 95% interval over seeds (``<metric>_lo``, ``<metric>_hi``),
        as in compare.csv."""
        rows = []
        for g in self.summary.groups:
            flat = g.flat()
            rows.append({"protocol": flat.pop("protocol"), **g.point, **flat})
        return pd.DataFrame(rows)

    @cached_property
    def runs_frame(self) -> pd.DataFrame:
        """One row per run (each seed of each compared protocol), as in runs.csv (the audit
        records the report's prose reads are in compare.json's runs, not here)."""
        return pd.DataFrame(
            [{k: v for k, v in r.items() if k not in ("grids", "measured")} for r in self.summary.runs]
        )

    def results(self) -> list[RunResult]:
        """Every run's result record, in run order."""
        return [run_result(r.result, Path(r.folder or self.folder)) for r in self.records]

    @cached_property
    def rows(self) -> list[ComparisonRow]:
        """The rows of :attr:`frame`, typed (:class:`ComparisonRow`), in the same order."""
        results = self.results()
        out = []
        for g in self.summary.groups:
            mine = tuple(res for rec, res in zip(self.records, results, strict=True) if rec.label == g.label)
            out.append(
                ComparisonRow(
                    protocol=g.label,
                    point=dict(g.point),
                    backend=g.text.get("backend") or "",
                    defenses=g.text.get("defenses") or "",
                    dataset=g.text.get("dataset") or "",
                    seeds=tuple(g.seeds),
                    metrics=dict(g.metrics),
                    results=mine,
                )
            )
        return out


def run_result(result: Mapping[str, Any], folder: Path) -> RunResult:
    """A run's ``result.json`` mapping, typed, with the folder it lies in."""
    return RunResult.model_validate({**result, "folder": Path(folder)})
