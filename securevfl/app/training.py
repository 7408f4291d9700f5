"""The training phase of a rank (:class:`Train`, run by :func:`securevfl.app.rank.run_rank`):
a new run, or a ``--resume`` run going on from the newest checkpoint every rank
holds (agreed at start-up).

A party rank loads and aligns its data (:func:`securevfl.parties.common.prepare`),
builds its party (restored from its checkpoint when resuming), trains, and writes
what it owns under ``OUT/ranks/``: its defenses' statistics, its state, its final
model (:mod:`securevfl.app.checkpoints`) and, for the attacks or a view dump, its
view. A helper rank serves. Rank 0 then writes the run's result.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar, Literal

from securevfl.app.checkpoints import (
    checkpoint_dir,
    list_checkpoints,
    model_dir,
    read_state,
    save_tensors,
    write_state,
)
from securevfl.app.epochs import EpochSender
from securevfl.app.rank import Phase, RankSetup
from securevfl.config import Protocol
from securevfl.errors import CheckpointError
from securevfl.parties.active import ActiveParty
from securevfl.parties.common import Prepared, prepare
from securevfl.parties.passive import PassiveParty
from securevfl.parties.state import PartyInfo, PartyState
from securevfl.private_files import write_private
from securevfl.records import RankSummary
from securevfl.report.result import build_result, write_own_report, write_result
from securevfl.runtime.layout import Role
from securevfl.runtime.session import ResumeOffer
from securevfl.validation import check_task

# tests only: "R:K" makes rank R kill itself with SIGKILL right after writing its
# epoch-K checkpoint (an interruption at a known point, for the resume tests)
KILL_ENV = "SECUREVFL_KILL_AFTER_CHECKPOINT"


@dataclass(frozen=True)
class Train(Phase):
    """Train a model (``resume``: go on from the agreed checkpoint), writing into
    ``out_dir``, the party's data files under ``data_dir``. ``progress``: rank 0
    shows its progress; ``epochs``: rank 0's end of the epoch-record pipe of a
    local launch, which the active party's epoch records go through as each epoch
    ends (:mod:`securevfl.app.epochs`; ignored by the other ranks)."""

    purpose: ClassVar[str] = "train"
    files: ClassVar[str] = ""

    out_dir: Path
    data_dir: Path
    progress: bool = True
    resume: bool = False
    epochs: Connection | None = None

    def offer(self, proto: Protocol, role: Role) -> ResumeOffer | None:
        """This rank's verified checkpoints for the start-up agreement when
        resuming, or why they cannot be used (every rank then reports it). Helper
        ranks keep none."""
        if not self.resume:
            return None
        if role.kind == "helper":
            return ResumeOffer(checkpoints={})
        try:
            found = list_checkpoints(self.out_dir, role.rank, protocol_digest=proto.digest_mismatch)
        except CheckpointError as exc:
            return ResumeOffer(checkpoints={}, error=str(exc))
        return ResumeOffer(checkpoints={e: m.run_id for e, m in found.items()})

    def before_start(self, setup: RankSetup) -> None:
        if self.resume:  # the interrupted run's
            (setup.ranks_dir / f"rank{setup.rank}.error.json").unlink(missing_ok=True)

    def keep_views(self, proto: Protocol) -> bool:
        # received tensors are kept only for what reads them after the run: the
        # attacks and a view dump; a run with neither keeps none (bounded memory)
        return proto.runtime.dump_views or bool(proto.attacks)

    def helper(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        helper = setup.backend.helper(setup.wired[2])
        c0 = time.process_time()  # its serving only, not its set-up (a dealer's imports)
        helper.serve()
        summary["train_cpu_s"] = round(time.process_time() - c0, 4)

    def party(self, setup: RankSetup, summary: dict[str, Any]) -> None:
        prep = self._data(setup)
        with setup.clock.phase("setup"):
            party = self._build(setup, prep)
        summary.update(party.run(self._saver(setup)))
        for phase, seconds in party.phase_s.items():
            setup.clock.add(phase, seconds)
        summary["train_cpu_s"] = round(party.train_cpu_s, 4)
        party.exchange.close()
        t_write = time.perf_counter()
        self._write_out(setup, prep, party, summary)
        setup.clock.add("write_out", time.perf_counter() - t_write)  # wall only: CPU is kept for set-up

    def conclude(self, setup: RankSetup, parts: list[RankSummary], started: float) -> None:
        result = build_result(
            setup.proto,
            setup.backend,
            setup.wired[2].options,
            setup.layout,
            parts,
            setup.session.pids,
            started=started,
            finished=time.time(),
        )
        write_result(setup.out_dir, result)

    # -- the party rank's steps ---------------------------------------------------------------
    def _note(self, setup: RankSetup) -> Callable[[str], None] | None:
        """The active rank's progress lines before training starts (its bar exists
        only once the models are built); None for the other ranks, or without progress."""
        if not (self.progress and setup.rank == 0):
            return None
        label = f"{setup.proto.name} [{setup.proto.exchange.backend}]"

        def note(text: str) -> None:
            print(f"[{label}] {text}", file=sys.stderr, flush=True)

        return note

    def _data(self, setup: RankSetup) -> Prepared:
        """The party's aligned, preprocessed data; the task it inferred is checked as
        a declared one is at load, and its fitted preprocessing kept with its model."""
        proto, role = setup.proto, setup.role
        channel = setup.wired[1]
        prep = prepare(proto, setup.layout, role, channel, self.data_dir, setup.clock, self._note(setup))
        if role.kind == "active" and proto.task is None:
            assert prep.data.task is not None
            check_task(proto, prep.data.task)
        if prep.preprocessor is not None:
            fitted = json.dumps(prep.preprocessor.fitted(), indent=1)
            write_private(setup.ranks_dir / f"rank{setup.rank}.preprocess.json", fitted)
        return prep

    def _build(self, setup: RankSetup, prep: Prepared) -> ActiveParty | PassiveParty:
        """The party, restored from the agreed checkpoint when the session resumes."""
        saved = self._checkpoint(setup)
        seeds = None if saved is None else saved.doc("party", PartyInfo, rank=setup.rank).noise_keys
        active = setup.role.kind == "active"
        cls = ActiveParty if active else PassiveParty
        on_epoch = EpochSender(self.epochs) if self.epochs is not None and active else None
        party = cls(
            setup.session,
            setup.backend,
            setup.wired[2],
            prep,
            progress=self.progress and setup.rank == 0,
            noise_keys=seeds,
            on_epoch=on_epoch,
        )
        if saved is not None:
            party.restore(saved)
            note = self._note(setup)
            if note is not None:
                note(f"resuming after epoch {saved.epoch} (step {saved.step}), as agreed")
        return party

    def _checkpoint(self, setup: RankSetup) -> PartyState | None:
        """The party state of the checkpoint every rank agreed on; None for a new run."""
        epoch = setup.session.resume_epoch
        if epoch is None:
            return None
        found = read_state(
            checkpoint_dir(setup.out_dir, setup.rank, epoch),
            rank=setup.rank,
            kind="checkpoint",
            protocol_digest=setup.proto.digest(),
        )
        m = found.manifest
        return PartyState(m.epoch, m.step, found.tensors, found.docs)

    def _saver(self, setup: RankSetup) -> Callable[[PartyState], None]:
        """Write this rank's checkpoint of a party state (and, under the test-only
        ``SECUREVFL_KILL_AFTER_CHECKPOINT``, die right after the named one)."""
        kill = os.environ.get(KILL_ENV, "")

        def save(state: PartyState) -> None:
            _write_party_state(
                setup, state, "checkpoint", checkpoint_dir(setup.out_dir, setup.rank, state.epoch)
            )
            if kill == f"{setup.rank}:{state.epoch}":
                os.kill(os.getpid(), signal.SIGKILL)

        return save

    def _write_out(
        self, setup: RankSetup, prep: Prepared, party: ActiveParty | PassiveParty, summary: dict[str, Any]
    ) -> None:
        """What the party rank owns after training: its defenses' statistics, its
        state, its final model, its first steps (tests), its view; and what the
        summary says of its data."""
        ranks_dir, r = setup.ranks_dir, setup.rank
        # the columns of its file it loaded, by name: after preprocessing, its inputs
        # (the fitted one-hot names would name categories found in its rows)
        pre = prep.preprocessor
        summary["loaded_columns"] = list(pre.inputs) if pre is not None else prep.data.columns
        summary["has_labels"] = prep.data.y is not None
        summary["n_aligned"] = len(prep.data.ids)
        summary["aligned_digest"] = hashlib.sha256("\n".join(prep.data.ids).encode()).hexdigest()[:16]
        write_own_report(setup.out_dir, party.own_report())  # its defenses' statistics: its alone
        save_tensors(party.state(), ranks_dir / f"rank{r}.state.pt")
        _write_party_state(setup, party.model_state(), "model", model_dir(setup.out_dir, r))
        trace = getattr(party, "trace", None)  # the active party's first steps (tests)
        if trace:
            save_tensors(trace, ranks_dir / f"rank{r}.trace.pt")
        ledger = setup.wired[0]
        if self.keep_views(setup.proto):  # the attacks read it after the run
            view = setup.save_view(party.own_view(), "view")
            summary["view_tags"] = sorted(view.received)
        else:
            summary["view_tags"] = sorted(ledger.received_view())


def _write_party_state(
    setup: RankSetup, state: PartyState, kind: Literal["checkpoint", "model"], folder: Path
) -> None:
    """A party state as a checkpoint or the final model (securevfl.app.checkpoints)."""
    write_state(
        folder,
        tensors=state.tensors,
        docs=state.docs,
        kind=kind,
        protocol_digest=setup.proto.digest(),
        run_id=setup.session.run_id,
        rank=setup.rank,
        role=setup.role.kind,
        party=setup.role.party,
        epoch=state.epoch,
        step=state.step,
    )
