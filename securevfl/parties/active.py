"""The active party A: labels, optional own features, its block of the
interactive layer, the bias and the top model (docs/design.md §3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from securevfl import optim
from securevfl.exchange.base import ActiveExchange
from securevfl.models import make_optimizer
from securevfl.parties.common import Party, Prepared
from securevfl.parties.progress import Progress
from securevfl.parties.split_model import ActiveModel
from securevfl.parties.task_kinds import TASKS
from securevfl.records import EpochRecord, OwnView, PartyPrivacy
from securevfl.schedule import eval_batches


class ActiveParty(Party):
    side = "active"
    exchange: ActiveExchange

    def _setup(self, prep: Prepared, *, progress: bool) -> None:
        proto = self.proto
        tr = proto.training
        data = prep.data
        assert data.y is not None and data.task is not None
        # the task kind (registered by name) owns the output width, loss and metrics
        self.task = TASKS.get(data.task)(data.y[prep.train_idx], data.classes, tr.loss or "mse")
        self.classes = None if data.classes is None else len(data.classes)
        self.y_train = self.stack.labels(self.task.targets(data.y[prep.train_idx]), classes=self.classes)
        self.y_test = self.task.targets(data.y[prep.test_idx])
        self.y_test_raw = np.asarray(data.y[prep.test_idx])
        self.x_train = torch.as_tensor(prep.x_train)
        self.x_test = torch.as_tensor(prep.x_test)
        # the one model class prediction rebuilds too; a factory is called here, in this rank alone
        self.model = ActiveModel.build(
            proto,
            self.components.code,
            self.s.role,
            self.task,
            self.stack,
            self.x_train.shape[1],
            self.device,
            preprocess=self.preprocess_state(),
            probe=self.x_train,
        )
        self.opt = make_optimizer(self.model.parameters(), tr)
        self.exchange = self.model.open_exchange(self.backend, self.ctx)
        self.held_at_start = {k: v.clone() for k, v in self.exchange.state().items()}
        self.n_train = len(prep.train_idx)
        self.trace: list[dict[str, torch.Tensor]] = []
        # what A legitimately knows, kept for attacks run as A: the z each exchange
        # forward revealed to it, with the row positions of that batch
        self._keep_view = proto.runtime.record_views and (proto.runtime.dump_views or bool(proto.attacks))
        self.forwards: list[dict[str, Any]] = []
        self.revealed_z: list[torch.Tensor] = []
        self.progress = Progress(
            f"{proto.name} [{proto.exchange.backend}]",
            self.allowed_steps,
            enabled=progress,
        )
        if self.allowed_steps < self.planned_steps:
            budget = proto.privacy.budget
            assert budget is not None
            self.progress.note(
                f"privacy budget eps={budget.epsilon:g} (delta={proto.privacy.delta:g}) allows "
                f"{self.allowed_steps} of the {self.planned_steps} planned training steps; "
                "training stops there"
            )

    # -- one forward through the whole split model ------------------------------------
    def _logits(
        self,
        idx: np.ndarray,
        x: torch.Tensor,
        *,
        train: bool,
        local: int | None = None,
        record_grad: bool = False,
    ):
        """``local``: batch r of a FedBCD round, from the embeddings kept for the
        round (``record_grad``: the pass at the round's parameters whose dL/dh'_i
        are sent; it is also the one recorded as A's view)."""
        if local is None:
            zp = self.exchange.forward(len(idx), train=train)
        else:
            zp = self.exchange.forward_local(local, record_grad=record_grad)
        zp = zp.to(self.device)
        if self._keep_view and (local is None or record_grad):
            phase = "train" if train else "eval"
            self.forwards.append({"phase": phase, "round": self.ctx.channel.round, "rows": np.array(idx)})
            self.revealed_z.append(zp.detach().cpu().clone())
        zp = zp.requires_grad_(train)
        z, logits = self.model.forward(zp, x[idx])
        return zp, z, logits

    def _forward_backward(
        self, idx: np.ndarray, *, local: int | None = None, record_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss on a training batch and its gradients (parameters' and dL/dz's);
        no optimizer step. Returns the loss and dL/dz."""
        y = self.y_train[idx].to(self.device)
        zp, z, logits = self._logits(idx, self.x_train, train=True, local=local, record_grad=record_grad)
        loss = self.task.loss(logits, y)
        if not record_grad and len(self.trace) < self.proto.runtime.trace_steps:
            self.trace.append({"z": zp.detach().cpu().clone(), "loss": loss.detach().cpu().clone()})
        extra = self.stack.top_loss(z, logits, y, self.exchange.embeddings())
        total = loss if extra is None else loss + extra
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        assert zp.grad is not None
        return loss.detach(), zp.grad

    def train_step(self, idx: np.ndarray) -> float:
        loss, grad_z = self._forward_backward(idx)
        self.opt.step()
        self.exchange.backward(grad_z)
        return float(loss)

    def train_round(self, batches: list[np.ndarray]) -> list[float]:
        """One FedBCD round (``training.local_steps`` = R; docs/methods/crdp-fl.md §2.2 Eq. 14):
        receive each passive party's embeddings of the R batches in one message;
        compute dL/dh'_i of every batch at the round's parameters and send them in
        one message per party; then take R local steps on those same, stale
        embeddings, A's own part (bottom model, top model, W_i) fresh at each."""
        self.exchange.receive_round([len(b) for b in batches])
        for r, idx in enumerate(batches):
            _, grad_z = self._forward_backward(idx, local=r, record_grad=True)
            self.exchange.backward_local(grad_z)
        self.exchange.send_round_grads()
        losses = []
        for r, idx in enumerate(batches):
            loss, grad_z = self._forward_backward(idx, local=r)
            self.opt.step()
            self.exchange.backward_local(grad_z)
            losses.append(float(loss))
        return losses

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        scores = []
        self.stack.begin_eval()
        for idx in eval_batches(len(self.y_test), self.proto.training.batch_size):
            _, _, logits = self._logits(idx, self.x_test, train=False)
            self.stack.observe_eval(logits, self.y_test[idx].to(self.device), self.exchange.embeddings())
            scores.append(self.task.outputs_to_scores(logits).cpu())
        return self.task.metrics(torch.cat(scores).numpy(), self.y_test_raw)

    def after_round(self, batches: int) -> None:
        for _ in range(batches):
            self.progress.step()

    def after_epoch(self, row: dict[str, Any], *, step: int, elapsed_s: float) -> None:
        loss = row.get("train_loss")
        info = (f"loss {loss:.4f} " if loss is not None else "") + self.task.headline(row)
        self.progress.epoch(row["epoch"], self.proto.training.epochs, info.strip())
        if self.on_epoch is not None:
            self.on_epoch(self.epoch_record(row, step=step, elapsed_s=elapsed_s))

    def epoch_record(self, row: dict[str, Any], *, step: int, elapsed_s: float) -> EpochRecord:
        """What the progress line says of an epoch, typed: its history row, the
        steps and seconds so far, and this party's own privacy spent so far."""
        return EpochRecord(
            epoch=row["epoch"],
            epochs=self.proto.training.epochs,
            step=step,
            train_loss=row.get("train_loss"),
            metrics={k: v for k, v in row.items() if k not in ("epoch", "train_loss")},
            elapsed_s=elapsed_s,
            privacy={p: PartyPrivacy.from_account(p, e) for p, e in self.privacy_spent(step).items()},
        )

    def finish(self) -> None:
        self.progress.close()

    def run_summary(
        self, history: list[dict[str, Any]], metrics: dict[str, Any], step_times: list[float]
    ) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "positive_class": self.task.positive_class,
            "test_accuracy": metrics.get("test_accuracy"),
            "test_auc": metrics.get("test_auc"),
            **{k: metrics.get(k) for k in self.task.metric_keys},
            "history": history,
            "time_per_step_s": float(np.mean(step_times)) if step_times else 0.0,
            "step_time_s": {
                "first": step_times[0] if step_times else None,
                "median": float(np.median(step_times)) if step_times else None,
                "mean_after_first": float(np.mean(step_times[1:])) if len(step_times) > 1 else None,
            },
            "n_test": len(self.y_test),
            "n_aligned": len(self.prep.data.ids),
            "classes": self.classes,
        }

    def own_view(self) -> OwnView:
        """Plaintext parameters of the exchange this party held before training and,
        when attacks run as A, what A legitimately knows: aligned IDs and split, its
        true labels, the z the exchange revealed at every forward (``z``, one per
        entry of ``forwards``: phase, round, row positions into the train or test
        rows), its own final top model and bias, and the interactive blocks W_i it
        holds in the clear (``interactive``: ``{"interactive.<party>": weight}``; empty
        under the backends that share or encrypt them) with, for an active party
        with its own features, its part of z on the test rows (``own_z_test``):
        together the whole server function of the split model (attacks/server.py)."""
        view: dict[str, object] = {"held_at_start": self.held_at_start}
        if not self._keep_view:
            return OwnView(view)
        prep = self.prep
        assert prep.data.y is not None
        view.update(
            ids=list(prep.data.ids),
            train_idx=np.asarray(prep.train_idx),
            test_idx=np.asarray(prep.test_idx),
            y_train=torch.as_tensor(prep.data.y[prep.train_idx]),
            y_test=self.y_test.clone(),
            classes=self.classes,
            forwards=self.forwards,
            z=self.revealed_z,
            top={k: v.detach().cpu() for k, v in self.model.top.state_dict().items()},
            bias=self.model.bias.detach().cpu(),
            interactive={k: v for k, v in self.exchange.state().items() if k.startswith("interactive.")},
            own_z_test=self._own_z_test(),
        )
        return OwnView(view)

    @torch.no_grad()
    def _own_z_test(self) -> torch.Tensor | None:
        """A's own contribution W_A f_A(x_A) to z on the test rows (None for a
        label-only active party)."""
        z = self.model.own_z(self.x_test)
        return None if z is None else z.detach().cpu()

    # -- checkpoints and the saved model ----------------------------------------------
    def model_tensors(self) -> dict[str, Any]:
        out = self.model.tensors()
        out["held_at_start"] = dict(self.held_at_start)
        out["trace"] = list(self.trace)
        return out

    def load_model_tensors(self, saved: dict[str, Any]) -> None:
        self.model.load(saved)
        self.held_at_start = dict(saved["held_at_start"])
        self.trace = list(saved["trace"])

    def optimizer(self) -> optim.Optimizer:
        return self.opt

    def task_info(self) -> dict[str, Any] | None:
        """The task kind, its classes and, for regression, the target's scaling
        (mean and scale of the training labels), as the task holds them."""
        return self.model.task_info()

    def state(self) -> dict[str, torch.Tensor]:
        out = self.model.state()
        out.update(self.exchange.state())
        return out
