"""``securevfl run | party | predict | compare``: the commands that train, predict
and compare (imported when one of them runs; ``run``, ``predict`` and ``compare``
once :mod:`securevfl.cli.launching` has checked their files)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from securevfl import api, jsonfile
from securevfl.app.loader import allowed_modules, load_checked
from securevfl.app.predict import PREDICTIONS_FILE
from securevfl.app.rank_layout import layout_of
from securevfl.cli.audit import warn_after_run
from securevfl.config import Protocol
from securevfl.errors import RankFailed
from securevfl.report.compare import print_summary, print_table


def launch_run(args: argparse.Namespace, proto: Protocol) -> int:
    """``securevfl run`` with its protocol file loaded and checked
    (:func:`securevfl.cli.launching.cmd_run`)."""
    result = api.run(
        proto,
        out=args.out,
        data_dir=args.data_dir,
        progress=not args.quiet,
        overwrite=args.overwrite,
        resume=args.resume,
    )
    doc = result.to_json()
    print_table([doc], title=f"securevfl run: {proto.name}")
    print(f"result: {result.folder / 'result.json'}")
    warn_after_run(doc)  # a violated privacy claim: warned, the run has still completed
    return 0


def cmd_party(args: argparse.Namespace) -> int:
    allowed = allowed_modules(args.allow_plugins)
    checked = load_checked(args.file, args.overrides, allow=allowed, rank=args.rank)
    try:
        out = api.party(
            checked.protocol,
            allow_plugins=args.allow_plugins,
            rank=args.rank,
            rendezvous=args.rendezvous,
            out=args.out,
            data_dir=args.data_dir,
            key=args.key,
            predict=args.predict,
            data=args.data,
            overwrite=args.overwrite,
            resume=args.resume,
            progress=not args.quiet,
        )
    except RankFailed as exc:  # the rank has reported its error itself
        if exc.kept_aside is not None:
            print(
                f"securevfl: the earlier result in {exc.kept_aside.parent} is untouched; "
                f"this run's files are in {exc.kept_aside}",
                file=sys.stderr,
            )
        return exc.exit_code
    role = layout_of(checked).role(args.rank)
    if args.predict is not None:
        spent = _own_summary(out, args.rank, "predict_").get("prediction_privacy")
        if spent:  # this party's own prediction privacy, from its own summary
            print(_spent_line(role.party, spent))
        if role.kind == "active":
            print(f"predictions: {out / PREDICTIONS_FILE}")
        else:
            print(f"done: rank {args.rank} ({role.label}) took part; the active party holds the predictions")
    elif args.rank == 0:
        print(f"result: {out / 'result.json'}")
    else:  # the other ranks say so too, in one line: rank 0 holds the result
        print(_rank_done(out, args.rank, role.label))
    return 0


def _own_summary(out: Path, rank: int, files: str = "") -> dict[str, Any]:
    """The summary this rank wrote of its run (``files``: the phase's file prefix),
    or nothing where it cannot be read."""
    try:
        summary = jsonfile.loads((out / "ranks" / f"rank{rank}.{files}summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _rank_done(out: Path, rank: int, label: str) -> str:
    """One line for a rank other than rank 0 that has finished: what it did, from
    its own summary, and where its files are."""
    summary = _own_summary(out, rank)
    if summary.get("train_steps") is None:  # a helper rank (the mpc dealer)
        return f"done: rank {rank} ({label}) served the run; its files are in {out}"
    model = out / "ranks" / f"rank{rank}" / "model"
    return (
        f"done: rank {rank} ({label}): {summary['train_steps']} training steps on "
        f"{summary.get('n_aligned', '?')} aligned rows; its model is in {model}"
    )


def cmd_predict(args: argparse.Namespace) -> int:
    pred = api.predict(
        args.run_dir, out=args.out, data=args.data, data_dir=args.data_dir, overwrite=args.overwrite
    )
    print(
        f"securevfl predict: {pred.protocol} [{pred.backend}]: {pred.rows['aligned']} rows aligned "
        "and predicted ("
        + ", ".join(f"{k} {v}" for k, v in pred.rows.items() if k != "aligned")
        + " records)"
    )
    for party, spent in pred.privacy.items():
        print(_spent_line(party, spent))
    print(f"predictions: {pred.path}")
    return 0


def _spent_line(party: str, spent: dict[str, Any]) -> str:
    """One party's privacy spending of a prediction, in one line: this
    prediction's eps, the composed total over every prediction of its model, its budget."""
    total, budget = spent["total"], spent.get("budget")
    n = total["predictions"]
    return (
        f"privacy: party '{party}': this prediction epsilon={spent['epsilon']:.4g} "
        f"(delta={spent['delta']:g}); {n} prediction{'' if n == 1 else 's'} of this model composed: "
        f"epsilon={total['epsilon']:.4g}"
        + (f" of its budget {budget['epsilon']:g}" if budget else "")
        + " (training releases not included)"
    )


def cmd_compare(args: argparse.Namespace) -> int:
    table = api.compare(
        args.files,
        seeds=args.seeds,
        grid=args.grid,
        overrides=args.overrides,
        out=args.out,
        overwrite=args.overwrite,
        progress=not args.quiet,
        status=True,  # what the command does, said even under --quiet
    )
    print_summary(table.summary, title=table.title)
    print("wrote " + ", ".join(str(p) for p in table.files.values()))
    return 0
