"""Class-code reconstruction against HashVFL (docs/methods/hashvfl.md §5.2, Fig. 3).

Threat model: the active party A (honest-but-curious, the paper's server) wants
the image a class code stands for. Its view: the +-1 codes the victim passive
party sent (ledger ``embedding``; so ``plain`` only) and its own labels, from
which it forms each class's code o_y as the bitwise majority of the codes it
received for training records of class y. Declared prior knowledge, as in the
paper ("the adversary knows f_theta"): the victim's trained bottom model and its
defense modules (HashVFL's BatchNorm), white-box.

Attack: x* = argmin_x MSE(v(x), o_y) + lambda TV(x), with v(x) the pre-Sign
BatchNorm output (docs/methods/hashvfl.md §5.2 [GAP]: Sign has zero gradient, so the BN output
is matched). Without hashing the same attack matches the class mean of the
received embeddings with the bottom output: the "no-defense upper bound".
Metrics (docs/methods/hashvfl.md §5.3, pairing: each class's reconstruction against every test
image of that class, victim's half, model-input space): SSIM, mean (and std) over
classes of the per-class mean; ``ssim_mean_image`` is the same for the average
training image, the know-nothing baseline. DCOR (per image over pixels) and KLD
(KL(P_raw || P_rec) of pixel distributions, see :func:`metrics.kld_pixels`), mean
and std over all (class, image) pairs, each with its ``*_mean_image`` baseline.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

import securevfl.attacks.metrics as metrics
from securevfl import optim
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.views import own_layout, per_row, received_per_forward
from securevfl.models import build_bottom
from securevfl.runtime.messages import EMBEDDING


class CodeReconstructionOptions(AttackOptions):
    target: str | None = Field(default=None, description="victim passive party (default: the first)")
    iterations: int = Field(default=1000, ge=1, description="optimizer steps per class (paper: 3,000)")
    lr: float = Field(default=0.01, gt=0)
    tv_weight: float = Field(default=0.05, ge=0, description="lambda of the TV prior (paper: unspecified)")
    image_shape: tuple[int, int] | None = Field(
        default=None, description="(H, W) of the victim's features (default: its cnn input_shape)"
    )
    mode: Literal["class_code", "sample"] = Field(
        default="class_code",
        description="class_code: invert each class's code (the paper's attack); sample: invert individual "
        "test records' continuous pre-Sign values, the upper bound of docs/methods/hashvfl.md §5.2 [C]",
    )
    samples: int = Field(default=20, ge=1, description="test records inverted in mode 'sample'")


def isotropic_tv(x: torch.Tensor) -> torch.Tensor:
    """Isotropic TV of a batch (n, H, W), differentiable (docs/methods/hashvfl.md §5.2)."""
    dx = x[:, 1:, :-1] - x[:, :-1, :-1]
    dy = x[:, :-1, 1:] - x[:, :-1, :-1]
    return torch.sqrt(dx**2 + dy**2 + 1e-8).sum()


def class_codes(codes: torch.Tensor, labels: torch.Tensor, classes: int, *, binary: bool) -> torch.Tensor:
    """Per class: the bitwise majority of +-1 codes (``binary``) or the mean
    embedding. Classes without rows get zeros."""
    out = torch.zeros(classes, codes.shape[1])
    for c in range(classes):
        rows = codes[labels == c]
        if len(rows):
            m = rows.mean(0)
            out[c] = torch.where(m >= 0, 1.0, -1.0) if binary else m
    return out


def invert(
    f, target: torch.Tensor, shape: tuple[int, int], init: float, *, iterations: int, lr: float, tv: float
) -> torch.Tensor:
    """Gradient descent on the input: MSE(f(x), target) + tv * TV(x)."""
    x = torch.full((target.shape[0], *shape), init, requires_grad=True)
    opt = optim.Adam([x], lr=lr, amsgrad=True)
    for _ in range(iterations):
        opt.zero_grad()
        out = f(x.reshape(x.shape[0], -1))
        loss = torch.nn.functional.mse_loss(out, target) + tv * isotropic_tv(x) / x.shape[0]
        loss.backward()
        opt.step()
    return x.detach()


def pre_sign(bottom: torch.nn.Module, bn: dict[str, torch.Tensor] | None):
    """x -> the victim's pre-Sign value: its bottom output, through its BatchNorm
    in eval mode when it has one (docs/methods/hashvfl.md §5.2 [GAP]: the BN output is matched)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        h = bottom(x)
        if bn is not None:
            h = (h - bn["running_mean"]) / torch.sqrt(bn["running_var"] + 1e-5) * bn["weight"] + bn["bias"]
        return h

    return f


class CodeReconstruction(Attack[CodeReconstructionOptions]):
    name = "code_reconstruction"
    adversary = "active"
    needs_classes = "it reconstructs per-class inputs from HashVFL class codes"
    requires = frozenset({"active_sees_embeddings"})
    options = CodeReconstructionOptions

    def _shape(self, world: World) -> tuple[int, int] | None:
        if self.params.image_shape is not None:
            return self.params.image_shape
        spec = world.proto.parties.passive[world.locate(self.params.target)[0]]
        if spec.model is not None and spec.model.input_shape is not None and spec.model.input_shape[0] == 1:
            return tuple(spec.model.input_shape[1:])  # type: ignore[return-value]
        return None

    def knowledge(self, world: World) -> dict[str, Any]:
        """White-box victim bottom model and defense modules (docs/methods/hashvfl.md §5.2)."""
        idx, victim = world.locate(self.params.target)
        vv = world.views[victim].own
        spec = world.proto.parties.passive[idx]
        assert spec.model is not None
        # the harness runs in the local launcher, whose user code policy allows the file's own factories
        bottom = build_bottom(
            spec.model,
            vv.x_train.shape[1],
            seed=0,
            party=victim,
            code=world.components.code,
            path=f"parties.passive[{idx}].model",
            layout=own_layout(vv, victim),
        )
        bottom.load_state_dict(vv.bottom)
        bottom.eval()
        bn = next((m for m in vv.defense_modules if "running_var" in m), None)
        x = vv.x_train
        prior = {
            "victim": victim,
            "victim_index": idx,
            "n_peers": len(world.layout.passive),
            "bottom": bottom,
            "batchnorm": bn,
            "image_shape": self._shape(world),
            "n_features": int(x.shape[1]),
            "init": float(x.min() + x.max()) / 2,  # mid-range start (the paper's code starts at 0.5)
        }
        if self.params.mode == "sample":
            # the upper bound: continuous values the adversary does not see under HashVFL
            rows = self._sample_rows(len(vv.x_test))
            with torch.no_grad():
                prior["sample_rows"] = rows
                prior["sample_targets"] = pre_sign(bottom, bn)(vv.x_test[torch.as_tensor(rows)].float())
        return prior

    def _sample_rows(self, n_test: int) -> np.ndarray:
        g = np.random.default_rng(self.params.seed)
        return np.sort(g.choice(n_test, size=min(self.params.samples, n_test), replace=False))

    def run(self, view: View) -> dict[str, Any]:
        p, prior, own = self.params, view.prior, view.own
        shape = prior["image_shape"] or (1, prior["n_features"])
        if p.mode == "sample":
            f = pre_sign(prior["bottom"], prior["batchnorm"])
            targets = prior["sample_targets"]
            recon = invert(f, targets, shape, prior["init"], iterations=p.iterations, lr=p.lr, tv=p.tv_weight)
            return {
                "recon": recon.numpy(),
                "binary": False,
                "rows": prior["sample_rows"],
                "used": {
                    "input": f"declared prior: continuous pre-Sign values of {len(targets)} test records",
                    "prior": "victim bottom model and defense modules (white-box); the upper bound of "
                    "docs/methods/hashvfl.md §5.2 [C]",
                },
            }
        forwards = own.forwards
        tensors = received_per_forward(
            view.received.get(EMBEDDING.name, []), forwards, prior["n_peers"], prior["victim_index"]
        )
        table = per_row(forwards, tensors, len(own.train_idx), len(own.test_idx))
        seen = table.train_seen
        codes, labels = table.train[seen], own.y_train[torch.as_tensor(np.flatnonzero(seen))]
        binary = bool(((codes.abs() - 1).abs() < 1e-6).all())
        targets = class_codes(codes, labels, int(own.classes), binary=binary)
        f = pre_sign(prior["bottom"], prior["batchnorm"] if binary else None)
        recon = invert(f, targets, shape, prior["init"], iterations=p.iterations, lr=p.lr, tv=p.tv_weight)
        return {
            "recon": recon.numpy(),
            "binary": binary,
            "used": {
                "input": f"ledger '{EMBEDDING.name}' from {prior['victim']} (codes) and A's labels",
                "prior": "victim bottom model and defense modules (white-box, docs/methods/hashvfl.md §5.2)",
                "codes_are_binary": binary,
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        vv = world.views[world.locate(self.params.target)[1]].own
        a = world.active.own
        x_te, y_te = vv.x_test.numpy().astype(np.float64), a.y_test.numpy()
        shape = self._shape(world)
        out: dict[str, Any] = {"victim": world.locate(self.params.target)[1], "binary_codes": guess["binary"]}
        if shape is None:
            return out
        rng = float(x_te.max() - x_te.min()) or 1.0
        imgs = x_te.reshape(-1, *shape)
        mean_img = vv.x_train.numpy().astype(np.float64).mean(0).reshape(shape)
        if self.params.mode == "sample":
            return {**out, **_sample_scores(np.asarray(guess["recon"]), imgs[guess["rows"]], mean_img, rng)}
        per_class, base = [], []
        pairs: dict[str, list[np.ndarray]] = {
            k: [] for k in ("dcor", "kld", "dcor_mean_image", "kld_mean_image")
        }
        for c in range(guess["recon"].shape[0]):
            own = imgs[y_te == c]
            if not len(own):
                continue
            rec = np.broadcast_to(guess["recon"][c], own.shape)
            avg = np.broadcast_to(mean_img, own.shape)
            per_class.append(float(metrics.ssim(rec, own, rng).mean()))
            base.append(float(metrics.ssim(avg, own, rng).mean()))
            pairs["dcor"].append(metrics.dcor_pixels(rec, own))
            pairs["kld"].append(metrics.kld_pixels(own, rec))
            pairs["dcor_mean_image"].append(metrics.dcor_pixels(avg, own))
            pairs["kld_mean_image"].append(metrics.kld_pixels(own, avg))
        out["ssim"] = float(np.mean(per_class))
        out["ssim_std"] = float(np.std(per_class))
        out["ssim_mean_image"] = float(np.mean(base))
        for key, vals in pairs.items():
            v = np.concatenate(vals)
            out[key] = float(v.mean())
            if not key.endswith("_mean_image"):
                out[f"{key}_std"] = float(v.std())
        out["ap"] = max(0.0, out["ssim"])
        return out


def _sample_scores(recon: np.ndarray, true: np.ndarray, mean_img: np.ndarray, rng: float) -> dict[str, Any]:
    """Each record's reconstruction against that record (mode ``sample``), with
    the average training image as the know-nothing baseline."""
    recon = recon.reshape(true.shape).astype(np.float64)
    avg = np.broadcast_to(mean_img, true.shape)
    ssim = metrics.ssim(recon, true, rng)
    dcor, kld = metrics.dcor_pixels(recon, true), metrics.kld_pixels(true, recon)
    return {
        "ssim": float(ssim.mean()),
        "ssim_std": float(ssim.std()),
        "ssim_mean_image": float(metrics.ssim(avg, true, rng).mean()),
        "dcor": float(dcor.mean()),
        "dcor_std": float(dcor.std()),
        "dcor_mean_image": float(metrics.dcor_pixels(avg, true).mean()),
        "kld": float(kld.mean()),
        "kld_std": float(kld.std()),
        "kld_mean_image": float(metrics.kld_pixels(true, avg).mean()),
        "n_records": len(true),
        "ap": max(0.0, float(ssim.mean())),
    }
