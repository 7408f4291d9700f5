"""One rank's life, for every purpose: set-up, then one phase, then the summary
and the exit code.

The same pipeline runs a rank that trains, one that resumes a training run and
one that predicts with a trained model, under the local launcher (one spawned
process per rank) and under ``securevfl party`` (one rank per command, across
hosts):

1. the process (:func:`prepare_process`): the open-file audit of the tests,
   warnings, torch's threads;
2. the session (:class:`~securevfl.runtime.session.Session`): rendezvous, start-up
   checks and watchdog, with the phase's purpose and resume offer in its hello;
3. the rank's wiring (:func:`set_up`): its ledger, its channel, the exchange
   backend and the :class:`~securevfl.exchange.base.ExchangeContext` its role
   objects use (:func:`exchange_context`);
4. the phase (:class:`Phase`): a party rank's work (:meth:`Phase.party`), or a
   helper rank's serving (:meth:`Phase.helper`); training and resuming are
   :class:`securevfl.app.training.Train`, prediction is
   :class:`securevfl.app.predict.Predict`;
5. the summary (:func:`write_summary`): the ledger, phase times and peak memory
   of the rank, published to rank 0, which hands every rank's to the phase
   (:meth:`Phase.conclude`: the run's result, or the prediction's record).

A failure at any step is reported as :func:`failure_exit` says.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

# autograd's first backward with an explicit gradient (every party's, from the first
# training step on) imports this module, and with it sympy: 0.7 CPU s, which would land
# inside the first training step. Imported with the rank's code instead (a fork
# server's ranks then have it for free).
import torch.fx.experimental.symbolic_shapes
from pydantic import ValidationError

from securevfl import jsonfile
from securevfl.app.checkpoints import save_tensors
from securevfl.app.outdir import output_error
from securevfl.app.threads import rank_threads
from securevfl.attacks.base import View
from securevfl.components import CheckedProtocol, Components
from securevfl.config import Protocol
from securevfl.errors import ConfigError, OutputError, ProtocolError, SecureVFLError, show_warning
from securevfl.exchange.base import ExchangeContext
from securevfl.private_files import private_dir, write_private
from securevfl.records import OwnView, RankSummary
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.ledger import Ledger
from securevfl.runtime.secure.keys import Identity
from securevfl.runtime.session import EXIT_INTERRUPTED, ResumeOffer, Session, exit_code_for
from securevfl.timing import PhaseClock, peak_rss_mib

AUDIT_ENV = "SECUREVFL_AUDIT_OPENS"


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


def prepare_process() -> list[str] | None:
    """The rank process's own settings: securevfl's warning lines, torch's thread
    count, and (tests only, ``SECUREVFL_AUDIT_OPENS``) the open-file audit, whose
    list of opened files it returns."""
    opened = install_open_audit() if os.environ.get(AUDIT_ENV) else None
    warnings.showwarning = show_warning
    torch.set_num_threads(rank_threads())
    return opened


@dataclass
class RankSetup:
    """What set-up gives a rank's phase: the checked protocol and layout, this rank and its
    role, its session, output folders and phase clock; and, once the session has
    started (:func:`set_up`), its ledger, channel, exchange backend and context."""

    checked: CheckedProtocol
    layout: Layout
    rank: int
    session: Session
    out_dir: Path
    clock: PhaseClock
    ledger: Ledger | None = None
    channel: Channel | None = None
    backend: Any = None  # the registered exchange backend class
    ctx: ExchangeContext | None = None

    @property
    def proto(self) -> Protocol:
        return self.checked.protocol

    @property
    def components(self) -> Components:
        return self.checked.components

    @property
    def role(self) -> Role:
        return self.session.role

    @property
    def ranks_dir(self) -> Path:
        return self.out_dir / "ranks"

    @property
    def wired(self) -> tuple[Ledger, Channel, ExchangeContext]:
        """The ledger, channel and exchange context (after :func:`set_up`)."""
        assert self.ledger is not None and self.channel is not None and self.ctx is not None
        return self.ledger, self.channel, self.ctx

    def save_view(self, own: OwnView, name: str) -> View:
        """This rank's view (what it received and what it kept of its own), written
        to ``ranks/rank<R>.<name>.pt`` for the attacks or a view dump."""
        ledger = self.wired[0]
        view = View(self.rank, self.role.party, ledger.received_view(), own)
        save_tensors(
            {"received": view.received, "own": view.own.to_dict()},
            self.ranks_dir / f"rank{self.rank}.{name}.pt",
        )
        return view


class Phase(ABC):
    """What a rank does once it is set up: train (or resume) a model, or predict
    with one. One object per rank, picklable (the local launcher sends it to the
    rank's process). ``purpose`` goes in the rank's hello, so that ranks started
    for different purposes refuse each other; ``files`` prefixes the rank's
    ledger and summary files (``ranks/rank<R>.<files>summary.json``)."""

    purpose: ClassVar[str]
    files: ClassVar[str]
    out_dir: Path

    def offer(self, proto: Protocol, role: Role) -> ResumeOffer | None:
        """This rank's checkpoints for the start-up agreement; None: not a resume."""
        return None

    def before_start(self, setup: RankSetup) -> None:  # noqa: B027 - optional hook
        """Work done before the session starts (a bad saved model fails at once)."""

    @abstractmethod
    def keep_views(self, proto: Protocol) -> bool:
        """Whether this rank writes its view (for what reads it after the run: the
        attacks, a view dump). The ledger keeps the tensors the rank receives only
        then, and under ``runtime.record_views``; a rank that keeps none runs in
        bounded memory."""

    @abstractmethod
    def helper(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        """A helper rank's work (it serves the exchange backend's parties)."""

    @abstractmethod
    def party(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        """A party rank's work; what it reports goes into ``summary``."""

    @abstractmethod
    def conclude(self, setup: RankSetup, parts: list[RankSummary], started: float) -> None:
        """Rank 0, with every rank's summary: the run's record (``started``: the wall
        time the rank started at)."""


def exchange_context(
    checked: CheckedProtocol, layout: Layout, rank: int, channel: Channel
) -> ExchangeContext:
    """What the exchange backend's role objects of this rank use: the channel, the
    layout, the backend's validated options, every passive party's embedding
    size and wire form (codes or floats, :attr:`~securevfl.components.PartyComponents.sends_codes`)
    and the torch device, checked here."""
    proto, comps = checked.protocol, checked.components
    device = torch.device(proto.training.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available", path="training.device")
    return ExchangeContext(
        channel,
        layout,
        rank,
        checked,
        comps.exchange.options,
        [p.model.out for p in proto.parties.passive if p.model],
        device,
        [p.sends_codes for p in comps.passive],
    )


def set_up(setup: RankSetup, phase: Phase) -> None:
    """Wire a rank whose session has started: its ledger (keeping received tensors
    as the phase asks, spilled to disk past ``runtime.view_memory_mib``), its
    channel, the exchange backend and context."""
    proto, session = setup.proto, setup.session
    setup.ledger = Ledger(
        setup.rank,
        record_views=proto.runtime.record_views and phase.keep_views(proto),
        spill_dir=setup.ranks_dir,
        spill_bytes=int(proto.runtime.view_memory_mib * (1 << 20)),
    )
    setup.channel = Channel(
        setup.rank, setup.layout.names(), setup.ledger, on_comm_error=session.diagnose, links=session.links
    )
    setup.backend = setup.components.exchange.cls
    setup.ctx = exchange_context(setup.checked, setup.layout, setup.rank, setup.channel)


def write_summary(
    setup: RankSetup, phase: Phase, summary: dict[str, Any], opened: list[str] | None
) -> dict[str, Any]:
    """Complete this rank's summary (its ledger, phase times, peak memory, the files
    it opened under the audit), write it and its ledger under ``ranks/``, and return
    it as published to rank 0."""
    ledger = setup.wired[0]
    ledger.drop_spill()
    summary["ledger"] = ledger.summary()
    ledger.write_jsonl(setup.ranks_dir / f"rank{setup.rank}.{phase.files}ledger.jsonl")
    if opened is not None:
        summary["opened_files"] = sorted(set(opened))
    summary["phase_s"] = setup.clock.rounded()
    summary["phase_cpu_s"] = setup.clock.rounded_cpu()
    summary["peak_rss_mib"] = round(peak_rss_mib(), 1)
    mine = RankSummary(**summary).to_json()  # a misnamed field fails here, on its writer
    path = setup.ranks_dir / f"rank{setup.rank}.{phase.files}summary.json"
    write_private(path, jsonfile.dumps(mine, indent=1))
    return mine


def peer_summary(session: Session, rank: int, raw: dict[str, Any]) -> RankSummary:
    """A rank's published summary as its record; a malformed one is that rank's fault."""
    try:
        return RankSummary.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError(f"{session.who(rank)} sent a malformed run summary: {exc}") from None


def run_rank(
    checked: CheckedProtocol,
    layout: Layout,
    rank: int,
    rendezvous: str,
    phase: Phase,
    *,
    identity: Identity | None = None,
    pins: dict[int, str] | None = None,
    echo: bool = True,
) -> int:
    """Run one rank of ``checked`` (its ranks laid out as ``layout``) through ``phase``
    to completion; returns the process exit code. ``identity``, ``pins`` and
    ``echo`` go to the :class:`Session` (its identity key; the keys every rank
    must present, if not the protocol's; whether it prints its error itself)."""
    proto = checked.protocol
    opened = prepare_process()
    out_dir = Path(phase.out_dir)
    private_dir(out_dir / "ranks")  # every rank file is its owner's alone (securevfl.private_files)
    offer = phase.offer(proto, layout.role(rank))
    session = Session(
        proto,
        layout,
        rank,
        rendezvous,
        out_dir,
        resume=offer,
        identity=identity,
        pins=pins,
        purpose=phase.purpose,
        echo=echo,
    )
    setup = RankSetup(checked, layout, rank, session, out_dir, PhaseClock())
    started = time.time()
    try:
        phase.before_start(setup)
        t0 = time.perf_counter()
        with session:
            setup.clock.add("startup", time.perf_counter() - t0)
            set_up(setup, phase)
            summary: dict[str, Any] = {
                "rank": rank,
                "party": setup.role.party,
                "role": setup.role.kind,
                "pid": os.getpid(),
            }
            if setup.role.kind == "helper":
                phase.helper(setup, summary)
            else:
                phase.party(setup, summary)
            parts = session.finish(write_summary(setup, phase, summary, opened))
            if parts is not None:
                phase.conclude(setup, [peer_summary(session, r, p) for r, p in enumerate(parts)], started)
        return 0
    except BaseException as exc:
        return failure_exit(session, exc)


def failure_exit(session: Session, exc: BaseException) -> int:
    """The exit code of a rank whose run raised ``exc``, after reporting it: Ctrl-C
    is a stop (130), securevfl's own errors and the user's full disk or read-only
    folder are reported as they are, and anything else is a bug, whose traceback
    is kept and which the peers still hear of."""
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


__all__ = [
    "AUDIT_ENV",
    "Phase",
    "RankSetup",
    "exchange_context",
    "failure_exit",
    "run_rank",
]
