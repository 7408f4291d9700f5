"""CRDP-FL's privacy accounting (docs/methods/crdp-fl.md §2.8): the three releases about one
training record (the Pearson filter, the exponential mechanism, the noisy
embeddings), with the paper's own figures as claims. Pure functions of the
options, the plan and what the protocol says about the party, so every rank can
plan a budget before training; the sound composition is the shared
accountant's (:mod:`securevfl.privacy.accountant`)."""

from __future__ import annotations

import math

from securevfl.defenses.crdp.options import CrdpOptions
from securevfl.privacy.accountant import EpsDeltaRelease, LaplaceRelease, Mechanism, Plan, Release
from securevfl.privacy.boundary import EmbeddingBoundary
from securevfl.privacy.correlated import UnboundedRelease, paper_epsilon, sound_epsilon, utility_sensitivity


def pearson_release(p: CrdpOptions, width: int | None) -> Release:
    """The Pearson filter's release over a party of ``width`` columns (None when
    only its file knows)."""
    if math.isinf(p.eps1):
        return UnboundedRelease(count=1, reason="eps1 = inf: coefficients released without noise")
    if p.resolved("pearson") == "strict":
        return EpsDeltaRelease(count=1, epsilon=p.eps1)
    if width is None:
        return UnboundedRelease(count=1, reason="column count unknown at plan time")
    pairs = max(1, width * (width - 1) // 2)
    # each coefficient: Lap(1/eps1) against a true sensitivity of 2, i.e. 2 eps1-DP; basic
    # composition over the pairs (a PLD of dozens of Laplace releases costs ~10 s per party)
    return EpsDeltaRelease(count=1, epsilon=2.0 * p.eps1 * pairs)


def em_release(p: CrdpOptions, n: int, s: float) -> Release:
    """The exponential mechanism's release over ``n`` training rows at record
    sensitivity ``s``: eps2 scaled by how far the utility sensitivity it used
    falls short of the true one."""
    if math.isinf(p.eps2):
        return UnboundedRelease(count=1, reason="eps2 = inf: the least-sensitive candidate is taken")
    true_du = utility_sensitivity(p.utility, n=n, s=s, w0=p.w0)
    used_du = 1.0 if p.resolved("delta_u") == "paper" else true_du
    return EpsDeltaRelease(count=1, epsilon=p.eps2 * true_du / used_du)


def communication_release(p: CrdpOptions, count: int) -> Release:
    """``count`` noisy embedding releases of one record."""
    if math.isinf(p.eps3):
        return UnboundedRelease(count=count, reason="eps3 = inf: embeddings released without noise")
    if p.resolved("sensitivity") == "unit":
        return UnboundedRelease(count=count, reason="s = 1 is assumed but nothing bounds a record's h")
    # scale Delta/eps3 with Delta >= s (the self term): at least 1/eps3 relative to s
    return LaplaceRelease(count=count, scale=1.0 / p.eps3)


#: Why the selection mechanisms are not audited at a boundary (docs/privacy.md, "The audit").
ONE_SHOT = (
    "a one-shot selection on the party's data before training: auditing it would need many reruns "
    "of the selection on neighbouring datasets, not runs of a hook on canaries"
)


def communication_boundary(p: CrdpOptions, s: float) -> EmbeddingBoundary:
    """The communication release's boundary: rows ``s`` apart in L1, the record sensitivity its
    Laplace scale ``Delta/eps3`` (``Delta >= s``) is calibrated to. Under ``sensitivity: unit``
    nothing bounds a row (``assumed``); ``clipped`` clips every coordinate to ``[-clip, clip]``,
    so two rows are at most ``s = 2 d_out clip`` apart."""
    return EmbeddingBoundary(sensitivity=s, norm="l1", assumed=p.resolved("sensitivity") == "unit")


def pearson_notes(mode: str) -> tuple[str, ...]:
    if mode == "paper":
        return (
            "paper mode: Lap(1/eps1) per coefficient; the sound figure uses sensitivity 2 per coefficient "
            "and basic composition over every pair of the party's columns",
        )
    return ("strict mode: sensitivity 2, eps1 split over the pairs by basic composition",)


def communication_notes(p: CrdpOptions) -> tuple[str, ...]:
    notes = [
        "record-level replace-one DP of each released row; correlated records are covered "
        "only through the data-dependent Delta (local sensitivity), which is itself not protected",
        "the bottom model depends on earlier training records; that dependence is not covered",
    ]
    if not p.noise_at_eval:
        notes.append("test rows' embeddings are released without noise at evaluation")
    if p.resolved("sensitivity") == "unit":
        notes.append("sensitivity 'unit' leaves h unclipped: no finite record-level guarantee")
    if p.delta_scope == "merged_secure":
        notes.append(
            "Delta_CS_p is of the merged data of every crdp party's kept columns, computed in CrypTen "
            "MPC; the scalar, the mean MCD and the total column count are opened to every MPC party "
            "without noise"
        )
    else:
        notes.append("Delta_CS_p is of this party's own kept columns (delta_scope 'own')")
    return tuple(notes)


def crdp_mechanisms(
    p: CrdpOptions, plan: Plan, *, width: int | None, s: float, n_orgs: int
) -> list[Mechanism]:
    """The three releases of docs/methods/crdp-fl.md §2.8 about one training record, composed
    soundly by the shared accountant; the paper's own figures are in ``claim``.

    Data-independent bounds: the Pearson count uses the party's column count
    ``width``, the communication scale uses ``Delta >= s``, which holds for the own
    and the merged ``Delta_CS_p`` alike (the self term). ``n_orgs``: how many
    passive parties run crdp (the N of the spec's sound total)."""
    t = plan.communication_rounds  # the paper's t: one per step, or per R (training.local_steps)
    total = {
        "paper_total_epsilon": paper_epsilon(p.eps1, p.eps2, p.m, p.eps3, t),
        "paper_total_formula": "max(eps1, m*eps2 + t*eps3)",
        "spec_sound_epsilon": sound_epsilon(n_orgs, p.eps1, p.eps2, p.eps3, t),
        "spec_sound_formula": "N*eps1 + eps2 + t*eps3 (paper's sensitivities taken at face value)",
        "t": t,
        "m": p.m,
        "N": n_orgs,
    }
    out = []
    if p.feature_selection:
        out.append(
            Mechanism(
                "crdp.pearson",
                (pearson_release(p, width),),
                claim={"epsilon": p.eps1, "statement": "Pearson + Laplace is eps1-DP", **total},
                notes=pearson_notes(p.resolved("pearson")),
                unaudited_reason=ONE_SHOT,
            )
        )
        out.append(
            Mechanism(
                "crdp.feature_optimization",
                (em_release(p, plan.n_train, s),),
                claim={
                    "epsilon": p.m * p.eps2,
                    "statement": "the exponential mechanism is m*eps2-DP",
                    **total,
                },
                notes=(
                    "the stability selection, the MCD and the candidate sensitivities are computed "
                    "from the data without noise and are not covered",
                ),
                unaudited_reason=ONE_SHOT,
            )
        )
    out.append(
        Mechanism(
            "crdp.communication",
            (communication_release(p, plan.record_releases),),
            claim={
                "epsilon": t * p.eps3,
                "statement": "t rounds at eps3 each (a round's R batches are disjoint rows)",
                "per_release_epsilon": p.eps3,
                "delta_scope": p.delta_scope,  # its data-dependent value: report()["delta_used"]
                **total,
            },
            notes=communication_notes(p),
            boundary=communication_boundary(p, s),
        )
    )
    return out


def crdp_prediction_mechanisms(p: CrdpOptions) -> list[Mechanism]:
    """What one prediction releases about each predicted record: its embedding,
    once, with the communication noise under ``noise_at_eval`` and without noise
    otherwise (no finite figure)."""
    release = (
        communication_release(p, 1)
        if p.noise_at_eval
        else UnboundedRelease(count=1, reason="noise_at_eval off: predicted rows are released without noise")
    )
    notes = ("one release of each predicted record's embedding per prediction", *communication_notes(p)[:1])
    claim = {"epsilon": p.eps3, "statement": "one round at eps3"}
    return [Mechanism("crdp.communication", (release,), claim=claim, notes=notes)]
