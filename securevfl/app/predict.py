"""Federated prediction: ``securevfl predict RUN_DIR --out DIR`` (every rank
locally) and ``securevfl party FILE --rank R --predict RUN_DIR`` (one rank, one
organization), docs/design.md §12.

Every rank starts as in training (rendezvous, start-up checks, watchdog), with
the purpose ``predict`` in its hello, so a rank started to train cannot join a
prediction. Then each party rank

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
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict

from securevfl.app.checkpoints import load_model, save_tensors
from securevfl.app.launcher import explain_failure, rank_protocol, start_ranks, watch_ranks
from securevfl.app.model_io import PartyModel, load_party_model, run_protocol
from securevfl.app.outdir import OutputFolder, holds_training_run
from securevfl.app.rank import AUDIT_ENV, failure_exit, install_open_audit
from securevfl.app.rank_layout import layout_of
from securevfl.app.threads import rank_threads
from securevfl.attacks.base import View
from securevfl.components import components_of
from securevfl.config import CsvSource, Protocol
from securevfl.csvfile import read_rows, typed, write_rows
from securevfl.data.alignment import align_active, align_passive
from securevfl.data.partition import is_builtin, materialize, party_source
from securevfl.data.party_data import PartyData, load_new_records
from securevfl.defenses.base import sends_codes
from securevfl.errors import ConfigError, SecureVFLError, show_warning
from securevfl.exchange.base import ExchangeContext
from securevfl.parties.predict import ActivePredictor
from securevfl.records import OwnView, RankSummary
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.ledger import Ledger
from securevfl.runtime.secure.keys import Identity
from securevfl.runtime.session import Session
from securevfl.timing import PhaseClock, peak_rss_mib
from securevfl.usercode import CodePolicy

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
    rows: dict[str, int]  # per party: records in its file; "aligned": rows predicted
    predictions: str  # the file, relative to the output folder
    ledger: dict[str, Any]  # bytes and messages per rank, as the ranks counted them
    phase_s: dict[str, dict[str, float]]
    wall_time_s: float


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
def _contexts(proto: Protocol, layout: Layout, rank: int, channel: Channel) -> ExchangeContext:
    device = torch.device(proto.training.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available", path="training.device")
    return ExchangeContext(
        channel,
        layout,
        rank,
        proto,
        components_of(proto).exchange.options,
        [p.model.out for p in proto.parties.passive if p.model],
        device,
        [sends_codes(proto, p.name) for p in proto.parties.passive],
    )


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


def predict_rank(
    proto: Protocol,
    rank: int,
    rendezvous: str,
    run_dir: Path,
    out_dir: Path,
    data_dir: Path,
    *,
    data: Path | None = None,
    progress: bool = False,
    identity: Identity | None = None,
    pins: dict[int, str] | None = None,
) -> int:
    """Run one rank of a prediction to completion; returns the process exit code.
    ``run_dir``: the training run's output folder holding this rank's saved model;
    ``data``: this party's file of new records (default: its protocol entry's);
    ``identity``, ``pins``: as for :func:`~securevfl.app.rank.run_rank`."""
    opened = install_open_audit() if os.environ.get(AUDIT_ENV) else None
    warnings.showwarning = show_warning
    torch.set_num_threads(rank_threads())
    out_dir = Path(out_dir)
    ranks_dir = out_dir / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    layout = layout_of(proto)
    session = Session(proto, layout, rank, rendezvous, out_dir, identity=identity, pins=pins, purpose=PURPOSE)
    clock = PhaseClock()
    t_start = time.time()
    try:
        role = session.role
        model = None
        if role.kind != "helper":  # checked before start-up: a bad model fails here at once
            with clock.phase("load"):
                model = load_party_model(proto, role, run_dir, torch.device(proto.training.device))
        with session:
            backend = components_of(proto).exchange.cls
            keep = proto.runtime.record_views and proto.runtime.dump_views
            ledger = Ledger(rank, record_views=keep, spill_dir=ranks_dir)
            channel = Channel(
                rank, layout.names(), ledger, on_comm_error=session.diagnose, links=session.links
            )
            ctx = _contexts(proto, layout, rank, channel)
            summary: dict[str, Any] = {
                "rank": rank,
                "party": role.party,
                "role": role.kind,
                "pid": os.getpid(),
            }
            own: OwnView | None = None
            if model is None:
                backend.helper(ctx).serve()
            else:
                with clock.phase("data"):  # all of the party's own file, checked before any message
                    source = records_source(proto, role.party, data_dir, data)
                    records = load_new_records(
                        source, role.party, model.inputs, preprocess=model.spec.preprocess
                    )
                    x_all = model.features(records)
                with clock.phase("alignment"):
                    aligned, order = _align(channel, layout, role, records)
                with clock.phase("setup"):
                    x = torch.as_tensor(x_all[order])
                    predictor = model.predictor(backend, ctx, keep_sent=keep)
                channel.phase = "eval"  # an evaluation pass (the ledger and CrypTen know these phases)
                with clock.phase("prediction"):
                    if isinstance(predictor, ActivePredictor):
                        scores = predictor.predict(x, len(aligned.ids))
                    else:
                        predictor.contribute(x)
                predictor.exchange.close()
                if isinstance(predictor, ActivePredictor):
                    columns = predictor.task.prediction_columns(scores)
                    write_predictions(
                        out_dir / PREDICTIONS_FILE, predictions_frame(source.id_column, aligned.ids, columns)
                    )
                summary["n_aligned"] = len(aligned.ids)
                summary["aligned_digest"] = hashlib.sha256("\n".join(aligned.ids).encode()).hexdigest()[:16]
                summary["loaded_columns"] = list(model.inputs)
                summary["has_labels"] = False
                summary["n_records"] = len(records.ids)
                kept = {
                    "embeddings": getattr(predictor, "sent", []),
                    "z": getattr(predictor, "revealed_z", []),
                }
                own = OwnView(kept)
            if keep:
                view = View(rank, role.party, ledger.received_view(), own or OwnView({}))
                save_tensors(
                    {"received": view.received, "own": view.own.to_dict()},
                    ranks_dir / f"rank{rank}.predict_view.pt",
                )
                summary["view_tags"] = sorted(view.received)
            ledger.drop_spill()
            summary["ledger"] = ledger.summary()
            ledger.write_jsonl(ranks_dir / f"rank{rank}.predict_ledger.jsonl")
            if opened is not None:
                summary["opened_files"] = sorted(set(opened))
            summary["phase_s"] = clock.rounded()
            summary["phase_cpu_s"] = clock.rounded_cpu()
            summary["peak_rss_mib"] = round(peak_rss_mib(), 1)
            mine = RankSummary(**summary).to_json()
            (ranks_dir / f"rank{rank}.predict_summary.json").write_text(json.dumps(mine, indent=1))
            parts = session.finish(mine)
            if parts is not None:
                record = _record(proto, [RankSummary.model_validate(p) for p in parts], t_start)
                (out_dir / RECORD_FILE).write_text(json.dumps(record.model_dump(mode="json"), indent=1))
        return 0
    except BaseException as exc:
        return failure_exit(session, exc)


def _record(proto: Protocol, parts: list[RankSummary], t_start: float) -> PredictionRecord:
    rows = {p.party: int(p.n_records or 0) for p in parts if p.role != "helper"}
    rows["aligned"] = int(parts[0].n_aligned or 0)
    return PredictionRecord(
        protocol=proto.name,
        digest=proto.digest(),
        backend=proto.exchange.backend,
        task=str(proto.task or "inferred at training"),
        rows=rows,
        predictions=PREDICTIONS_FILE,
        ledger={str(p.rank): p.ledger or {} for p in parts},
        phase_s={str(p.rank): dict(p.phase_s or {}) for p in parts},
        wall_time_s=time.time() - t_start,
    )


# -- every rank locally -----------------------------------------------------------------------
def _child(
    proto_json: str,
    rank: int,
    rendezvous: str,
    run_dir: str,
    out_dir: str,
    data_dir: str,
    data: str | None,
    policy: CodePolicy,
    seed: bytes,
    pins: dict[int, str],
) -> None:
    proto = rank_protocol(proto_json, rank, policy, Path(out_dir))
    code = predict_rank(
        proto,
        rank,
        rendezvous,
        Path(run_dir),
        Path(out_dir),
        Path(data_dir),
        data=Path(data) if data else None,
        identity=Identity.from_seed(seed),
        pins=pins,
    )
    sys.exit(code)


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
    proto = run_protocol(run_dir)
    files = parse_data_overrides(data or [], proto)
    data_dir = Path(data_dir) if data_dir else run_dir / "data"
    if is_builtin(proto):
        materialize(proto, data_dir)
    layout = layout_of(proto)
    for role in layout.roles:  # every rank's model, verified before any rank starts
        if role.kind != "helper":
            load_model(run_dir, role.rank, protocol_digest=proto.digest())
    check_out(Path(out_dir), run_dir)
    folder = OutputFolder.open(Path(out_dir), overwrite=overwrite)
    blob = proto.model_dump_json()
    code = components_of(proto).code

    def args(rank: int, rendezvous: str) -> tuple[Any, ...]:
        party = layout.role(rank).party
        own = str(files[party]) if party in files else None
        return (blob, rank, rendezvous, str(run_dir), str(folder.path), str(data_dir), own, code)

    try:
        codes = watch_ranks(proto, start_ranks(proto, folder.path, _child, args))
        if any(c != 0 for c in codes.values()):
            raise explain_failure(layout, folder.path, codes)
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
    record = PredictionRecord.model_validate_json((out / RECORD_FILE).read_text())
    return record, out / PREDICTIONS_FILE


__all__ = [
    "PREDICTIONS_FILE",
    "PartyModel",
    "PredictionRecord",
    "check_out",
    "parse_data_overrides",
    "predict_local",
    "predict_rank",
    "predictions_frame",
    "read_predictions",
]
