"""Feature reconstruction by the active party (docs/methods/vfl-afe.md §5.1, docs/methods/dravl.md §5).

Threat model: A is honest-but-curious. It knows the raw features of an auxiliary
set of *training* records of the victim passive party (``aux_fraction`` of the
training rows; docs/methods/dravl.md's worst case is the "reconstructor that knows the
ground-truth inputs"). It trains a decoder from what it saw of those records to
their raw features, then applies it to what it saw of the test records.

What A saw depends on the backend: under ``plain`` it received the victim's
embedding h'_i (ledger tag ``embedding``); under ``mpc``/``ckks``/``paillier`` it
only learns the revealed interactive output z (for HE backends, the sum over
parties of the revealed z_i). For a training record the decoder's input is the
latest tensor A saw for it (its last training step); for a test record, the
tensor of the final evaluation pass. Following docs/methods/dravl.md §5's hygiene, inputs are
z-scored with the attacker's own statistics and the attacker answers with the
better (on its held-out aux rows) of the decoder and the aux mean, so nmse <= 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

import securevfl.attacks.metrics as metrics
from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.learners import fit_regressor
from securevfl.attacks.views import active_source, active_tensors, per_row
from securevfl.private_files import open_private, private_dir


class FeatureReconstructionOptions(AttackOptions):
    target: str | None = Field(default=None, description="victim passive party (default: the first)")
    aux_fraction: float = Field(
        default=0.2, gt=0, le=1, description="fraction of training rows whose raw victim features A knows"
    )
    source: Literal["auto", "embedding", "z"] = Field(
        default="auto",
        description="what A decodes: the victim's embedding (plain only) or z; auto = embedding "
        "where the backend shows it to A, else z",
    )
    hidden: list[int] = Field(default=[256, 256], description="decoder MLP hidden sizes")
    image_shape: tuple[int, int] | None = Field(
        default=None,
        description="(H, W) of the victim's features as an image, for PSNR/SSIM "
        "(default: the victim's cnn input_shape, else no image metrics)",
    )
    grid_rows: int = Field(default=16, ge=0, description="test rows saved to attacks/<key>.npz")


class FeatureReconstruction(Attack[FeatureReconstructionOptions]):
    name = "feature_reconstruction"
    adversary = "active"
    options = FeatureReconstructionOptions

    def knowledge(self, world: World) -> dict[str, Any]:
        """The victim's raw features of a random ``aux_fraction`` of the training
        rows (positions into the training rows, and their values)."""
        p = self.params
        idx, victim = world.locate(self.params.target)
        vv = world.views[victim].own
        n_train = len(vv.train_idx)
        g = np.random.default_rng(p.seed)
        n_aux = max(2, round(p.aux_fraction * n_train))
        aux = np.sort(g.choice(n_train, size=min(n_aux, n_train), replace=False))
        x = vv.x_raw[torch.as_tensor(vv.train_idx[aux])]
        source = active_source(world.proto, p.source)
        return {
            "victim": victim,
            "victim_index": idx,
            "n_peers": len(world.layout.passive),
            "aux_rows": aux,
            "aux_x": x,
            "source": source,
        }

    def run(self, view: View) -> dict[str, Any]:
        p, prior = self.params, view.prior
        own = view.own
        n_train, n_test = len(own.train_idx), len(own.test_idx)
        forwards = own.forwards
        tensors, used = active_tensors(view, prior)
        table = per_row(forwards, tensors, n_train, n_test)
        aux = prior["aux_rows"]
        aux = aux[table.train_seen[aux]]
        x_aux = prior["aux_x"][table.train_seen[prior["aux_rows"]]].float()
        predict, val_model, val_mean = fit_regressor(table.train[aux], x_aux, hidden=p.hidden, seed=p.seed)
        test_rows = np.flatnonzero(table.test_seen)
        decoded = predict(table.test[test_rows])
        use_mean = not val_model < val_mean
        recon = x_aux.mean(0).expand_as(decoded) if use_mean else decoded
        return {
            "test_rows": test_rows,
            "recon": recon.numpy(),
            "decoded": decoded.numpy(),
            "aux_mean": x_aux.mean(0).numpy(),
            "data_range": float(x_aux.max() - x_aux.min()),
            "used": {
                "input": used,
                "aux_rows": len(aux),
                "aux_fraction": p.aux_fraction,
                "decoder_val_mse": val_model,
                "mean_val_mse": val_mean,
                "answered_with": "aux mean" if use_mean else "decoder",
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        vv = world.views[world.locate(self.params.target)[1]].own
        true = vv.x_raw[torch.as_tensor(vv.test_idx[guess["test_rows"]])].numpy().astype(np.float64)
        out: dict[str, Any] = metrics.normalized_mse(guess["recon"], true, guess["aux_mean"])
        out["nmse_decoder"] = metrics.normalized_mse(guess["decoded"], true, guess["aux_mean"])["nmse_raw"]
        out["ap"] = 1.0 - out["nmse"]
        out["victim"] = world.locate(self.params.target)[1]
        out["n_test"] = len(true)
        shape = self._image_shape(world)
        rng = guess["data_range"] or 1.0
        if shape is not None:
            imgs = true.reshape(-1, *shape)
            rec = np.asarray(guess["recon"], dtype=np.float64).reshape(-1, *shape)
            out["psnr"] = metrics.psnr(rec, imgs, rng)
            out["ssim"] = float(metrics.ssim(rec, imgs, rng).mean())
            n = min(self.params.grid_rows, len(imgs))
            if n:
                # the victim's own rows: the folder and file are the run owner's alone
                d = private_dir(Path(world.out_dir) / "attacks")
                with open_private(d / f"{self.key}.npz") as fh:
                    np.savez(fh, original=imgs[:n], reconstruction=rec[:n])
                out["grid"] = f"attacks/{self.key}.npz"
        return out

    def _image_shape(self, world: World) -> tuple[int, int] | None:
        """(H, W) of the victim's features as an image: the option, else a
        one-channel cnn input_shape of the victim's bottom model."""
        if self.params.image_shape is not None:
            return self.params.image_shape
        spec = world.proto.parties.passive[world.locate(self.params.target)[0]]
        if spec.model is not None and spec.model.input_shape is not None:
            c, h, w = spec.model.input_shape
            return (h, w) if c == 1 else None
        return None
