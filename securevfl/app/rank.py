"""One rank's life: rendezvous, data, alignment, training, summary, exit code.

The same function runs under the local launcher (one spawned process per rank)
and under ``securevfl party`` (one rank per command, across hosts).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# autograd's first backward with an explicit gradient (every party's, from the first
# training step on) imports this module, and with it sympy: 0.7 CPU s, which would land
# inside the first training step. Imported with the rank's code instead (a fork
# server's ranks then have it for free).
import torch.fx.experimental.symbolic_shapes
from pydantic import ValidationError

from securevfl.app.checkpoints import (
    checkpoint_dir,
    list_checkpoints,
    model_dir,
    read_state,
    save_tensors,
    write_state,
)
from securevfl.app.outdir import output_error
from securevfl.app.rank_layout import layout_of
from securevfl.app.threads import rank_threads
from securevfl.attacks.base import View
from securevfl.components import components_of
from securevfl.config import Protocol
from securevfl.defenses.base import sends_codes
from securevfl.errors import (
    CheckpointError,
    ConfigError,
    OutputError,
    ProtocolError,
    SecureVFLError,
    show_warning,
)
from securevfl.exchange.base import ExchangeContext
from securevfl.parties.active import ActiveParty
from securevfl.parties.common import Party, prepare
from securevfl.parties.passive import PassiveParty
from securevfl.parties.state import PartyInfo, PartyState
from securevfl.records import EpochRecord, RankSummary
from securevfl.report.result import build_result, write_own_report, write_result
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Role
from securevfl.runtime.ledger import Ledger
from securevfl.runtime.secure.keys import Identity
from securevfl.runtime.session import EXIT_INTERRUPTED, ResumeOffer, Session, exit_code_for
from securevfl.timing import PhaseClock, peak_rss_mib
from securevfl.validation import check_task

AUDIT_ENV = "SECUREVFL_AUDIT_OPENS"
# tests only: "R:K" makes rank R kill itself with SIGKILL right after writing its
# epoch-K checkpoint (an interruption at a known point, for the resume tests)
KILL_ENV = "SECUREVFL_KILL_AFTER_CHECKPOINT"


def install_open_audit() -> list[str]:
    """Record every data-like file this process opens (tests use it to prove that
    a party reads only its own file)."""
    opened: list[str] = []
    skip = (".py", ".pyc", ".so", ".pth", ".pyi", ".typed", ".txt", ".cfg")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            p = os.fsdecode(args[0])
            if not p.endswith(skip) and not os.path.isdir(p):
                opened.append(os.path.abspath(p))

    sys.addaudithook(hook)
    return opened


def _note(proto: Protocol) -> Callable[[str], None]:
    """The active rank's progress lines before training starts (its bar exists
    only once the models are built)."""
    label = f"{proto.name} [{proto.exchange.backend}]"

    def note(text: str) -> None:
        print(f"[{label}] {text}", file=sys.stderr, flush=True)

    return note


def _peer_summary(session: Session, rank: int, raw: dict[str, Any]) -> RankSummary:
    """A rank's published summary as its record; a malformed one is that rank's fault."""
    try:
        return RankSummary.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError(f"{session.who(rank)} sent a malformed run summary: {exc}") from None


def _resume_offer(proto: Protocol, out_dir: Path, role: Role) -> ResumeOffer:
    """This rank's verified checkpoints for the start-up agreement, or why they
    cannot be used (every rank then reports it). Helper ranks keep none."""
    if role.kind == "helper":
        return ResumeOffer(checkpoints={})
    try:
        found = list_checkpoints(out_dir, role.rank, protocol_digest=proto.digest())
    except CheckpointError as exc:
        return ResumeOffer(checkpoints={}, error=str(exc))
    return ResumeOffer(checkpoints={e: m.run_id for e, m in found.items()})


def _saver(session: Session, out_dir: Path) -> Callable[[PartyState], None]:
    """Write this rank's checkpoint of a party state (and, under the test-only
    ``SECUREVFL_KILL_AFTER_CHECKPOINT``, die right after the named one)."""
    role = session.role
    kill = os.environ.get(KILL_ENV, "")

    def save(state: PartyState) -> None:
        write_state(
            checkpoint_dir(out_dir, session.rank, state.epoch),
            tensors=state.tensors,
            docs=state.docs,
            kind="checkpoint",
            protocol_digest=session.proto.digest(),
            run_id=session.run_id,
            rank=session.rank,
            role=role.kind,
            party=role.party,
            epoch=state.epoch,
            step=state.step,
        )
        if kill == f"{session.rank}:{state.epoch}":
            os.kill(os.getpid(), signal.SIGKILL)

    return save


def save_model(session: Session, out_dir: Path, party: Party) -> None:
    """The rank's final model, ``OUT/ranks/rank<R>/model/`` (securevfl.app.checkpoints)."""
    state = party.model_state()
    write_state(
        model_dir(out_dir, session.rank),
        tensors=state.tensors,
        docs=state.docs,
        kind="model",
        protocol_digest=session.proto.digest(),
        run_id=session.run_id,
        rank=session.rank,
        role=session.role.kind,
        party=session.role.party,
        epoch=state.epoch,
        step=state.step,
    )


def run_rank(
    proto: Protocol,
    rank: int,
    rendezvous: str,
    out_dir: Path,
    data_dir: Path,
    *,
    progress: bool,
    resume: bool = False,
    identity: Identity | None = None,
    pins: dict[int, str] | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> int:
    """Run one rank to completion; returns the process exit code. ``resume``: go
    on from the newest checkpoint every rank holds (agreed at start-up).
    ``identity`` and ``pins`` go to the :class:`Session` (its identity key; the
    keys every rank must present, if not the protocol's). ``on_epoch``: the active
    party's epoch records, as each epoch ends (ignored by the other ranks)."""
    opened = install_open_audit() if os.environ.get(AUDIT_ENV) else None
    warnings.showwarning = show_warning
    torch.set_num_threads(rank_threads())

    out_dir = Path(out_dir)
    ranks_dir = out_dir / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    layout = layout_of(proto)
    offer = None
    if resume:
        (ranks_dir / f"rank{rank}.error.json").unlink(missing_ok=True)  # the interrupted run's
        offer = _resume_offer(proto, out_dir, layout.role(rank))
    session = Session(proto, layout, rank, rendezvous, out_dir, resume=offer, identity=identity, pins=pins)
    t_start = time.time()
    clock = PhaseClock()
    note = _note(proto) if progress and rank == 0 else None
    try:
        t0 = time.perf_counter()
        with session:
            clock.add("startup", time.perf_counter() - t0)
            exchange = components_of(proto).exchange  # validated once, at load
            backend, options = exchange.cls, exchange.options
            # received tensors are kept only for what reads them after the run: the
            # attacks and a view dump; a run with neither keeps none (bounded memory)
            keep_views = proto.runtime.record_views and (proto.runtime.dump_views or bool(proto.attacks))
            ledger = Ledger(
                rank,
                record_views=keep_views,
                spill_dir=ranks_dir,
                spill_bytes=int(proto.runtime.view_memory_mib * (1 << 20)),
            )
            channel = Channel(
                rank, layout.names(), ledger, on_comm_error=session.diagnose, links=session.links
            )
            device = torch.device(proto.training.device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ConfigError(
                    "device 'cuda' requested but no CUDA device is available",
                    path="training.device",
                )
            ctx = ExchangeContext(
                channel,
                layout,
                rank,
                proto,
                options,
                [p.model.out for p in proto.parties.passive if p.model],
                device,
                [sends_codes(proto, p.name) for p in proto.parties.passive],
            )
            role = session.role
            summary: dict[str, Any] = {
                "rank": rank,
                "party": role.party,
                "role": role.kind,
                "pid": os.getpid(),
            }
            if role.kind == "helper":
                helper = backend.helper(ctx)
                c0 = time.process_time()  # its serving only, not its set-up (a dealer's imports)
                helper.serve()
                summary["train_cpu_s"] = round(time.process_time() - c0, 4)
                party = None
            else:
                prep = prepare(proto, layout, role, channel, data_dir, clock, note)
                if role.kind == "active" and proto.task is None:
                    assert prep.data.task is not None
                    check_task(proto, prep.data.task)  # the inferred task, as a declared one at load
                if prep.preprocessor is not None:  # what this party fitted, kept with its model
                    fitted = json.dumps(prep.preprocessor.fitted(), indent=1)
                    (ranks_dir / f"rank{rank}.preprocess.json").write_text(fitted)
                cls = ActiveParty if role.kind == "active" else PassiveParty
                with clock.phase("setup"):
                    saved = None
                    if session.resume_epoch is not None:
                        found = read_state(
                            checkpoint_dir(out_dir, rank, session.resume_epoch),
                            rank=rank,
                            kind="checkpoint",
                            protocol_digest=proto.digest(),
                        )
                        m = found.manifest
                        saved = PartyState(m.epoch, m.step, found.tensors, found.docs)
                    seeds = None if saved is None else saved.doc("party", PartyInfo, rank=rank).noise_keys
                    party = cls(
                        session,
                        backend,
                        ctx,
                        prep,
                        progress=progress and rank == 0,
                        noise_keys=seeds,
                        on_epoch=on_epoch if role.kind == "active" else None,
                    )
                    if saved is not None:
                        party.restore(saved)
                        if note is not None:
                            note(f"resuming after epoch {saved.epoch} (step {saved.step}), as agreed")
                summary.update(party.run(_saver(session, out_dir)))
                for phase, seconds in party.phase_s.items():
                    clock.add(phase, seconds)
                summary["train_cpu_s"] = round(party.train_cpu_s, 4)
                party.exchange.close()
                t_write = time.perf_counter()
                # the columns of its file it loaded, by name: after preprocessing, its inputs
                # (the fitted one-hot names would name categories found in its rows)
                pre = prep.preprocessor
                summary["loaded_columns"] = list(pre.inputs) if pre is not None else prep.data.columns
                summary["has_labels"] = prep.data.y is not None
                summary["n_aligned"] = len(prep.data.ids)
                summary["aligned_digest"] = hashlib.sha256("\n".join(prep.data.ids).encode()).hexdigest()[:16]
                write_own_report(out_dir, party.own_report())  # its defenses' statistics: its alone
                save_tensors(party.state(), ranks_dir / f"rank{rank}.state.pt")
                save_model(session, out_dir, party)
                trace = getattr(party, "trace", None)  # the active party's first steps (tests)
                if trace:
                    save_tensors(trace, ranks_dir / f"rank{rank}.trace.pt")
                view = View(rank, role.party, ledger.received_view(), party.own_view())
                if proto.runtime.dump_views or proto.attacks:  # attacks read it after the run
                    save_tensors(
                        {"received": view.received, "own": view.own.to_dict()},
                        ranks_dir / f"rank{rank}.view.pt",
                    )
                ledger.drop_spill()
                summary["view_tags"] = sorted(view.received)
                clock.add("write_out", time.perf_counter() - t_write)
            summary["ledger"] = ledger.summary()
            ledger.write_jsonl(ranks_dir / f"rank{rank}.ledger.jsonl")
            if opened is not None:
                summary["opened_files"] = sorted(set(opened))
            summary["phase_s"] = clock.rounded()
            summary["phase_cpu_s"] = clock.rounded_cpu()
            summary["peak_rss_mib"] = round(peak_rss_mib(), 1)
            mine = RankSummary(**summary).to_json()  # a misnamed field fails here, on its writer
            (ranks_dir / f"rank{rank}.summary.json").write_text(json.dumps(mine, indent=1))
            parts = session.finish(mine)
            if parts is not None:
                result = build_result(
                    proto,
                    backend,
                    options,
                    layout,
                    [_peer_summary(session, r, p) for r, p in enumerate(parts)],
                    session.pids,
                    started=t_start,
                    finished=time.time(),
                )
                write_result(out_dir, result)
        return 0
    except BaseException as exc:
        return failure_exit(session, exc)


def failure_exit(session: Session, exc: BaseException) -> int:
    """The exit code of a rank (training or prediction) whose run raised ``exc``,
    after reporting it: Ctrl-C is a stop (130), securevfl's own errors and the
    user's full disk or read-only folder are reported as they are, and anything
    else is a bug, whose traceback is kept and which the peers still hear of."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, SecureVFLError):
        return report_failure(session, exc)
    user = output_error(exc)
    if user is not None:
        return report_failure(session, user)
    traceback.print_exception(exc)
    report_failure(session, exc)
    return 1


def report_failure(session: Session, exc: BaseException) -> int:
    """Report this rank's failure (its error file, stderr, the peers) and return
    its exit code. When even the error file cannot be written (the disk is full)
    the failure still reaches stderr, in one line, and the exit code stands."""
    if isinstance(exc, OutputError) and exc.detail:  # the file's path stays on this machine
        owner = f"securevfl: rank {session.rank}, for its owner only: {exc.detail}"
        print(owner, file=sys.stderr, flush=True)
    try:
        session.report(exc)
    except OSError as err:
        print(
            f"securevfl: rank {session.rank} ({session.role.label}): {exc} (its error report could not "
            f"be written either: {err.strerror or err})",
            file=sys.stderr,
            flush=True,
        )
    return exit_code_for(exc)
