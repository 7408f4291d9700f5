"""A passive party P_i: its features, bottom model f_i and embedding defenses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from securevfl import optim
from securevfl.exchange.base import PassiveExchange
from securevfl.models import make_optimizer
from securevfl.parties.common import Party, Prepared
from securevfl.parties.split_model import PassiveModel
from securevfl.privacy.audit import SCALE_ROWS
from securevfl.records import OwnView
from securevfl.schedule import eval_batches


class PassiveParty(Party):
    side = "passive"
    exchange: PassiveExchange

    def _setup(self, prep: Prepared, *, progress: bool) -> None:
        proto = self.proto
        x_tr, cols = self.stack.select_features(prep.x_train, prep.data.columns)
        x_te, _ = self.stack.select_features(prep.x_test, prep.data.columns)
        self.columns = cols
        self.x_train = torch.as_tensor(x_tr)
        self.x_test = torch.as_tensor(x_te)
        # the one model class prediction rebuilds too; a factory is called here, in its owner's rank alone
        self.model = PassiveModel.build(
            proto,
            self.components.code,
            self.s.role,
            self.stack,
            self.x_train.shape[1],
            self.device,
            preprocess=self.preprocess_state(),
            probe=self.x_train,
        )
        self.opt = make_optimizer(self.model.parameters(), proto.training)
        self.exchange = self.model.open_exchange(self.backend, self.ctx)
        self.n_train = len(prep.train_idx)
        self.n_test = len(prep.test_idx)
        self.sent: list[tuple[int, torch.Tensor]] = []
        # what this party legitimately knows, kept for attacks run as this party
        self._keep_view = proto.runtime.record_views and (proto.runtime.dump_views or bool(proto.attacks))
        self.forwards: list[dict[str, Any]] = []
        self.revealed_grads: list[torch.Tensor] = []

    def train_step(self, idx: np.ndarray) -> None:
        x = self.x_train[idx].to(self.device)
        h, h2 = self.model.forward(x, train=True)
        if self.proto.runtime.dump_views:
            self.sent.append((self.ctx.channel.round, h2.detach().cpu().clone()))
        self.exchange.forward(h2, train=True)
        revealed = self.exchange.backward()
        self._update(idx, x, h, h2, revealed)

    def train_round(self, batches: list[np.ndarray]) -> None:
        """One FedBCD round (``training.local_steps`` = R; docs/methods/crdp-fl.md §2.2 Eq. 14):
        release h'_i of the R batches in one message, receive dL/dh'_i of all R
        (computed by A at the round's parameters) in one message, then take R
        local steps. In each the own h is recomputed with the current bottom model
        and differentiated through the defenses' noise-free ``embed_local``; the
        released, noised copies are never reused here."""
        sent = []
        with torch.no_grad():
            for idx in batches:
                _, h2 = self.model.forward(self.x_train[idx], train=True)
                if self.proto.runtime.dump_views:
                    self.sent.append((self.ctx.channel.round, h2.detach().cpu().clone()))
                sent.append(h2)
        self.exchange.send_round(sent)
        grads = self.exchange.receive_round_grads([len(b) for b in batches])
        for idx, revealed in zip(batches, grads, strict=True):
            x = self.x_train[idx].to(self.device)
            h = self.model.bottom(x)
            self._update(idx, x, h, self.stack.embed_local(h), revealed)

    def _update(
        self, idx: np.ndarray, x: torch.Tensor, h: torch.Tensor, h2: torch.Tensor, revealed: torch.Tensor
    ) -> None:
        """One optimizer step of the bottom model (and defense modules) from the
        gradient the exchange revealed for the sent ``h2``."""
        if self._keep_view:
            self.forwards.append({"phase": "train", "round": self.ctx.channel.round, "rows": idx.copy()})
            self.revealed_grads.append(revealed.detach().cpu().clone())
        g = self.stack.grad(revealed)
        obj = (h2 * g).sum()
        local = self.stack.local_loss(x, h)
        if local is not None:
            obj = obj + local
        self.opt.zero_grad(set_to_none=True)
        obj.backward()
        self.opt.step()

    @torch.no_grad()
    def evaluate(self) -> None:
        for idx in eval_batches(self.n_test, self.proto.training.batch_size):
            self.exchange.forward(self.model.forward(self.x_test[idx], train=False)[1], train=False)

    @torch.no_grad()
    def released_rows(self) -> torch.Tensor:
        """The noise-free part of what this party released for its first training rows, with
        its final bottom model (the audit's released scale; never sent). In evaluation mode, so
        that a bottom with batch statistics saves them as training left them."""
        x = self.x_train[:SCALE_ROWS].to(self.device)
        training = self.model.bottom.training
        self.model.bottom.eval()
        try:
            return self.stack.embed_local(self.model.bottom(x)).detach().cpu()
        finally:
            self.model.bottom.train(training)

    def own_view(self) -> OwnView:
        """What this party itself computed and sent (for wire audits), and, when
        attacks run as this party, what it legitimately knows: the aligned IDs and
        split (every party derives them), its own raw features, the gradient the
        exchange revealed to it at each training step (``grads``, one per entry of
        ``forwards``; row positions index the training rows), its model inputs
        (``x_*``) and their fitted preprocessing (``preprocess``, from which its bottom
        model is rebuilt), its final bottom model and defense modules' states, and its final
        bottom outputs before (``h_*``) and after (``sent_*``) its embedding defenses."""
        view: dict[str, object] = {"embeddings": self.sent}
        if not self._keep_view:
            return OwnView(view)
        prep = self.prep
        with torch.no_grad():
            hs = {}
            for split, x in (("train", self.x_train), ("test", self.x_test)):
                h, h2 = self.model.forward(x, train=False)
                hs[f"h_{split}"] = h.detach().cpu()
                hs[f"sent_{split}"] = h2.detach().cpu()
        view.update(
            ids=list(prep.data.ids),
            train_idx=np.asarray(prep.train_idx),
            test_idx=np.asarray(prep.test_idx),
            columns=list(prep.data.columns),
            preprocess=self.preprocess_state().model_dump(),
            x_raw=torch.as_tensor(np.asarray(prep.data.x, dtype=np.float32)),
            forwards=self.forwards,
            grads=self.revealed_grads,
            x_train=self.x_train.detach().cpu(),
            x_test=self.x_test.detach().cpu(),
            bottom={k: v.detach().cpu() for k, v in self.model.bottom.state_dict().items()},
            defense_modules=[
                {k: v.detach().cpu() for k, v in m.state_dict().items()} for m in self.stack.modules()
            ],
            **hs,
        )
        return OwnView(view)

    # -- checkpoints and the saved model ----------------------------------------------
    def model_tensors(self) -> dict[str, Any]:
        return self.model.tensors()

    def load_model_tensors(self, saved: dict[str, Any]) -> None:
        self.model.load(saved)

    def optimizer(self) -> optim.Optimizer:
        return self.opt

    def state(self) -> dict[str, torch.Tensor]:
        out = self.model.state()
        out.update(self.exchange.state())
        return out
