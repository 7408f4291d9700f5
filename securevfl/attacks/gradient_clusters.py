"""Gradient label-leak probe against HashVFL's backward channel (docs/methods/hashvfl.md §7
item 2, §8.1 "additionally", §8.2 item 19).

Threat model: the attacking passive party P_i is honest-but-curious. Its view:
the gradient G_i = dL/dh'_i the exchange revealed to it at every training step
(``own.grads``, one per entry of ``own.forwards``, whose row positions give
each gradient row's training record through the shared batch schedule). Declared
prior knowledge: the number of classes C only. It knows no label.

Why it should leak: HashVFL's consistency term adds exactly -o_{y_u}/(N B d) to
row u's gradient (docs/methods/hashvfl.md §8.2 item 6), a per-class constant vector, and the
cross-entropy part dL/dh = (p - onehot(y)) W is label-dependent too. So k-means
with k = C over the received gradient rows may recover the label partition.

Attack: k-means (k-means++, ``n_init`` restarts, seeded) over points made of
gradient rows:

* ``points: per_step``: every received row gradient is one point (a record
  appears once per epoch), graded with its record's label;
* ``points: per_row``: one point per training record, the mean of its gradients
  over the selected steps;
* ``normalize``: scale each gradient row to unit L2 norm first. Gradient norms
  shrink by orders of magnitude as training converges and are record-specific,
  while the label signal is in the direction (the consistency term's sign pattern
  -o_y), so normalising keeps the late, well-fitted steps from collapsing onto the
  origin. Default on (measured in docs: it is the stronger probe on digits).
* ``epochs: all | last``: every training step, or only the final pass over the
  training rows (the trailing training steps whose rows do not repeat).

Metrics: adjusted mutual information between clusters and true labels (``ami``;
chance about 0, 1 = the label partition), and accuracy of the clusters read as
labels under the best one-to-one cluster -> label matching (``accuracy``, with the
majority-class rate as ``chance``). The spec asks to document the leak, not to
assert an outcome.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from sklearn.cluster import KMeans

import securevfl.attacks.metrics as metrics
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.errors import ProtocolError


class GradientClustersOptions(AttackOptions):
    party: str | None = Field(default=None, description="the attacking passive party (default: the first)")
    points: Literal["per_step", "per_row"] = Field(
        default="per_row",
        description="per_step: each received gradient row is a point; per_row: mean per training record",
    )
    normalize: bool = Field(default=True, description="scale each gradient row to unit L2 norm first")
    epochs: Literal["all", "last"] = Field(
        default="all", description="all training steps, or only the final pass over the training rows"
    )
    n_init: int = Field(default=10, ge=1, description="k-means restarts (k-means++ seeding each)")


def last_pass(forwards: list[dict[str, Any]]) -> list[int]:
    """Indices of the trailing training forwards in which no training row
    repeats: the final epoch (or the final pass a ``max_steps`` cut left)."""
    seen: set[int] = set()
    keep: list[int] = []
    for k in range(len(forwards) - 1, -1, -1):
        f = forwards[k]
        if f["phase"] != "train":
            continue
        rows = {int(r) for r in np.asarray(f["rows"])}
        if rows & seen:
            break
        seen |= rows
        keep.append(k)
    return keep[::-1]


def gradient_points(
    forwards: list[dict[str, Any]],
    grads: list[torch.Tensor],
    n_train: int,
    *,
    points: str,
    normalize: bool,
    epochs: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(points, record of each point) from the received per-step gradients."""
    if len(forwards) != len(grads):
        raise ProtocolError(f"view holds {len(grads)} gradients for {len(forwards)} training forwards")
    steps = (
        last_pass(forwards)
        if epochs == "last"
        else [k for k, f in enumerate(forwards) if f["phase"] == "train"]
    )
    if not steps:
        raise ProtocolError("the view holds no training gradients (was runtime.record_views off?)")
    rows = np.concatenate([np.asarray(forwards[k]["rows"], dtype=np.int64) for k in steps])
    g = torch.cat([grads[k].double().reshape(len(forwards[k]["rows"]), -1) for k in steps])
    if normalize:
        g = torch.nn.functional.normalize(g, dim=1)
    x = g.numpy()
    if points == "per_step":
        return x, rows
    total = np.zeros((n_train, x.shape[1]))
    count = np.zeros(n_train)
    np.add.at(total, rows, x)
    np.add.at(count, rows, 1)
    seen = np.flatnonzero(count)
    return total[seen] / count[seen, None], seen


def kmeans(x: np.ndarray, k: int, *, seed: int, n_init: int) -> np.ndarray:
    """Cluster ids of k-means (Lloyd, k-means++ seeding, ``n_init`` restarts, the
    lowest inertia kept; scikit-learn), seeded."""
    if len(x) < k:
        raise ProtocolError(f"{len(x)} gradient points cannot form {k} clusters")
    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed)
    return km.fit_predict(x).astype(np.int64)


class GradientClusters(Attack[GradientClustersOptions]):
    name = "gradient_clusters"
    adversary = "passive"
    needs_classes = "it clusters gradients into label classes"
    options = GradientClustersOptions

    def adversary_party(self, world: World) -> str:
        return world.passive(self.params.party).party

    def knowledge(self, world: World) -> dict[str, Any]:
        """The number of classes C (k of k-means); nothing label-bearing."""
        return {"classes": int(world.active.own.classes)}

    def run(self, view: View) -> dict[str, Any]:
        p, own = self.params, view.own
        train = [k for k, f in enumerate(own.forwards) if f["phase"] == "train"]
        x, rows = gradient_points(
            [own.forwards[k] for k in train],
            list(own.grads),
            len(own.train_idx),
            points=p.points,
            normalize=p.normalize,
            epochs=p.epochs,
        )
        clusters = kmeans(x, view.prior["classes"], seed=p.seed, n_init=p.n_init)
        return {
            "rows": rows,
            "clusters": clusters,
            "used": {
                "input": "revealed dL/dh' per training step (own record)",
                "points": p.points,
                "normalize": p.normalize,
                "epochs": p.epochs,
                "n_points": len(rows),
                "known_labels": 0,
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        y = world.active.own.y_train.numpy()[guess["rows"]]
        ami = metrics.adjusted_mutual_info(y, guess["clusters"])
        acc = metrics.matched_accuracy(y, guess["clusters"])
        chance = float(np.bincount(y).max() / len(y)) if len(y) else float("nan")
        return {"ami": ami, "accuracy": acc, "chance": chance, "n_points": len(y), "ap": max(0.0, ami)}
