"""Federated prediction: ``securevfl predict RUN_DIR --out DIR`` (every rank
locally) and ``securevfl party FILE --rank R --predict RUN_DIR`` (one rank, one
organization), docs/design.md §12.

Every rank runs the same pipeline as in training (:func:`securevfl.app.rank.run_rank`:
rendezvous, start-up checks, watchdog), with the phase :class:`Predict`, whose
purpose ``predict`` goes in its hello, so a rank started to train cannot join a
prediction. Each party rank

1. loads its own saved final model from RUN_DIR (its rank's folder only; see
   :mod:`securevfl.app.model_io`) and checks that it was trained under this
   protocol (digest);
2. reads its own file of new records: the file its party entry names, or the one
   given with ``--data PARTY=PATH``; only its ID column and the raw columns its
   model was trained on are used (the active party's labels are not needed);
3. aligns the new IDs with the same DH-PSI as training
   (:mod:`securevfl.data.alignment`), so passive parties learn the aligned ID
   list and nothing else about the others' records;
4. applies its saved, fitted preprocessing (never refitted on new records);
5. runs the evaluation forward of the same exchange backend
   (:mod:`securevfl.parties.predict`): under ``mpc``, ``ckks`` and ``paillier`` the
   active party still never sees an embedding;

and the active party writes ``DIR/predictions.csv`` (ID, then the task's columns:
:meth:`~securevfl.parties.tasks.Task.prediction_columns`) and ``DIR/prediction.json``.
Helper ranks (CrypTen's dealer) serve as in training.

Predictions spend privacy (docs/privacy.md): each one is a fresh noisy release of
the predicted records through every defense that adds noise at evaluation. Each
party rank prices its prediction from the protocol, composes it with the earlier
predictions of its saved model (its ledger, :mod:`securevfl.app.prediction_ledger`)
and refuses, before it joins any peer, a prediction that would exceed its
``prediction_budget``; the local launcher checks every party's before any rank
starts. ``prediction.json`` and the command give each party's figure and total.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict

from securevfl import jsonfile
from securevfl.app import prediction_ledger
from securevfl.app.checkpoints import load_model
from securevfl.app.failures import ended_unreported, explain_failure
from securevfl.app.launcher import start_ranks, watch_ranks
from securevfl.app.model_io import PartyModel, load_party_model, run_protocol
from securevfl.app.outdir import OutputFolder, holds_training_run
from securevfl.app.rank import Phase, RankSetup
from securevfl.app.rank_layout import layout_of
from securevfl.app.threads import rank_threads
from securevfl.components import CheckedProtocol
from securevfl.config import CsvSource, Protocol
from securevfl.csvfile import read_rows, typed, write_rows
from securevfl.data.alignment import align_active, align_passive
from securevfl.data.partition import is_builtin, is_materialized, materialize, party_source
from securevfl.data.party_data import PartyData, load_new_records
from securevfl.defenses.spending import prediction_mechanisms
from securevfl.errors import ConfigError, SecureVFLError
from securevfl.parties.predict import ActivePredictor
from securevfl.privacy.prediction_budget import PredictionSpend
from securevfl.records import OwnView, RankSummary
from securevfl.regular_files import what_is
from securevfl.report.result import RESULT_FILE
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout, Role

PREDICTIONS_FILE = "predictions.csv"
RECORD_FILE = "prediction.json"
PURPOSE = "predict"


class PredictionRecord(BaseModel):
    """``prediction.json``: what one prediction did, as the active rank assembles it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    protocol: str
    digest: str
    backend: str
    task: str
    positive_class: str | None = None  # a binary task's: the class `score` is the probability of
    rows: dict[str, int]  # per party: records in its file; "aligned": rows predicted
    predictions: str  # the file, relative to the output folder
    ledger: dict[str, Any]  # bytes and messages per rank, as the ranks counted them
    phase_s: dict[str, dict[str, float]]
    wall_time_s: float
    # per party whose defenses release at prediction: this prediction's (eps, delta), its
    # releases, the running total over every prediction of that party's saved model, its budget
    privacy: dict[str, Any] = {}


# -- --data PARTY=PATH ------------------------------------------------------------------------
def parse_data_overrides(items: list[str], proto: Protocol) -> dict[str, Path]:
    """``--data PARTY=PATH`` (repeatable): the file of new records of a party, by
    its protocol name. Unknown parties, repeated parties and missing files are
    refused here, before any rank starts."""
    names = [proto.parties.active.name, *(p.name for p in proto.parties.passive)]
    out: dict[str, Path] = {}
    for item in items:
        party, sep, raw = item.partition("=")
        if not sep or not party or not raw:
            raise ConfigError(f"'{item}' must look like PARTY=PATH", path="--data")
        if party not in names:
            raise ConfigError(
                f"'{party}' is not a party of protocol '{proto.name}' (its parties: {', '.join(names)})",
                path="--data",
            )
        if party in out:
            raise ConfigError(f"party '{party}' is given twice", path="--data")
        path = Path(raw).expanduser()
        kind = what_is(path)
        if kind is not None:  # /dev/zero would read without end, a named pipe block
            raise ConfigError(f"party '{party}': {path} is {kind}, not a CSV file", path="--data")
        if not path.is_file():
            raise ConfigError(f"party '{party}': no file at {path}", path="--data")
        out[party] = path.resolve()
    return out


def records_source(proto: Protocol, party: str, data_dir: Path, override: Path | None) -> CsvSource:
    """Where a party reads its new records: the ``--data`` file, with the ID
    column its party entry names, or the file that entry names."""
    source = party_source(proto, party, data_dir)
    if override is None:
        return source
    return source.model_copy(update={"path": str(override)})


def check_out(out: Path, run_dir: Path) -> None:
    """The prediction's output folder may not hold a training run, this one or
    any other, with or without ``--overwrite``: replacing securevfl's files there
    would delete the run's result, its saved models and its checkpoints. Nor may
    it lie inside the training run's folder (its ``ranks/`` or ``data/``, say),
    where the prediction's files would mix with the run's."""
    here, run = Path(out).resolve(), Path(run_dir).resolve()
    if here == run:
        raise ConfigError(
            f"{out} is the training run's folder: write the predictions to another folder", path="--out"
        )
    if here.is_relative_to(run):
        raise ConfigError(
            f"{out} lies inside the training run's folder {run_dir}: write the predictions to a folder "
            "outside it",
            path="--out",
        )
    found = holds_training_run(Path(out))
    if found:
        raise ConfigError(
            f"{out} holds a training run ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}): "
            "write the predictions to another folder (--overwrite never replaces a training run)",
            path="--out",
        )


def check_budgets(checked: CheckedProtocol, run_dir: Path) -> None:
    """Every party's prediction priced against its ledger in ``run_dir`` and its
    ``prediction_budget``: the first party over its budget is refused (exit code
    2), before any rank starts and before anything is written. The ranks check
    again (their own, under a lock) before they join any peer."""
    proto = checked.protocol
    mechanisms = prediction_mechanisms(checked)
    for role in layout_of(checked).roles:
        if role.kind != "helper":
            spec = proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]
            prediction_ledger.price(proto, role, spec, mechanisms[spec.name], run_dir)


# -- the predictions file ---------------------------------------------------------------------
def predictions_frame(id_column: str, ids: list[str], columns: dict[str, list[Any]]) -> pd.DataFrame:
    """``predictions.csv`` as a table: the ID column (named as in the active
    party's file), then the task's columns."""
    frame = pd.DataFrame({id_column: ids})
    for name, values in columns.items():
        frame[name] = values
    return frame


def write_predictions(path: Path, frame: pd.DataFrame) -> None:
    """Write the table atomically; floats at full precision (``repr``), so a
    score read back is the score computed. IDs and class labels are the parties'
    data: every text cell that a spreadsheet would run as a formula is guarded,
    and cells are quoted as RFC 4180 says (:mod:`securevfl.csvfile`), so
    :func:`read_predictions` reads back exactly what was written."""
    columns = [frame[c].tolist() for c in frame.columns]
    write_rows(path, [str(c) for c in frame.columns], zip(*columns, strict=True))


def read_predictions(path: Path) -> pd.DataFrame:
    """``predictions.csv`` as :func:`write_predictions` wrote it: guards removed,
    the ID column (the first) as text, the task's columns as numbers where every
    cell is one (a class column of text labels stays text)."""
    header, rows = read_rows(Path(path))
    cells = [[row[i] for row in rows] for i in range(len(header))]
    frame = pd.DataFrame({i: pd.Series(col if i == 0 else typed(col)) for i, col in enumerate(cells)})
    frame.columns = pd.Index(header)
    return frame


# -- one rank -----------------------------------------------------------------------------------
def _align(channel: Channel, layout: Layout, role: Role, data: PartyData) -> tuple[PartyData, np.ndarray]:
    """The party's records in the agreed order of the IDs every party holds (the
    same DH-PSI as training), and their row positions in its file."""
    channel.phase = "psi"
    if role.kind == "active":
        order = align_active(channel, layout, data.ids)
    else:
        order = align_passive(channel, layout, role.rank, data.ids)
    channel.phase = "setup"
    return data.take(order), order


@dataclass
class Predict(Phase):
    """Predict with the model trained in ``run_dir``, writing into ``out_dir``;
    ``data_dir``: where built-in datasets' party files lie; ``data``: this party's
    file of new records (default: its protocol entry's). The rank's saved model is
    loaded and checked before its session starts (:meth:`before_start`)."""

    purpose: ClassVar[str] = PURPOSE
    files: ClassVar[str] = "predict_"

    run_dir: Path
    out_dir: Path
    data_dir: Path
    data: Path | None = None
    model: PartyModel | None = field(default=None, repr=False)  # this rank's, once loaded
    spend: PredictionSpend | None = field(default=None, repr=False)  # this prediction, priced
    ledger: prediction_ledger.Ledger | None = field(default=None, repr=False)  # the earlier ones
    _unlock: weakref.finalize | None = field(default=None, repr=False)  # the model folder's lock

    def before_start(self, setup: RankSetup) -> None:
        if setup.role.kind != "helper":  # checked before start-up: a bad model fails here at once
            with setup.clock.phase("load"):
                proto = setup.proto
                self.model = load_party_model(
                    setup.checked, setup.role, self.run_dir, torch.device(proto.training.device)
                )
                self._price(proto, setup.role)

    def _price(self, proto: Protocol, role: Role) -> None:
        """This party's prediction priced and checked against its budget before
        the rank joins any peer; a prediction that releases something priced holds
        the model folder's lock until its ledger entry is written (or the rank ends)."""
        model = self.model
        assert model is not None
        mechanisms = model.stack.prediction_mechanisms()
        if any(r.count for m in mechanisms for r in m.releases):
            self._unlock = weakref.finalize(self, os.close, prediction_ledger.hold(self.run_dir, role.rank))
        self.spend, self.ledger = prediction_ledger.price(proto, role, model.spec, mechanisms, self.run_dir)

    def _record(self, rows: int, summary: dict[str, Any]) -> None:
        """Add this prediction to the party's ledger (once it has begun releasing:
        what was sent is spent even if the prediction then fails) and put the
        party's figures in its summary for ``prediction.json``."""
        spend, ledger, model = self.spend, self.ledger, self.model
        if spend is None or ledger is None or model is None or not spend.spends:
            return
        prediction_ledger.record(self.run_dir, model.role.rank, ledger, spend, rows)
        summary["prediction_privacy"] = spend.report(prediction_ledger.budget_of(model.spec))

    def keep_views(self, proto: Protocol) -> bool:
        return proto.runtime.record_views and proto.runtime.dump_views

    def helper(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        setup.backend.helper(setup.wired[2]).serve()
        self._save_view(setup, OwnView({}), summary)

    def party(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        model, role, clock = self.model, setup.role, setup.clock
        assert model is not None
        _, channel, ctx = setup.wired
        with clock.phase("data"):  # all of the party's own file, checked before any message
            source = records_source(setup.proto, role.party, self.data_dir, self.data)
            records = load_new_records(source, role.party, model.inputs, preprocess=model.spec.preprocess)
            x_all = model.features(records)
        with clock.phase("alignment"):
            aligned, order = _align(channel, setup.layout, role, records)
        with clock.phase("setup"):
            x = torch.as_tensor(x_all[order])
            predictor = model.predictor(setup.backend, ctx, keep_sent=self.keep_views(setup.proto))
        channel.phase = "eval"  # an evaluation pass (the ledger and CrypTen know these phases)
        try:
            with clock.phase("prediction"):
                if isinstance(predictor, ActivePredictor):
                    scores = predictor.predict(x, len(aligned.ids))
                else:
                    predictor.contribute(x)
        finally:  # the rows went out (or some did): the prediction is spent
            self._record(len(aligned.ids), summary)
            if self._unlock is not None:
                self._unlock()
        predictor.exchange.close()
        if isinstance(predictor, ActivePredictor):
            columns = predictor.task.prediction_columns(scores)
            frame = predictions_frame(source.id_column, aligned.ids, columns)
            write_predictions(self.out_dir / PREDICTIONS_FILE, frame)
            summary["task"] = predictor.task.name
            summary["positive_class"] = predictor.task.positive_class
        summary["n_aligned"] = len(aligned.ids)
        summary["aligned_digest"] = hashlib.sha256("\n".join(aligned.ids).encode()).hexdigest()[:16]
        summary["loaded_columns"] = list(model.inputs)
        summary["has_labels"] = False
        summary["n_records"] = len(records.ids)
        kept = {"embeddings": getattr(predictor, "sent", []), "z": getattr(predictor, "revealed_z", [])}
        self._save_view(setup, OwnView(kept), summary)

    def _save_view(self, setup: RankSetup, own: OwnView, summary: dict[str, Any]) -> None:
        """Under ``runtime.dump_views``, this rank's view of the prediction."""
        if self.keep_views(setup.proto):
            view = setup.save_view(own, "predict_view")
            summary["view_tags"] = sorted(view.received)

    def conclude(self, setup: RankSetup, parts: list[RankSummary], started: float) -> None:
        proto = setup.proto
        rows = {p.party: int(p.n_records or 0) for p in parts if p.role != "helper"}
        rows["aligned"] = int(parts[0].n_aligned or 0)
        record = PredictionRecord(
            protocol=proto.name,
            digest=proto.digest(),
            backend=proto.exchange.backend,
            task=str(parts[0].task or proto.task or "inferred at training"),
            positive_class=parts[0].positive_class,
            rows=rows,
            predictions=PREDICTIONS_FILE,
            ledger={str(p.rank): p.ledger or {} for p in parts},
            phase_s={str(p.rank): dict(p.phase_s or {}) for p in parts},
            wall_time_s=time.time() - started,
            privacy={p.party: p.prediction_privacy for p in parts if p.prediction_privacy},
        )
        (self.out_dir / RECORD_FILE).write_text(jsonfile.dumps(record.model_dump(mode="json"), indent=1))


# -- every rank locally -----------------------------------------------------------------------
def check_finished(run_dir: Path, proto: Protocol) -> None:
    """Refuse the models of a training run that did not finish: every rank saves
    its model before rank 0 writes ``result.json``, so a run that failed after that
    (a full disk as rank 0 wrote its result, a rank that died at the end) leaves
    verified models without one. A run finished when ``result.json`` is there, reads
    as a result and names the protocol the models were saved under."""
    path = run_dir / RESULT_FILE
    why = None
    try:
        doc = jsonfile.loads(path.read_bytes())
    except FileNotFoundError:
        why = f"holds no {RESULT_FILE}"
    except (OSError, ValueError) as exc:
        why = f"holds a {RESULT_FILE} that cannot be read ({type(exc).__name__})"
    else:
        digest = doc.get("digest") if isinstance(doc, dict) else None
        if not isinstance(digest, str):
            why = f"holds a {RESULT_FILE} that is not a run's result"
        elif (mismatch := proto.digest_mismatch(digest)) is not None:
            why = f"holds a {RESULT_FILE} of another protocol than its models ({mismatch})"
    if why is not None:
        raise ConfigError(
            f"{run_dir} {why}: that training run did not finish (it failed or was stopped after "
            "saving its models), so its models are not used; run it again (or --resume it)",
            path="run",
        )


def predict_local(
    run_dir: Path,
    out_dir: Path,
    *,
    data: list[str] | None = None,
    data_dir: Path | None = None,
    overwrite: bool = False,
) -> tuple[PredictionRecord, Path]:
    """Run every rank of a prediction locally, one spawned process each, with the
    protocol the run in ``run_dir`` was trained under. Returns the record and the
    predictions file. An ``out_dir`` holding earlier results is refused unless
    ``overwrite`` (then the new files move in only once every rank has finished)."""
    rank_threads()  # a bad SECUREVFL_THREADS is refused here, not in every rank
    run_dir = Path(run_dir)
    checked = run_protocol(run_dir)
    proto = checked.protocol
    check_finished(run_dir, proto)
    files = parse_data_overrides(data or [], proto)
    layout = layout_of(checked)
    for role in layout.roles:  # every rank's model, verified before any rank starts
        if role.kind != "helper":
            load_model(run_dir, role.rank, protocol_digest=proto.digest_mismatch)
    check_budgets(checked, run_dir)  # a prediction over a party's budget: refused, nothing written
    check_out(Path(out_dir), run_dir)
    with contextlib.ExitStack() as scratch:
        if data_dir is None:
            data_dir = run_dir / "data"  # where the training run left its dataset
            if is_builtin(proto) and not is_materialized(proto, data_dir):
                # the run's folder is only read (it may be read-only): built afresh aside
                data_dir = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="securevfl-data-")))
        return _predict(checked, run_dir, Path(out_dir), Path(data_dir), files, overwrite=overwrite)


def _predict(
    checked: CheckedProtocol,
    run_dir: Path,
    out_dir: Path,
    data_dir: Path,
    files: dict[str, Path],
    *,
    overwrite: bool,
) -> tuple[PredictionRecord, Path]:
    proto = checked.protocol
    layout = layout_of(checked)
    if is_builtin(proto):
        materialize(proto, data_dir)
    folder = OutputFolder.open(out_dir, overwrite=overwrite)
    out = folder.path

    def phase(rank: int) -> Predict:
        party = layout.role(rank).party
        return Predict(run_dir, out, data_dir, data=files.get(party))

    try:
        procs = start_ranks(proto, layout, out, phase, policy=checked.code)
        codes = watch_ranks(proto, procs, unreported=lambda r, c: ended_unreported(out, r, c, Predict.files))
        if any(c != 0 for c in codes.values()) or not (out / RECORD_FILE).is_file():
            raise explain_failure(layout, folder.path, codes, Predict.files)
    except BaseException as exc:
        failed = folder.abandon()
        if failed is not None and isinstance(exc, SecureVFLError):
            exc.args = (
                f"{exc} (the earlier predictions in {out_dir} are untouched; "
                f"this prediction's files are in {failed})",
            )
        raise
    folder.commit()
    out = Path(out_dir)
    record = PredictionRecord.model_validate(jsonfile.loads((out / RECORD_FILE).read_text()))
    return record, out / PREDICTIONS_FILE


__all__ = [
    "PREDICTIONS_FILE",
    "PartyModel",
    "Predict",
    "PredictionRecord",
    "check_budgets",
    "check_finished",
    "check_out",
    "parse_data_overrides",
    "predict_local",
    "predictions_frame",
    "read_predictions",
]
