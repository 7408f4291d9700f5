"""One rank of a protocol in this process: ``securevfl party`` (and
:func:`securevfl.api.party`), the way each organization runs its own party when
the parties are on different hosts.

It opens the rank's output folder (never losing an earlier result:
:mod:`securevfl.app.outdir`), materializes a built-in dataset's slice of this
party in a short-lived forked child process, and runs the rank (:func:`~securevfl.app.rank.run_rank`,
with the phase :class:`~securevfl.app.training.Train`, or
:class:`~securevfl.app.predict.Predict` for one rank of a prediction).
A rank reports its own failure (stderr, its error file, its peers); this raises
:class:`~securevfl.errors.RankFailed` with its exit code.
"""

from __future__ import annotations

from pathlib import Path

from securevfl.app.outdir import OutputFolder, resume_folder
from securevfl.app.party_args import check_key_file, check_rendezvous
from securevfl.app.predict import Predict, check_out, parse_data_overrides
from securevfl.app.rank import run_rank
from securevfl.app.rank_layout import layout_of
from securevfl.app.training import Train
from securevfl.components import CheckedProtocol
from securevfl.data.partition import is_builtin, materialize_apart
from securevfl.errors import ConfigError, RankFailed
from securevfl.runtime.layout import Layout
from securevfl.runtime.secure.keys import Identity


def run_party(
    checked: CheckedProtocol,
    rank: int,
    rendezvous: str,
    *,
    out: Path | None = None,
    data_dir: Path | None = None,
    key: Path | None = None,
    predict: Path | None = None,
    data: list[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> Path:
    """Run rank ``rank`` of ``proto`` to its end in this process; return its output
    folder (default ``runs/<name>-rank<R>``, ``runs/<name>-predict-rank<R>`` for a
    prediction). ``key``: this party's secret key file; ``predict``: the training
    run's folder, to predict with this rank's saved model; ``data``: ``PARTY=PATH``
    items naming this party's file of new records (a prediction only)."""
    data = data or []
    proto = checked.protocol
    check_rendezvous(rendezvous)
    layout = layout_of(checked)
    role = layout.role(rank)
    identity = None
    if key is not None:
        check_key_file(Path(key))
        identity = Identity.load(Path(key))
    if predict is not None:
        if resume:
            raise ConfigError(
                "--resume continues a training run; a prediction has nothing to resume", path="--resume"
            )
        return _predict_rank(
            checked, layout, rank, rendezvous, predict, out, data_dir, data, identity, overwrite
        )
    if data:
        raise ConfigError(
            "--data names the new records of a prediction: use it with --predict", path="--data"
        )
    folder_path = out if out is not None else Path("runs") / f"{proto.name}-rank{rank}"
    data_path = data_dir if data_dir is not None else folder_path / "data"
    if resume:
        folder = resume_folder(folder_path, overwrite=overwrite, ranks=range(rank, rank + 1))
    else:
        folder = OutputFolder.open(folder_path, overwrite=overwrite, keep=(data_path,))
    try:
        if is_builtin(proto) and role.kind != "helper":
            # this party's slice, written by a short-lived forked child: the rank's own
            # process never holds the other parties' columns
            materialize_apart(proto, data_path, role.party)
        phase = Train(folder.path, data_path, progress=progress, resume=resume)
        code = run_rank(checked, layout, rank, rendezvous, phase, identity=identity)
        if code != 0:
            raise RankFailed(
                f"rank {rank} ({role.party}) stopped with exit code {code}",
                exit_code=code,
                kept_aside=folder.abandon(),
            )
        folder.commit()
    finally:
        folder.release()  # the output folder's lock, whatever happened
    return folder_path


def _predict_rank(
    checked: CheckedProtocol,
    layout: Layout,
    rank: int,
    rendezvous: str,
    run_dir: Path,
    out: Path | None,
    data_dir: Path | None,
    data: list[str],
    identity: Identity | None,
    overwrite: bool,
) -> Path:
    """One rank of a prediction (:func:`run_party` with ``predict``)."""
    proto = checked.protocol
    me = layout.role(rank).party
    files = parse_data_overrides(data, proto)
    others = sorted(set(files) - {me})
    if others:
        raise ConfigError(
            f"rank {rank} is party '{me}'; --data may name only its own file (got {others})", path="--data"
        )
    folder_path = out if out is not None else Path("runs") / f"{proto.name}-predict-rank{rank}"
    check_out(folder_path, run_dir)
    data_path = data_dir if data_dir is not None else run_dir / "data"
    folder = OutputFolder.open(folder_path, overwrite=overwrite)
    try:
        phase = Predict(run_dir, folder.path, data_path, data=files.get(me))
        code = run_rank(checked, layout, rank, rendezvous, phase, identity=identity)
        if code != 0:
            folder.abandon()
            raise RankFailed(f"rank {rank} ({me}) stopped with exit code {code}", exit_code=code)
        folder.commit()
    finally:
        folder.release()  # the output folder's lock, whatever happened
    return folder_path
