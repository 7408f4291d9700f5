"""What every party does before training: load its own file, align by PSI, split,
standardize; build its defense stack and plan its steps under the privacy budget;
and the one training loop both sides run (:meth:`Party.run`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl import optim
from securevfl.config import PartySpec, Protocol
from securevfl.data.alignment import align_active, align_passive
from securevfl.data.partition import dataset_standardize, party_source
from securevfl.data.party_data import (
    PartyData,
    check_test_rows,
    load_party_data,
    scaling,
    split_indices,
    standardize,
)
from securevfl.data.preprocess import Preprocessor, fit_preprocessor
from securevfl.defenses.base import CollectiveContext, build_stack, run_collectives
from securevfl.defenses.spending import allowed_steps
from securevfl.errors import CheckpointError
from securevfl.exchange.base import ActiveExchange, ExchangeBackend, ExchangeContext, PassiveExchange, RunPlan
from securevfl.parties.state import (
    LoopState,
    ModelInfo,
    PartyInfo,
    PartyState,
    PreprocessState,
    RngState,
    aligned_digest,
    join_components,
    restore_rng,
    rng_state,
    split_components,
)
from securevfl.parties.task_kinds import TASKS
from securevfl.privacy.accountant import account
from securevfl.privacy.audit import AuditRecord, assumed_norms, audit_stack, released_buckets
from securevfl.privacy.step_budget import plan_for
from securevfl.records import EpochRecord, OwnReport
from securevfl.runtime.channel import Channel
from securevfl.runtime.layout import Layout, Role
from securevfl.runtime.ledger import Record
from securevfl.runtime.session import Session
from securevfl.schedule import batch_counts, eval_batches, planned_steps, rounds_of, schedule
from securevfl.seeding import generator
from securevfl.snapshot import ComponentState
from securevfl.timing import PhaseClock


@dataclass
class Prepared:
    """A party's aligned rows, split into train and test (features scaled, or
    preprocessed as its ``preprocess`` entry declares)."""

    data: PartyData  # aligned rows, in agreed order
    train_idx: np.ndarray
    test_idx: np.ndarray
    x_train: np.ndarray
    x_test: np.ndarray
    preprocessor: Preprocessor | None = None  # fitted on the training rows only
    # without a preprocess entry: the z-scoring statistics of the training rows, if scaled
    scaling: tuple[np.ndarray, np.ndarray] | None = None


def party_spec(proto: Protocol, role: Role) -> PartySpec:
    """The protocol entry of a party role."""
    return proto.parties.active if role.kind == "active" else proto.parties.passive[role.index]


def split_features(
    data: PartyData, train_idx: np.ndarray, test_idx: np.ndarray, spec: PartySpec, scale: bool
) -> tuple[np.ndarray, np.ndarray, Preprocessor | None]:
    """A party's model inputs on its training and test rows.

    With a ``preprocess`` entry its transformers are fitted on the training rows
    alone and then applied to every aligned row (``data.x`` and ``data.columns``
    become the transformed matrix and its column names); without one, the numeric
    columns are z-scored with training-row statistics when ``scale`` is on."""
    if data.frame is not None:
        assert spec.preprocess is not None
        pre = fit_preprocessor(spec.preprocess, data.party, data.frame.iloc[train_idx])
        data.x = pre.transform(data.frame)
        data.columns = pre.columns
        return data.x[train_idx], data.x[test_idx], pre
    x_tr, x_te = data.x[train_idx], data.x[test_idx]
    if data.x.shape[1] and scale:
        x_tr, x_te = standardize(x_tr, x_te)
    return x_tr, x_te, None


def prepare(
    proto: Protocol,
    layout: Layout,
    role: Role,
    channel: Channel,
    data_dir: Path,
    clock: PhaseClock,
    note: Callable[[str], None] | None = None,
) -> Prepared:
    """Load this party's own file, align it by PSI and split it; ``clock`` gets the
    data and alignment phases, ``note`` (the active rank's progress) hears when
    alignment starts and ends, since it can take minutes on large files."""
    spec = party_spec(proto, role)
    with clock.phase("data"):
        source = party_source(proto, role.party, data_dir)
        active = role.kind == "active"
        raw = load_party_data(
            source,
            role.party,
            is_active=active,
            preprocess=spec.preprocess,
            task=proto.task if active else None,
            task_has_classes=TASKS.get(proto.task).has_classes if active and proto.task else None,
        )
    channel.phase = "psi"
    with clock.phase("alignment"):
        if note is not None:
            note(f"entity alignment: {len(raw.ids)} IDs against {len(layout.passive)} passive parties (PSI)")
        if role.kind == "active":
            order = align_active(channel, layout, raw.ids)
        else:
            order = align_passive(channel, layout, role.rank, raw.ids)
    if note is not None:
        note(f"entity alignment: {len(order)} rows in common ({clock.seconds['alignment']:.1f} s)")
    channel.phase = "setup"  # what follows (e.g. key exchange) is set-up, not PSI
    data = raw.take(order)
    train_idx, test_idx = split_indices(
        len(data.ids), proto.dataset.test_fraction, generator(proto.training.seed, "split")
    )
    check_test_rows(role.party, len(test_idx), data.classes)
    with clock.phase("data"):
        scale = dataset_standardize(proto, data_dir)
        stats = scaling(data.x[train_idx]) if data.frame is None and scale and data.x.shape[1] else None
        x_tr, x_te, pre = split_features(data, train_idx, test_idx, spec, scale)
    return Prepared(data, train_idx, test_idx, x_tr, x_te, pre, stats)


class Party:
    """What every party holds: its session, protocol, exchange context, prepared
    rows and its defense stack (in protocol-file order). Each role adds its own
    models and exchange in :meth:`_setup`."""

    side: str  # "active" | "passive"
    exchange: ActiveExchange | PassiveExchange  # this rank's side of the backend, set by _setup

    def __init__(
        self,
        session: Session,
        backend: type[ExchangeBackend],
        ctx: ExchangeContext,
        prep: Prepared,
        *,
        progress: bool,
        noise_keys: list[dict[str, Any]] | None = None,
        on_epoch: Callable[[EpochRecord], None] | None = None,
    ):
        """``noise_keys``: the defenses' private noise keys of the checkpoint a
        run resumes from (:meth:`restore` then puts the rest of its state back).
        ``on_epoch``: called with an :class:`~securevfl.records.EpochRecord` as
        each epoch ends (the active party's; a passive party has none to give)."""
        self.on_epoch = on_epoch
        self.s = session
        self.proto = session.proto
        self.checked = ctx.checked  # resolved at load, passed down with the exchange context
        self.components = ctx.components
        self.ctx = ctx
        self.prep = prep
        self.device = ctx.device
        self.backend = backend
        self.spec = self._spec()
        self.stack = build_stack(
            self.proto, self.components, self.spec.name, self.side, self.spec.defenses, noise_keys=noise_keys
        )
        self.loop: LoopState | None = None  # where a resumed run starts (restore)
        n_train = len(prep.train_idx)
        self.n_train = n_train
        self.phase_s: dict[str, float] = {}  # training and evaluation seconds, set by run()
        self.released_scales: dict[str, float] = {}  # per assumed mechanism, a power-of-two bucket
        self.train_cpu_s = 0.0  # CPU seconds of training (no evaluation), set by run()
        self.planned_steps = planned_steps(n_train, self.proto.training)
        self.allowed_steps = allowed_steps(self.checked, n_train)
        self._setup(prep, progress=progress)
        self._collective(n_train)

    def _collective(self, n_train: int) -> None:
        """Every party rank enters the defenses' collective set-up steps here, once
        the exchange is up and before the first training step (docs/design.md §5 seam)."""
        self.ctx.channel.phase = "setup"
        comm = CollectiveContext(
            self.proto,
            self.components,
            self.s.layout,
            self.s.rank,
            self.spec.name,
            self.side,
            n_train,
            frozenset(self.backend.capabilities),
        )
        run_collectives(self.stack, comm)

    def privacy_spent(self, steps: int) -> dict[str, Any]:
        """This party's own accounting over ``steps`` training steps (the
        accountant's output: ``{party: {"mechanisms", "total"}}``; empty without a
        DP mechanism)."""
        plan = plan_for(steps, len(self.prep.train_idx), self.proto.training)
        mechs = self.stack.mechanisms(plan)
        return account({self.spec.name: mechs}, self.proto.privacy.delta) if mechs else {}

    def audit(self, steps: int) -> list[AuditRecord]:
        """The audit of this party's own DP mechanisms after training (docs/privacy.md,
        "The audit"): each declared mechanism's hook run on canaries at its boundary, on a
        copy of the defense under fresh noise keys. An assumed boundary is also audited at
        the scale this party released, measured here from its own rows and kept only as a
        power-of-two bucket (also saved with its model, for ``securevfl audit``)."""
        opts = self.proto.privacy.audit
        plan = plan_for(steps, len(self.prep.train_idx), self.proto.training)
        if not opts.enabled or not self.stack.mechanisms(plan):
            return []
        t0 = time.perf_counter()
        norms = assumed_norms(self.stack, plan)
        rows = self.released_rows() if norms else None
        self.released_scales = {} if rows is None else released_buckets(rows, norms)
        records = audit_stack(
            self.stack,
            plan,
            delta=self.proto.privacy.delta,
            trials=opts.trials,
            confidence=opts.confidence,
            released=self.released_scales,
        )
        self.phase_s["audit"] = time.perf_counter() - t0
        return records

    def released_rows(self) -> torch.Tensor | None:
        """This party's released rows before noise (passive side), for the released scale."""
        return None

    def privacy_summary(self, steps: int) -> dict[str, Any]:
        """This party's own accounting over the steps actually run, the audit of its
        mechanisms and what its defenses declared public (merged into ``result.json``
        by rank 0). The accounting and the declarations follow from the protocol and
        the step count alone; an audit record holds counts of the audit's own canary
        trials and at most one coarse statistic of the data (a released-scale bucket,
        SECURITY.md §7); the defenses' statistics of the data stay in :meth:`own_report`."""
        privacy = self.privacy_spent(steps)
        records = self.audit(steps) if privacy else []
        if records:
            privacy[self.spec.name]["audit"] = [r.to_json() for r in records]
        return {
            "privacy": privacy,
            "defense_report": self.stack.public_report(),
            "replaced_builtins": self.stack.replaced or None,
            "planned_steps": self.planned_steps,
            "allowed_steps": self.allowed_steps,
        }

    # -- the one training loop -------------------------------------------------------
    def run(self, save: Callable[[PartyState], None] | None = None) -> dict[str, Any]:
        """Train and evaluate on the shared schedule; both sides run this loop.

        Every party derives the same epochs, batches and FedBCD rounds from the
        protocol (``securevfl.schedule``), so their messages pair up without any
        coordination; the side-specific work is :meth:`train_step`,
        :meth:`train_round` and :meth:`evaluate`, and what a side reports is
        :meth:`run_summary`. After every ``training.checkpoint_every`` epochs but
        the last, ``save`` gets this party's :meth:`checkpoint_state`; a party
        restored (:meth:`restore`) from one starts after its epoch, on the same schedule."""
        tr = self.proto.training
        ch = self.ctx.channel
        done = self.loop
        history: list[dict[str, Any]] = [] if done is None else list(done.history)
        metrics: dict[str, Any] = {} if done is None else dict(done.metrics)
        step_times: list[float] = [] if done is None else list(done.step_times)
        step = 0 if done is None else done.step
        start = 0 if done is None else done.epoch
        t_run, t_eval, t_save = time.perf_counter(), 0.0, 0.0
        c_run, c_eval, c_save = time.process_time(), 0.0, 0.0
        self.exchange.expect(
            RunPlan(
                batch_counts(self.n_train, tr, self.allowed_steps, first_epoch=start),
                tuple(len(b) for b in eval_batches(len(self.prep.test_idx), tr.batch_size)),
            )
        )
        for epoch, batches, last in schedule(self.n_train, tr, self.allowed_steps):
            if epoch < start:  # done before the checkpoint this run resumed from
                continue
            ch.phase = "train"
            losses: list[float] = []
            for rnd in rounds_of(batches, tr.local_steps):
                ch.round = step
                t0 = time.perf_counter()
                if tr.local_steps == 1:
                    loss = self.train_step(rnd[0])
                    losses += [] if loss is None else [loss]
                else:
                    losses += self.train_round(rnd) or []
                step_times += [(time.perf_counter() - t0) / len(rnd)] * len(rnd)
                step += len(rnd)
                self.after_round(len(rnd))
            row: dict[str, Any] = {"epoch": epoch + 1}
            if losses:
                row["train_loss"] = float(np.mean(losses))
            if last or (epoch + 1) % tr.eval_every == 0:
                ch.phase, ch.round = "eval", epoch
                t0, c0 = time.perf_counter(), time.process_time()
                metrics = self.evaluate() or metrics
                t_eval += time.perf_counter() - t0
                c_eval += time.process_time() - c0
                row.update(metrics)
            history.append(row)
            self.after_epoch(row, step=step, elapsed_s=time.perf_counter() - t_run)
            every = tr.checkpoint_every
            if save is not None and every is not None and not last and (epoch + 1) % every == 0:
                t0, c0 = time.perf_counter(), time.process_time()
                prior = (0.0, 0.0) if done is None else (done.training_s, done.evaluation_s)
                self.loop = LoopState(
                    epoch=epoch + 1,
                    step=step,
                    history=history,
                    metrics=metrics,
                    step_times=step_times,
                    training_s=prior[0] + t0 - t_run - t_eval - t_save,
                    evaluation_s=prior[1] + t_eval,
                )
                save(self.checkpoint_state())
                t_save += time.perf_counter() - t0
                c_save += time.process_time() - c0
        self.finish()
        self.steps = step
        self.epochs_done = len(history)
        self.phase_s = {
            "training": time.perf_counter() - t_run - t_eval - t_save,
            "evaluation": t_eval,
            **({"checkpoints": t_save} if t_save else {}),
        }
        self.train_cpu_s = time.process_time() - c_run - c_eval - c_save
        return {
            "train_steps": step,
            "n_train": self.n_train,
            **self.run_summary(history, metrics, step_times),
            **self.privacy_summary(step),
        }

    def train_step(self, idx: np.ndarray) -> float | None:
        """One training step on the batch of rows ``idx``; A returns its loss."""
        raise NotImplementedError

    def train_round(self, batches: list[np.ndarray]) -> list[float] | None:
        """One FedBCD round over ``batches`` (``training.local_steps`` > 1)."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, Any] | None:
        """One pass over the test rows; A returns its metrics."""
        raise NotImplementedError

    def after_round(self, batches: int) -> None:
        """Called after every round of ``batches`` training batches (progress)."""

    def after_epoch(self, row: dict[str, Any], *, step: int, elapsed_s: float) -> None:
        """Called with each epoch's history row, the training steps run so far and
        the seconds since training started (progress, epoch records)."""

    def finish(self) -> None:
        """Called once the schedule is done."""

    def run_summary(
        self, history: list[dict[str, Any]], metrics: dict[str, Any], step_times: list[float]
    ) -> dict[str, Any]:
        """What this side adds to its rank summary."""
        return {}

    def own_report(self) -> OwnReport:
        """What this party keeps for itself after the run and sends nowhere
        (``ranks/rank<R>.defense_report.json``, SECURITY.md §7): its defenses' run
        statistics, computed from its data, and its model's input column count
        after their feature selection."""
        columns = getattr(self, "columns", None)
        return OwnReport(
            rank=self.s.rank,
            party=self.spec.name,
            columns=None if columns is None else len(columns),
            defenses=self.stack.report(),
        )

    def _setup(self, prep: Prepared, *, progress: bool) -> None:
        raise NotImplementedError

    # -- checkpoints and the saved model (docs/design.md §12) --------------------------------
    def model_tensors(self) -> dict[str, Any]:
        """This side's models as state dicts (``models.pt``)."""
        raise NotImplementedError

    def load_model_tensors(self, saved: dict[str, Any]) -> None:
        raise NotImplementedError

    def optimizer(self) -> optim.Optimizer:
        """The party's own optimizer (bottom/top models and defense modules)."""
        raise NotImplementedError

    def _common_tensors(self, *, model: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """Files both a checkpoint and the final model hold: models, exchange, defenses
        (in a ``model``, without their secret streams: :meth:`DefenseStack.model_state`)."""
        ex = self.exchange_state()
        states = self.stack.model_state() if model else self.stack.checkpoint_state()
        d_tensors, d_meta = split_components(states)
        tensors = {"models": self.model_tensors(), "exchange": ex.tensors, "defenses": d_tensors}
        docs = {"exchange": ex.meta, "defenses": d_meta, "preprocess": self.preprocess_state().model_dump()}
        return tensors, docs

    def exchange_state(self) -> Any:
        return self.exchange.checkpoint_state()

    def preprocess_state(self) -> PreprocessState:
        """The fitted transform from this party's raw columns to its model inputs."""
        prep = self.prep
        columns = list(getattr(self, "columns", prep.data.columns))
        if prep.preprocessor is not None:
            pre = prep.preprocessor
            return PreprocessState(inputs=list(pre.inputs), columns=columns, fitted=pre.fitted())
        if prep.scaling is not None:
            mu, sd = prep.scaling
            return PreprocessState(
                inputs=list(prep.data.columns),
                columns=columns,
                mean=[float(v) for v in mu.ravel()],
                scale=[float(v) for v in sd.ravel()],
            )
        return PreprocessState(inputs=list(prep.data.columns), columns=columns)

    def party_info(self) -> PartyInfo:
        return PartyInfo(
            party=self.spec.name,
            side=self.side,
            noise_keys=self.stack.noise_keys(),
            aligned_digest=aligned_digest(list(self.prep.data.ids)),
            n_train=self.n_train,
            columns=list(getattr(self, "columns", self.prep.data.columns)),
        )

    def checkpoint_state(self) -> PartyState:
        """Everything this party needs to go on from here exactly (module
        docstring of securevfl.parties.state); nothing of another party's."""
        assert self.loop is not None, "checkpoint_state outside the training loop"
        tensors, docs = self._common_tensors()
        rng_t, rng_d = rng_state()
        tensors |= {"optimizer": self.optimizer().state_dict(), "rng": rng_t}
        docs |= {
            "rng": rng_d,
            "loop": self.loop.model_dump(),
            "party": self.party_info().model_dump(),
            "ledger": [asdict(r) for r in self.ctx.channel.ledger.all_records()],
        }
        return PartyState(self.loop.epoch, self.loop.step, tensors, docs)

    def restore(self, state: PartyState) -> None:
        """Put a checkpoint of this party back, after construction and before
        :meth:`run`. Its inputs must be what they were: the same aligned IDs and
        model input columns (a changed data file is refused, naming the field)."""
        rank = self.s.rank
        info: PartyInfo = state.doc("party", PartyInfo, rank=rank)
        now = self.party_info()
        for field in ("party", "side", "aligned_digest", "n_train", "columns", "noise_keys"):
            if getattr(info, field) != getattr(now, field):
                raise CheckpointError(
                    f"rank {rank} ({self.spec.name}): party.json: field '{field}' differs from this run's "
                    "(its data file, or the protocol, changed since the checkpoint was written)"
                )
        self.loop = state.doc("loop", LoopState, rank=rank)
        self.load_model_tensors(state.tensor("models", rank=rank))
        self.optimizer().load_state_dict(state.tensor("optimizer", rank=rank))
        ex = state.tensor("exchange", rank=rank), state.docs.get("exchange", {})
        self.exchange.restore(ComponentState.from_parts(*ex))
        defenses = state.tensor("defenses", rank=rank), state.docs.get("defenses", [])
        self.stack.restore(join_components(*defenses))
        restore_rng(state.tensor("rng", rank=rank), state.doc("rng", RngState, rank=rank))
        ledger = self.ctx.channel.ledger
        try:
            old = [Record(**{**r, "shape": tuple(r["shape"])}) for r in state.docs.get("ledger", [])]
        except TypeError as exc:
            raise CheckpointError(f"rank {rank}: ledger.json: a malformed record ({exc})") from None
        ledger.prepend(old)

    def model_state(self) -> PartyState:
        """What federated prediction needs of this party (``kind: model``): its
        models, its exchange state (weights or shares), its defenses' evaluation
        state (no noise key: a prediction draws fresh ones), its fitted preprocessing
        and what the model is (:class:`ModelInfo`)."""
        tensors, docs = self._common_tensors(model=True)
        info = ModelInfo(
            party=self.spec.name,
            side=self.side,
            task=self.task_info(),
            columns=list(getattr(self, "columns", self.prep.data.columns)),
            protocol=self.proto.model_dump(mode="json"),
            code_dir=self.components.code.beside,
        )
        docs["model"] = info.model_dump()
        if self.released_scales:  # power-of-two buckets only (securevfl audit RUN reads them)
            docs["audit"] = {"released_scale": dict(self.released_scales)}
        return PartyState(self.epochs_done, self.steps, tensors, docs)

    def task_info(self) -> dict[str, Any] | None:
        """The active party's task settings; None on a passive party."""
        return None

    def _spec(self) -> PartySpec:
        return party_spec(self.proto, self.s.role)
