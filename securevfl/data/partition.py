"""Vertical partition: which columns each party holds, and per-party files.

Built-in datasets are materialized once into one CSV per party (an ID column, the
party's feature columns, and the label column for the active party only). From
then on every party reads only its own file, exactly as with user-supplied CSVs;
this is what lets tests prove that no rank ever loads another party's columns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import pandas as pd

from securevfl.config import CsvSource, Protocol
from securevfl.data.catalog import DATASETS
from securevfl.data.columns import PartyLayout as PartyLayout
from securevfl.data.columns import party_layouts as party_layouts
from securevfl.data.columns import resolve_partition as resolve_partition
from securevfl.data.columns import select_columns as select_columns
from securevfl.errors import DataError, SecureVFLError
from securevfl.runtime.lifeline import die_with

ID_COLUMN = "id"
LABEL_COLUMN = "label"
#: While a file ``PENDING.<pid>`` exists in a dataset folder, launcher ``pid`` is
#: writing its per-party files (one marker per launcher: concurrent runs sharing a
#: data folder never clear each other's).
PENDING = ".materializing"
PENDING_WAIT_S = 900.0
#: Below this many values in all, one process writes every party's file (small
#: data, tests); above it, forked workers write them side by side, one per core.
PARALLEL_MIN_VALUES = 2_000_000


def is_builtin(proto: Protocol) -> bool:
    return proto.dataset.name != "csv"


def dataset_key(proto: Protocol) -> str:
    """Folder name for materialized files: changes when data or split change."""
    blob = json.dumps(
        {
            "dataset": proto.dataset.model_dump(mode="json"),
            "seed": proto.training.seed,
            "parties": [
                [lay.name, lay.spec.columns.model_dump(mode="json") if lay.spec.columns else None]
                for lay in party_layouts(proto)
            ],
        },
        sort_keys=True,
    ).encode()
    return f"{proto.dataset.name}-{hashlib.sha256(blob).hexdigest()[:10]}"


def party_source(proto: Protocol, party: str, data_dir: Path) -> CsvSource:
    """The CSV source a party reads: its own file from the protocol, or its
    materialized slice of a built-in dataset."""
    lay = next(p for p in party_layouts(proto) if p.name == party)
    if not is_builtin(proto):
        assert lay.spec.source is not None  # checked at load
        return lay.spec.source
    path = Path(data_dir) / dataset_key(proto) / f"{party}.csv"
    await_materialized(path)
    own: list[str] | None = None
    if lay.is_active:  # the active party's file: ID, its own columns (if any), label
        header = list(pd.read_csv(path, nrows=0).columns) if path.is_file() else []
        own = [c for c in header if c not in (ID_COLUMN, LABEL_COLUMN)]
    return CsvSource(
        path=str(path),
        id_column=ID_COLUMN,
        label_column=LABEL_COLUMN if lay.is_active else None,
        feature_columns=own,
    )


def await_materialized(path: Path, timeout_s: float = PENDING_WAIT_S) -> None:
    """Wait while the launcher is still writing the dataset folder of ``path`` (it
    starts the ranks first, so their start-up overlaps the writing; see
    :func:`materializing`). Returns at once when nothing is pending; a file that
    is still missing afterwards is reported by whoever reads it."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file() and (pending := _pending(path.parent)):
        if time.monotonic() > deadline:
            raise DataError(
                f"party '{path.stem}': its data file was not written within {timeout_s:.0f} s",
                detail=f"{pending[0]} is still there and {path} is not",
            )
        time.sleep(0.05)


def _pending(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{PENDING}.*"))


def is_materialized(proto: Protocol, data_dir: Path) -> bool:
    """Whether every party's file of ``proto``'s built-in dataset lies in
    ``data_dir`` already (reading them writes nothing)."""
    folder = Path(data_dir) / dataset_key(proto)
    return all((folder / f"{lay.name}.csv").is_file() for lay in party_layouts(proto))


@contextlib.contextmanager
def materializing(proto: Protocol, data_dir: Path) -> Iterator[bool]:
    """Mark a built-in dataset's folder as being written for the duration of the
    block; yields whether anything is left to write (False: every party's file is
    already there, or the data are the user's own CSV files)."""
    if not is_builtin(proto):
        yield False
        return
    folder = Path(data_dir) / dataset_key(proto)
    if all((folder / f"{lay.name}.csv").is_file() for lay in party_layouts(proto)):
        yield False
        return
    folder.mkdir(parents=True, exist_ok=True)
    pending = folder / f"{PENDING}.{os.getpid()}"
    pending.write_text(str(os.getpid()))
    try:
        yield True
    finally:
        pending.unlink(missing_ok=True)


def materialize(proto: Protocol, data_dir: Path, only: str | None = None) -> Path:
    """Write one CSV per party for a built-in dataset (or only party ``only``).
    Idempotent: existing files are kept. Returns the dataset folder."""
    folder = Path(data_dir) / dataset_key(proto)
    targets = [lay for lay in party_layouts(proto) if only in (None, lay.name)]
    if all((folder / f"{lay.name}.csv").is_file() for lay in targets):
        return folder
    build = DATASETS.get(proto.dataset.name, path="dataset.name")
    try:
        table = build(proto.dataset, proto.training.seed)
    except MemoryError:
        raise DataError(
            f"dataset '{proto.dataset.name}': this machine has not enough memory to build it; "
            "make it smaller (dataset.synthetic.rows, dataset.synthetic.features)"
        ) from None
    parts = resolve_partition(proto, list(table.features.columns))
    folder.mkdir(parents=True, exist_ok=True)
    # first: a rank reads it once alignment is done, which needs only the party files
    meta = {"standardize": table.standardize, "rows": len(table.ids)}
    (folder / "meta.json").write_text(json.dumps(meta))

    def frames() -> Iterator[tuple[pd.DataFrame, Path, Path]]:
        for lay in targets:
            frame = table.features[parts[lay.name]].copy()
            frame.insert(0, ID_COLUMN, table.ids)
            if lay.is_active:
                frame[LABEL_COLUMN] = table.labels
            yield frame, folder / f".{lay.name}.{os.getpid()}.tmp", folder / f"{lay.name}.csv"

    workers = min(len(targets), _cores())
    if workers < 2 or table.features.size < PARALLEL_MIN_VALUES:
        for job in frames():
            _write_csv(*job)
        return folder
    # CSV formatting holds the GIL: forked processes (copy-on-write, nothing
    # re-imported), at most one party's frame in flight per worker
    # (ending with this process: a launcher killed mid-way leaves no worker behind)
    with ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=die_with, initargs=(os.getpid(),)
    ) as pool:
        running: set[Future[None]] = set()
        for job in frames():
            if len(running) >= workers:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()
            running.add(pool.submit(_write_csv, *job))
        for f in running:
            f.result()
    return folder


def materialize_apart(proto: Protocol, data_dir: Path, party: str) -> None:
    """Write party ``party``'s slice of a built-in dataset from a short-lived child
    process (``securevfl party``): the child builds the whole table, so the rank's
    own process never holds the other parties' columns.

    The child is forked, not spawned: it starts with this process's imports. A
    spawned child imports securevfl, torch and scikit-learn again, 3.8-3.9 CPU s
    per party against 0.07-0.08 forked (plain.yaml's digits, 2026-11-26 test box),
    which three ``party`` processes on one machine pay three times. Forking is
    safe here for the reason the launcher's writers are: nothing has run on
    threads yet. A forked child is a copy of the rank's process, so it holds
    what the rank holds at that point (its identity key, if ``--key`` was given)
    for its fraction of a second; it draws no randomness, sends nothing and
    writes the party's data file only. It ends with this process
    (:func:`die_with`); its error, if any, is raised here."""
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_materialize_child, args=(os.getpid(), proto, data_dir, party, writer))
    child.start()
    writer.close()
    try:
        outcome = reader.recv() if reader.poll(None) else None
    except EOFError:
        outcome = None
    child.join()
    if isinstance(outcome, BaseException):
        raise outcome
    if child.exitcode != 0 or outcome != "done":
        raise DataError(f"party '{party}': could not write its data file (exit code {child.exitcode})")


def _materialize_child(origin: int, proto: Protocol, data_dir: Path, party: str, conn: Any) -> None:
    die_with(origin)
    try:
        materialize(proto, data_dir, party)
    except (SecureVFLError, OSError) as exc:  # reported by the parent, as its own
        conn.send(exc)
    else:
        conn.send("done")
    finally:
        conn.close()


def _write_csv(frame: pd.DataFrame, tmp: Path, final: Path) -> None:
    """Write one party's file aside, then move it into place: atomic, so a rank
    waiting for it never reads half a file."""
    frame.to_csv(tmp, index=False)
    os.replace(tmp, final)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def dataset_standardize(proto: Protocol, data_dir: Path) -> bool:
    """Whether parties z-score their columns: the protocol decides, else the
    built-in dataset's default (CSV data: yes)."""
    if proto.dataset.standardize is not None:
        return proto.dataset.standardize
    if not is_builtin(proto):
        return True
    meta = Path(data_dir) / dataset_key(proto) / "meta.json"
    return bool(json.loads(meta.read_text())["standardize"]) if meta.is_file() else True
