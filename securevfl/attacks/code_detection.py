"""HashVFL's abnormal-input detection, evaluated at the server (docs/methods/hashvfl.md §2.9,
§5.6, Table VI).

Setting: the active party A (the paper's server) runs the detector on the codes
it receives; the evaluator measures what that detector can tell apart. It needs
the codes and the server function in the clear at A, so it requires
``active_sees_embeddings``, and exactly two passive parties sending +-1 codes
(``hashvfl`` without ``dp: code``), checked at load.

Two measurements:

* **Table VI protocol** (docs/methods/hashvfl.md §2.9): for each class i, party A's code (option
  ``party``, default the first passive party) is fixed to the class code o_i and
  all 2^d codes of the other party B are enumerated through the server function
  (:mod:`securevfl.attacks.server`); the cases are split into prediction == i and
  != i, and the mean Hamming distance Ham(A, B) = sum((a b - 1) / -2) of each
  group is reported per class and averaged over the classes (None, the paper's
  '-', for an empty group; ``pooled`` is the mean over all cases of a group).
  The paper's finding: wrong > correct.
* **Detection-rate sweep** (docs/methods/hashvfl.md §5.6; the paper gives none): for every
  threshold t in 0..d, the fraction of test pairs flagged (Ham > t), on the honest
  pairs A received in its final evaluation, and on the same pairs with B's code
  replaced by a uniformly random code, or (``pgd``) by B's targeted-PGD
  submission (:mod:`securevfl.attacks.targeted_pgd`; pre-Sign, one omega/eta).
  Also the O(N) variant: the largest distance of a party's code to the
  predicted class's code o_{y_hat}.

Class codes o (option ``class_codes``): ``defense`` rebuilds them as the active
``hashvfl_consistency`` does, from the protocol's public seed with the same pure
function (:func:`securevfl.privacy.hashing.class_codes`); ``majority`` takes the
bitwise majority of the codes A received for training records of each class (as
``code_reconstruction`` does; for a run without the consistency loss); ``auto``
picks ``defense`` when the active party runs it.

Declared prior: only the simulated attacked traffic (the random codes and B's
PGD submissions); everything else is A's own view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

from securevfl.attacks.base import Attack, AttackOptions, View, World
from securevfl.attacks.code_reconstruction import class_codes as majority_codes
from securevfl.attacks.server import received_test_embeddings, server_check, server_from_view
from securevfl.attacks.targeted_pgd import hash_options, pick_rows, targeted_pgd, view_presign
from securevfl.attacks.views import per_row, received_per_forward
from securevfl.components import Components
from securevfl.config import Protocol
from securevfl.defenses.hashvfl import ConsistencyOptions, HashOptions
from securevfl.errors import ConfigError, ProtocolError, UnsupportedCombination
from securevfl.privacy import hashing
from securevfl.runtime.messages import EMBEDDING
from securevfl.seeding import generator

MAX_BITS = 16  # 2^16 codes of B per class: the enumeration's ceiling

# -- pure functions ---------------------------------------------------------------------------------


def _code_bits(proto: Protocol, index: int) -> int:
    """The code length d of the ``index``-th passive party (its ``model.out``)."""
    model = proto.parties.passive[index].model
    assert model is not None  # a passive party has a bottom model (checked at load)
    return model.out


def hamming_pm1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamming distance of +-1 codes along the last axis, as the official code
    computes it (docs/methods/hashvfl.md §2.9): sum((a * b - 1) / -2)."""
    return ((a * b - 1) / -2).sum(-1)


def all_codes(d: int) -> torch.Tensor:
    """All 2^d codes in {-1, +1}^d, row k the binary digits of k (MSB first, 1 -> +1)."""
    k = torch.arange(2**d)[:, None]
    bits = (k >> torch.arange(d - 1, -1, -1)) & 1
    return bits.float() * 2 - 1


def _mean(x: torch.Tensor) -> float | None:
    return float(x.float().mean()) if x.numel() else None


def table_vi(
    f: Callable[[list[torch.Tensor]], torch.Tensor], codes: torch.Tensor, fixed: int = 0
) -> dict[str, Any]:
    """The Table VI protocol (docs/methods/hashvfl.md §2.9) for two parties: party ``fixed``
    (0 or 1) gets the class code o_i, the other party every code of {-1, +1}^d;
    ``f`` maps the two parties' codes to logits. Per class: the mean Hamming
    distance for the cases predicted i (``correct``) and not i (``wrong``), None
    when a group is empty, and the group sizes; ``average`` is the mean of the
    per-class means over the classes where the group is not empty, ``pooled``
    the mean over every case of the group."""
    c, d = codes.shape
    other = all_codes(d)
    rows, ham_ok, ham_bad = [], [], []
    for i in range(c):
        a = codes[i].expand(len(other), d)
        with torch.no_grad():
            pred = f([a, other] if fixed == 0 else [other, a]).argmax(1)
        ham = hamming_pm1(a, other)
        ok = pred == i
        ham_ok.append(ham[ok])
        ham_bad.append(ham[~ok])
        rows.append(
            {
                "class": i,
                "correct": _mean(ham[ok]),
                "wrong": _mean(ham[~ok]),
                "n_correct": int(ok.sum()),
                "n_wrong": int((~ok).sum()),
            }
        )

    def avg(key: str) -> float | None:
        vals = [v for r in rows if (v := r[key]) is not None]
        return float(np.mean(vals)) if vals else None

    return {
        "per_class": rows,
        "average": {"correct": avg("correct"), "wrong": avg("wrong")},
        "pooled": {"correct": _mean(torch.cat(ham_ok)), "wrong": _mean(torch.cat(ham_bad))},
    }


def flag_rates(distance: torch.Tensor, thresholds: list[int]) -> list[float]:
    """Fraction of cases flagged, distance > t, for each threshold t."""
    return [float((distance > t).float().mean()) if distance.numel() else float("nan") for t in thresholds]


def pair_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-record Hamming distance between two parties' codes (the pairwise detector)."""
    return hamming_pm1(a, b)


def to_pred_distance(hs: list[torch.Tensor], predicted_codes: torch.Tensor) -> torch.Tensor:
    """Per record, the largest distance of a party's code to o_{y_hat} (the O(N) detector)."""
    return torch.stack([hamming_pm1(h, predicted_codes) for h in hs]).max(0).values


def is_pm1(t: torch.Tensor) -> bool:
    return bool(((t == 1) | (t == -1)).all())


# -- the evaluator ----------------------------------------------------------------------------------


class CodeDetectionOptions(AttackOptions):
    party: str | None = Field(
        default=None, description="party A, whose code is fixed to o_i (default: the first passive party)"
    )
    class_codes: Literal["auto", "defense", "majority"] = Field(
        default="auto", description="o: rebuilt as hashvfl_consistency does, or the per-class majority"
    )
    pgd: bool = Field(default=True, description="also replace B's code by its targeted-PGD submission")
    pgd_omega: float = Field(default=1.0, gt=0, description="omega of the PGD replacement")
    pgd_eta: float = Field(default=1.0, gt=0, description="eta of the PGD replacement")
    pgd_iterations: int = Field(default=20, ge=1)
    target_class: int = Field(default=0, ge=0, description="y_t of the PGD replacement")
    samples: int = Field(default=100, ge=1, description="test records the PGD replacement attacks")


class CodeDetection(Attack[CodeDetectionOptions]):
    name = "code_detection"
    adversary = "active"
    needs_classes = "it matches HashVFL codes against per-class codes"
    requires = frozenset({"active_sees_embeddings"})
    options = CodeDetectionOptions

    @classmethod
    def check(
        cls, proto: Any, params: BaseModel, *, backend: Any, path: str, source: str | None = None
    ) -> None:
        """Two passive parties sending +-1 codes of at most MAX_BITS bits, and a
        label-only active party (the Table VI server sees the codes only)."""
        passive = proto.parties.passive
        if len(passive) != 2:
            raise ConfigError(
                f"code_detection compares two parties' codes (docs/methods/hashvfl.md §2.9); the protocol "
                f"has {len(passive)} passive parties",
                path=path,
                source=source,
            )
        for p in passive:
            if p.model is not None and p.model.out > MAX_BITS:
                raise ConfigError(
                    f"code_detection enumerates 2^d codes; d = {p.model.out} > {MAX_BITS}",
                    path=path,
                    source=source,
                )
        if proto.parties.active.model is not None:
            raise UnsupportedCombination(
                "code_detection runs the server on codes alone; the active party has its own features",
                path=path,
                source=source,
            )

    @classmethod
    def cross_check(
        cls, proto: Any, components: Components, params: BaseModel, *, path: str, source: str | None = None
    ) -> None:
        """Both passive parties run ``hashvfl`` and send +-1 codes (not ``dp: code``)."""
        for j, p in enumerate(proto.parties.passive):
            hp = components.options(p.name, HashOptions)
            if hp is None or hp.dp == "code":
                raise UnsupportedCombination(
                    f"code_detection needs +-1 codes, but passive party '{p.name}' "
                    + (
                        "sends float embeddings (no 'hashvfl' defense)"
                        if hp is None
                        else "runs hashvfl dp: code"
                    )
                    + f" (parties.passive[{j}].defenses)",
                    path=path,
                    source=source,
                )

    def _order(self, world: World) -> tuple[list[str], int]:
        names = [r.party for r in world.layout.passive]
        return names, names.index(world.passive(self.params.party).party)

    def _defense_codes(self, world: World) -> torch.Tensor | None:
        opts = world.components.options(world.proto.parties.active.name, ConsistencyOptions)
        if opts is None:
            return None
        seed = opts.code_seed if opts.code_seed is not None else world.proto.training.seed
        bits = _code_bits(world.proto, 0)
        classes = int(world.active.own.classes)
        return hashing.class_codes(classes, bits, opts.codes, generator(seed, "hashvfl", "codes"))

    def knowledge(self, world: World) -> dict[str, Any]:
        """A's server function and class codes (its own), and the simulated
        attacked traffic: B's code replaced by a uniform random code, and by B's
        targeted-PGD submission on ``samples`` test records."""
        p = self.params
        names, a_idx = self._order(world)
        b_idx = 1 - a_idx
        if p.class_codes == "defense" and self._defense_codes(world) is None:
            raise ProtocolError("class_codes: defense, but the active party runs no hashvfl_consistency")
        codes = None if p.class_codes == "majority" else self._defense_codes(world)
        server = server_from_view(world.proto, world.layout, world.active.own, world.components.code)
        n_test = len(world.active.own.test_idx)
        d = _code_bits(world.proto, b_idx)
        g = torch.Generator().manual_seed(p.seed)
        prior: dict[str, Any] = {
            "a_index": a_idx,
            "names": names,
            "server": server,
            "class_codes": codes,
            "random_b": (torch.randint(0, 2, (n_test, d), generator=g) * 2 - 1).float(),
        }
        if p.pgd:
            bv = world.views[names[b_idx]].own
            hp = hash_options(world.proto, world.components, b_idx)
            assert hp is not None  # check() refuses a party without hashvfl
            v = view_presign(bv, hp)
            rows = pick_rows(world.active.own.y_test.numpy(), p.target_class, p.samples, p.seed)
            a_codes = world.views[names[a_idx]].own.sent_test[rows].float()
            r = torch.as_tensor(rows)

            def f(sub: torch.Tensor) -> torch.Tensor:
                return server([a_codes, sub] if a_idx == 0 else [sub, a_codes], r)

            adv = targeted_pgd(
                f,
                v[rows],
                p.target_class,
                omega=p.pgd_omega,
                eta=p.pgd_eta,
                iterations=p.pgd_iterations,
                binary=True,
            )
            prior["pgd_b"] = {"rows": rows, "codes": adv}
        return prior

    def run(self, view: View) -> dict[str, Any]:
        p, prior, own = self.params, view.prior, view.own
        a_idx = prior["a_index"]
        hs = received_test_embeddings(own, view.received, 2)
        if not all(is_pm1(h) for h in hs):
            raise ProtocolError("code_detection needs +-1 codes, but the active party received other values")
        server = prior["server"]
        codes = prior["class_codes"]
        source = "defense (rebuilt from the protocol seed)"
        if codes is None:
            forwards = own.forwards
            n_train, n_test = len(own.train_idx), len(own.test_idx)
            got = received_per_forward(view.received.get(EMBEDDING.name, []), forwards, 2, a_idx)
            table = per_row(forwards, got, n_train, n_test)
            seen = torch.as_tensor(np.flatnonzero(table.train_seen))
            codes = majority_codes(table.train[seen], own.y_train[seen], int(own.classes), binary=True)
            source = "majority of the training codes A received per class"
        d = codes.shape[1]
        thresholds = list(range(d + 1))

        def f(pair: list[torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
            with torch.no_grad():
                return server(pair, rows)

        def order(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
            return [a, b] if a_idx == 0 else [b, a]

        a_codes, b_codes = hs[a_idx], hs[1 - a_idx]
        all_rows = torch.arange(len(a_codes))

        def sweep(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> dict[str, Any]:
            pred = f(order(a, b), rows).argmax(1)
            return {
                "pair": flag_rates(pair_distance(a, b), thresholds),
                "to_pred": flag_rates(to_pred_distance([a, b], codes[pred]), thresholds),
                "pred": pred.numpy(),
            }

        traffic = {
            "honest": sweep(a_codes, b_codes, all_rows),
            "random_b": sweep(a_codes, prior["random_b"], all_rows),
        }
        if "pgd_b" in prior:
            r = torch.as_tensor(prior["pgd_b"]["rows"])
            traffic["honest_pgd_rows"] = sweep(a_codes[r], b_codes[r], r)
            traffic["pgd_b"] = sweep(a_codes[r], prior["pgd_b"]["codes"], r)
            hit = traffic["pgd_b"]["pred"] == p.target_class
            traffic["pgd_b_success"] = sweep(a_codes[r][hit], prior["pgd_b"]["codes"][hit], r[hit])
        return {
            "table_vi": table_vi(lambda pair: f(pair), codes, a_idx),
            "class_codes": codes.int().tolist(),
            "class_codes_source": source,
            "thresholds": thresholds,
            "traffic": traffic,
            "used": {
                "input": f"ledger '{EMBEDDING.name}' (the codes A received), A's server function and labels",
                "class_codes": source,
                "prior": "simulated attacked traffic: B's code replaced by uniform random codes"
                + (" and by B's targeted-PGD submissions" if "pgd_b" in prior else ""),
            },
        }

    def score(self, guess: dict[str, Any], world: World) -> dict[str, Any]:
        names, a_idx = self._order(world)
        t6 = guess["table_vi"]
        avg = t6["average"]
        traffic = {
            k: {"records": len(v["pred"]), "pair_flag_rate": v["pair"], "to_pred_flag_rate": v["to_pred"]}
            for k, v in guess["traffic"].items()
        }
        server = server_from_view(world.proto, world.layout, world.active.own, world.components.code)
        out: dict[str, Any] = {
            "party_a": names[a_idx],
            "party_b": names[1 - a_idx],
            "class_codes": guess["class_codes"],
            "class_codes_source": guess["class_codes_source"],
            "table_vi": t6,
            "wrong_gt_correct": (
                avg["wrong"] > avg["correct"]
                if avg["wrong"] is not None and avg["correct"] is not None
                else None
            ),
            "thresholds": guess["thresholds"],
            "traffic": traffic,
            **server_check(world, server),
        }
        if "pgd_b" in guess["traffic"]:
            hit = guess["traffic"]["pgd_b"]["pred"] == self.params.target_class
            out["pgd"] = {
                "omega": self.params.pgd_omega,
                "eta": self.params.pgd_eta,
                "iterations": self.params.pgd_iterations,
                "target_class": self.params.target_class,
                "asr": 100 * float(hit.mean()),
            }
        return out
