"""A passive party P_i: its features, bottom model f_i and embedding defenses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from securevfl import optim
from securevfl.components import components_of
from securevfl.exchange.base import PassiveExchange
from securevfl.models import PROBE_ROWS, bottom_label, build_bottom, check_output, make_optimizer
from securevfl.parties.common import Party, Prepared
from securevfl.parties.state import module_states
from securevfl.privacy.audit import SCALE_ROWS
from securevfl.records import OwnView
from securevfl.schedule import eval_batches


class PassiveParty(Party):
    side = "passive"
    exchange: PassiveExchange

    def _setup(self, prep: Prepared, *, progress: bool) -> None:
        proto = self.proto
        spec = self.spec
        x_tr, cols = self.stack.select_features(prep.x_train, prep.data.columns)
        x_te, _ = self.stack.select_features(prep.x_test, prep.data.columns)
        self.columns = cols
        self.x_train = torch.as_tensor(x_tr)
        self.x_test = torch.as_tensor(x_te)
        assert spec.model is not None
        # the party's own bottom model: a factory is called here, in its owner's rank alone
        path = f"parties.passive[{self.s.role.index}].model"
        self.bottom = build_bottom(
            spec.model,
            self.x_train.shape[1],
            seed=proto.training.seed,
            party=spec.name,
            code=components_of(proto).code,
            path=path,
            layout=self.preprocess_state().layout(spec.name),
        ).to(self.device)
        probe = self.x_train[:PROBE_ROWS].to(self.device)
        check_output(self.bottom, probe, spec.model.out, what=bottom_label(spec.model, spec.name), path=path)
        modules = [self.bottom, *self.stack.modules()]
        for m in modules:
            m.to(self.device)
        self.opt = make_optimizer([p for m in modules for p in m.parameters()], proto.training)
        self.exchange = self.backend.passive(self.ctx)
        self.n_train = len(prep.train_idx)
        self.n_test = len(prep.test_idx)
        self.sent: list[tuple[int, torch.Tensor]] = []
        # what this party legitimately knows, kept for attacks run as this party
        self._keep_view = proto.runtime.record_views and (proto.runtime.dump_views or bool(proto.attacks))
        self.forwards: list[dict[str, Any]] = []
        self.revealed_grads: list[torch.Tensor] = []

    def train_step(self, idx: np.ndarray) -> None:
        x = self.x_train[idx].to(self.device)
        h = self.bottom(x)
        h2 = self.stack.embed(h, train=True)
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
                h2 = self.stack.embed(self.bottom(self.x_train[idx].to(self.device)), train=True)
                if self.proto.runtime.dump_views:
                    self.sent.append((self.ctx.channel.round, h2.detach().cpu().clone()))
                sent.append(h2)
        self.exchange.send_round(sent)
        grads = self.exchange.receive_round_grads([len(b) for b in batches])
        for idx, revealed in zip(batches, grads, strict=True):
            x = self.x_train[idx].to(self.device)
            h = self.bottom(x)
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
            h = self.bottom(self.x_test[idx].to(self.device))
            self.exchange.forward(self.stack.embed(h, train=False), train=False)

    @torch.no_grad()
    def released_rows(self) -> torch.Tensor:
        """The noise-free part of what this party released for its first training rows, with
        its final bottom model (the audit's released scale; never sent). In evaluation mode, so
        that a bottom with batch statistics saves them as training left them."""
        x = self.x_train[:SCALE_ROWS].to(self.device)
        training = self.bottom.training
        self.bottom.eval()
        try:
            return self.stack.embed_local(self.bottom(x)).detach().cpu()
        finally:
            self.bottom.train(training)

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
                h = self.bottom(x.to(self.device))
                hs[f"h_{split}"] = h.detach().cpu()
                hs[f"sent_{split}"] = self.stack.embed(h, train=False).detach().cpu()
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
            bottom={k: v.detach().cpu() for k, v in self.bottom.state_dict().items()},
            defense_modules=[
                {k: v.detach().cpu() for k, v in m.state_dict().items()} for m in self.stack.modules()
            ],
            **hs,
        )
        return OwnView(view)

    # -- checkpoints and the saved model ----------------------------------------------
    def model_tensors(self) -> dict[str, Any]:
        out: dict[str, Any] = module_states({"bottom": self.bottom})
        out["defense_modules"] = [module_states({"m": m})["m"] for m in self.stack.modules()]
        return out

    def load_model_tensors(self, saved: dict[str, Any]) -> None:
        self.bottom.load_state_dict(saved["bottom"])
        for m, sd in zip(self.stack.modules(), saved["defense_modules"], strict=True):
            m.load_state_dict(sd)

    def optimizer(self) -> optim.Optimizer:
        return self.opt

    def state(self) -> dict[str, torch.Tensor]:
        out = {f"bottom.{k}": v.detach().cpu() for k, v in self.bottom.state_dict().items()}
        out.update(self.exchange.state())
        return out
