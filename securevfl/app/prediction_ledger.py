"""Each party's ledger of the predictions made with its saved model
(docs/privacy.md, "Predictions spend privacy").

A rank that predicts keeps, in its own model folder
(``OUT/ranks/rank<R>/model/prediction_ledger.json``, mode 0600, beside the
verified model files and not named in their manifest), one entry per prediction
that released something priced: when, how many rows, and the releases'
descriptions (:meth:`~securevfl.privacy.accountant.Release.describe`). The
running total is the accountant's composition of every entry's releases
(:mod:`securevfl.privacy.prediction_budget`). Retraining replaces the model
folder, and so starts a new ledger with the new model.

The ledger is read before the prediction starts (the budget check) and written,
atomically, once the rank has begun releasing: what was sent is spent even if
the prediction then fails. While a rank predicts it holds an exclusive lock on
its model folder, so two predictions of one model cannot both pass the budget
check on the same total.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from securevfl import jsonfile
from securevfl.app.checkpoints import model_dir
from securevfl.config import PartySpec, Protocol
from securevfl.config_errors import format_loc
from securevfl.errors import CheckpointError, ConfigError
from securevfl.privacy.accountant import Mechanism
from securevfl.privacy.prediction_budget import PredictionSpend, check_budget, spend_of
from securevfl.private_files import open_private
from securevfl.runtime.layout import Role

LEDGER_FILE = "prediction_ledger.json"
FORMAT = 1


class LedgerEntry(BaseModel):
    """One prediction: when it ran (UTC), how many aligned rows it released, and
    what it released about each of them."""

    model_config = ConfigDict(extra="forbid")
    time: str
    rows: int = Field(ge=0)
    releases: list[dict[str, Any]]
    epsilon: float
    delta: float


class Ledger(BaseModel):
    """A party's predictions from one saved model."""

    model_config = ConfigDict(extra="forbid")
    format: int = FORMAT
    party: str
    predictions: list[LedgerEntry] = Field(default_factory=list)


def ledger_path(run_dir: Path, rank: int) -> Path:
    return model_dir(Path(run_dir), rank) / LEDGER_FILE


def read_ledger(run_dir: Path, rank: int, party: str) -> Ledger:
    """The ledger of rank ``rank``'s model (empty when no prediction has spent
    anything yet); a corrupted one, or one of another party, is a
    :class:`CheckpointError` naming the rank and the file."""
    path = ledger_path(run_dir, rank)
    where = f"rank {rank}: ranks/rank{rank}/model/{LEDGER_FILE}"
    if not path.exists():
        return Ledger(party=party)
    try:
        ledger = Ledger.model_validate(jsonfile.loads(path.read_bytes()))
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            raise CheckpointError(
                f"{where} is corrupted: not JSON (it holds what this party's predictions of the model "
                "have spent: restore it rather than delete it)"
            ) from None
        e = exc.errors()[0]
        raise CheckpointError(
            f"{where} is corrupted: field '{format_loc(tuple(e['loc']))}': {e['msg']} (it holds what this "
            "party's predictions of the model have spent: restore it rather than delete it)"
        ) from None
    if ledger.format != FORMAT or ledger.party != party:
        raise CheckpointError(
            f"{where}: field 'format' or 'party' is {ledger.format}/{ledger.party!r}, expected "
            f"{FORMAT}/{party!r}"
        )
    return ledger


def write_ledger(run_dir: Path, rank: int, ledger: Ledger) -> None:
    """Replace the ledger atomically: a private temporary file beside it (0600
    whatever the umask), synced, then renamed over it."""
    path = ledger_path(run_dir, rank)
    tmp = path.with_name(f".{LEDGER_FILE}.{os.getpid()}.tmp")
    with open_private(tmp) as fh:
        fh.write(jsonfile.dumps(ledger.model_dump(mode="json"), indent=1).encode())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def record(run_dir: Path, rank: int, ledger: Ledger, spend: PredictionSpend, rows: int) -> Ledger:
    """Add this prediction to the ledger and write it; returns the new ledger."""
    entry = LedgerEntry(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        rows=rows,
        releases=[r.describe() for r in spend.releases],
        epsilon=spend.epsilon,
        delta=spend.delta,
    )
    new = ledger.model_copy(update={"predictions": [*ledger.predictions, entry]})
    write_ledger(run_dir, rank, new)
    return new


def hold(run_dir: Path, rank: int) -> int:
    """Lock rank ``rank``'s model folder for this prediction (released when the
    returned descriptor is closed, or the process ends); another prediction of
    the same model holding it is refused."""
    fd = os.open(model_dir(Path(run_dir), rank), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"rank {rank}: another prediction of this model is running (its model folder is locked): "
            "predictions of one model run one at a time, so each is priced against the ones before it"
        ) from None
    return fd


def party_path(proto: Protocol, role: Role) -> str:
    """The protocol path of a party's ``prediction_budget``."""
    where = "parties.active" if role.kind == "active" else f"parties.passive[{role.index}]"
    return f"{where}.prediction_budget.epsilon"


def budget_of(spec: PartySpec) -> float | None:
    return None if spec.prediction_budget is None else spec.prediction_budget.epsilon


def price(
    proto: Protocol, role: Role, spec: PartySpec, mechanisms: list[Mechanism], run_dir: Path
) -> tuple[PredictionSpend, Ledger]:
    """This party's prediction priced against its ledger and checked against its
    budget (refused with a :class:`ConfigError`, before anything is released)."""
    ledger = read_ledger(run_dir, role.rank, spec.name)
    releases = [r for m in mechanisms for r in m.releases]
    try:
        spend = spend_of(spec.name, releases, [e.releases for e in ledger.predictions], proto.privacy.delta)
    except ValueError as exc:
        raise CheckpointError(f"rank {role.rank}: ranks/rank{role.rank}/model/{LEDGER_FILE}: {exc}") from None
    check_budget(spend, budget_of(spec), path=party_path(proto, role))
    return spend, ledger
