"""The split model's server function, rebuilt from the active party's saved view.

The active party computes ``z = sum_i h'_i W_i^T (+ W_A f_A(x_A)) + b`` and the
logits ``top(z)`` (:class:`securevfl.parties.active.ActiveParty`). Under
``plain`` it holds every block W_i in the clear, so its view carries the whole
function: for HashVFL (docs/methods/hashvfl.md §2.7) the interactive layer is the paper's
Linear(N d, 16) and the top model its ReLU -> Linear(16, C)
(docs/methods/hashvfl.md, "The split model"). White-box evaluators (docs/methods/hashvfl.md §5.5,
§5.6) run this function on chosen codes.

Also here: the embeddings the active party received in the final evaluation,
per passive party and test row (what the server actually classified).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from securevfl.attacks.views import per_row, received_per_forward
from securevfl.errors import ProtocolError
from securevfl.metrics import classification_metrics
from securevfl.models import build_top
from securevfl.records import OwnView
from securevfl.runtime.messages import EMBEDDING
from securevfl.schedule import eval_batches
from securevfl.usercode import CodePolicy


class ServerModel(torch.nn.Module):
    """f_top(h_1, .., h_N) -> logits, as the active party computes them: the
    blocks W_i (out x d_i, applied as ``h @ W_i.T``), A's own part of z on the
    test rows (``offset``, optional), the bias b and the top model."""

    def __init__(
        self,
        top: torch.nn.Module,
        bias: torch.Tensor,
        blocks: list[torch.Tensor],
        offset: torch.Tensor | None = None,
    ):
        super().__init__()
        self.top = top
        self.bias: torch.Tensor
        self.register_buffer("bias", bias.detach().clone())
        self.blocks = [w.detach().clone() for w in blocks]
        self.offset = None if offset is None else offset.detach().clone()

    @property
    def widths(self) -> list[int]:
        return [w.shape[1] for w in self.blocks]

    def forward(self, hs: list[torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for the N parties' embeddings ``hs`` (each B x d_i). ``rows``:
        the test rows they belong to, needed only when A has its own features
        (its part of z is per row)."""
        if len(hs) != len(self.blocks):
            raise ValueError(f"{len(hs)} embeddings for {len(self.blocks)} interactive blocks")
        # the active party's order of operations, so that logits match its own bit for bit:
        # z' = sum_i h_i W_i^T (the exchange), + A's own part, + b
        z = hs[0] @ self.blocks[0].T
        for h, w in zip(hs[1:], self.blocks[1:], strict=True):
            z = z + h @ w.T
        if self.offset is not None:
            if rows is None:
                raise ValueError("the active party has its own features: pass the test rows")
            z = z + self.offset[rows]
        return self.top(z + self.bias)


def server_from_view(proto: Any, layout: Any, active_own: OwnView, code: CodePolicy) -> ServerModel:
    """Rebuild the server function from the active party's own view (its top
    model, bias, the blocks W_i in passive-party order and its own part of z).
    Raises ProtocolError when the view lacks the blocks (a backend that shares or
    encrypts them, or a run without recorded views)."""
    inter = active_own.interactive
    names = [r.party for r in layout.passive]
    missing = [n for n in names if f"interactive.{n}" not in inter]
    if "top" not in active_own or missing:
        raise ProtocolError(
            f"the active party's view holds no plaintext interactive block for {missing or names}: "
            "the server function exists in the clear at A only under a backend with "
            "'active_sees_embeddings' (plain), and only with runtime.record_views on"
        )
    blocks = [inter[f"interactive.{n}"].float() for n in names]
    top = build_top(
        proto.top,
        blocks[0].shape[0],
        int(active_own.classes),
        seed=proto.training.seed,
        code=code,  # the harness's policy (the local launcher's)
    )
    top.load_state_dict(active_own.top)
    top.eval()
    return ServerModel(top, active_own.bias.float(), blocks, active_own.own_z_test)


def received_test_embeddings(active_own: OwnView, received: dict[str, Any], n_peers: int):
    """Per passive party (layout order): the n_test x d embeddings the active
    party received in its final evaluation pass, one row per test row."""
    forwards = active_own.forwards
    n_train, n_test = len(active_own.train_idx), len(active_own.test_idx)
    out = []
    for k in range(n_peers):
        tensors = received_per_forward(received.get(EMBEDDING.name, []), forwards, n_peers, k)
        table = per_row(forwards, tensors, n_train, n_test)
        if not table.test_seen.all():
            raise ProtocolError(
                f"the final evaluation covers {int(table.test_seen.sum())} of {n_test} test rows"
            )
        out.append(table.test)
    return out


def server_check(world: Any, server: ServerModel) -> dict[str, Any]:
    """Accuracy of the rebuilt server on the codes A received in its final
    evaluation (in A's evaluation batches), and whether it equals the run's own
    test accuracy exactly."""
    a = world.active
    hs = received_test_embeddings(a.own, a.received, len(world.layout.passive))
    with torch.no_grad():
        pred = torch.cat(
            [
                server([h[idx] for h in hs], torch.as_tensor(idx)).argmax(1)
                for idx in eval_batches(hs[0].shape[0], world.proto.training.batch_size)
            ]
        )
    # one-hot "probabilities" of the predicted class: the run's own metric, computed the same way
    onehot = torch.nn.functional.one_hot(pred, int(a.own.classes)).numpy()
    acc = classification_metrics(onehot, a.own.y_test.numpy())["test_accuracy"]
    run_acc = json.loads((world.out_dir / "result.json").read_text()).get("test_accuracy")
    return {"server_test_accuracy": acc, "server_matches_run": run_acc is not None and acc == run_acc}
