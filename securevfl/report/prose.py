"""The report's prose, written from the numbers it holds: what each attack
achieves under each protocol against its chance level, what each defense costs
in utility against the undefended run, what each backend costs per step against
``plain``, which privacy budgets are too large to be read as a guarantee, what the
privacy audit and the record-level attacks measured against each claim, and which
results are no better than predicting the majority class.
Pure functions of a :class:`~securevfl.report.aggregate.Summary`."""

from __future__ import annotations

import math
from typing import Any

from securevfl.report.aggregate import Group, Summary
from securevfl.report.audit import NO_DP
from securevfl.report.rows import BOUND
from securevfl.report.stats import Interval

#: a composed epsilon above this is reported as no meaningful guarantee
EPS_MEANINGFUL = 8.0
#: relative rounding of the accountant's figures: a mechanism calibrated to eps 8 composes to
#: 8.000000000000007 (the Gaussian's inverse in floating point), which is within 8
EPS_ROUNDING = 1e-9
#: a utility loss (points) above which the report says the budget ruins utility
RUINOUS_POINTS = 10.0
#: an attack within this of its chance level (or whose interval holds it) is "at chance"
NEAR_CHANCE = 0.05
#: an accuracy within this of the test rows' majority rate (or below it) learned nothing useful
NEAR_MAJORITY = 0.01


def show(iv: Interval | None, digits: int = 2) -> str:
    """``0.83 ± 0.02`` (no ± for one seed)."""
    if iv is None:
        return "n/a"
    if math.isinf(iv.mean):
        return "inf"
    if not iv.half:  # one seed, or every seed the same
        return f"{iv.mean:.{digits}f}"
    return f"{iv.mean:.{digits}f} ± {iv.half:.{digits}f}"


def near_chance(iv: Interval, chance: float) -> bool:
    if abs(iv.mean - chance) <= NEAR_CHANCE:
        return True
    return iv.lo is not None and iv.hi is not None and iv.lo <= chance <= iv.hi


def utility(g: Group) -> tuple[Interval | None, str]:
    """The group's main performance: test AUC (binary), R² (regression), else accuracy."""
    for key, name in (("test_auc", "test AUC"), ("test_r2", "test R²")):
        if g.metrics.get(key) is not None:
            return g.metrics[key], name
    return g.metrics.get("test_accuracy"), "test accuracy"


def reference(g: Group, groups: list[Group]) -> Group | None:
    """The undefended protocol a group is measured against: same dataset, same
    backend if there is one, else ``plain``."""
    same = [
        r
        for r in groups
        if r.text.get("defenses") == "none" and r.text.get("dataset") == g.text.get("dataset")
    ]
    for want in (g.text.get("backend"), "plain"):
        for r in same:
            if r.text.get("backend") == want:
                return r
    return None


def plain_of(g: Group, groups: list[Group]) -> Group | None:
    """The undefended ``plain`` protocol on the same dataset, if compared."""
    return next(
        (
            r
            for r in groups
            if r.text.get("backend") == "plain"
            and r.text.get("defenses") == "none"
            and r.text.get("dataset") == g.text.get("dataset")
        ),
        None,
    )


def _seeds_line(s: Summary) -> str:
    n = sorted({len(g.seeds) for g in s.groups})
    if n == [1]:
        return (
            f"{len(s.groups)} protocols, one seed each: the figures below are single runs, "
            "without intervals; differences of a few hundredths may be noise."
        )
    return (
        f"{len(s.groups)} protocols, {'/'.join(map(str, n))} seeds each ({len(s.runs)} runs); "
        "`a ± b` is the mean over seeds and the half-width of its 95% Student-t interval."
    )


def _names(labels: list[str]) -> str:
    return ", ".join(f"`{x}`" for x in labels)


def attack_lines(s: Summary) -> list[str]:
    out = []
    for a in s.attacks:
        chance = s.chance.get(a, 0.0)
        parts: list[str] = []
        where: dict[str, list[str]] = {"above": [], "at": [], "below": []}
        lowest: tuple[float, str] | None = None
        for g in s.groups:
            iv = g.metrics.get(f"attack:{a}")
            if iv is None:
                continue
            parts.append(f"{show(iv)} under `{g.label}`")
            side = "at" if near_chance(iv, chance) else ("above" if iv.mean > chance else "below")
            where[side].append(g.label)
            if lowest is None or iv.mean < lowest[0]:
                lowest = (iv.mean, g.label)
        if not parts or lowest is None:
            continue
        line = f"- **{a}** (chance {chance:.2f}): " + "; ".join(parts) + "."
        said = [
            f"{side} chance under {_names(where[side])}" for side in ("above", "at", "below") if where[side]
        ]
        line += " " + "; ".join(said)[0].upper() + "; ".join(said)[1:] + "."
        if not where["at"] and len(parts) > 1:
            line += f" Closest to chance: `{lowest[1]}` ({lowest[0] - chance:+.2f})."
        crypto = _crypto_only_unchanged(s, a)
        if crypto:
            line += " " + crypto
        out.append(line)
    return out


def _crypto_only_unchanged(s: Summary, attack: str) -> str:
    """A sentence on crypto-only backends that leave the attack where plain has it."""
    same = []
    for g in s.groups:
        if g.text.get("defenses") != "none" or g.text.get("backend") == "plain":
            continue
        plain = plain_of(g, s.groups)
        a, b = g.metrics.get(f"attack:{attack}"), plain.metrics.get(f"attack:{attack}") if plain else None
        if a is not None and b is not None and plain is not None and abs(a.mean - b.mean) <= NEAR_CHANCE:
            same.append(f"`{g.label}` {a.mean:.2f} against `{plain.label}` {b.mean:.2f}")
    if not same:
        return ""
    return (
        "Encryption or secret sharing alone leaves it where plaintext training has it: "
        + "; ".join(same)
        + "."
    )


def resolved(a: Interval, b: Interval) -> str:
    """Whether seeds resolve a difference: '' for single seeds, else a clause
    saying whether the two 95% intervals overlap."""
    if a.lo is None or b.lo is None or a.hi is None or b.hi is None:
        return ""
    if a.hi < b.lo or b.hi < a.lo:
        return "; the intervals do not overlap"
    return "; the intervals overlap: these seeds do not resolve the difference"


def utility_lines(s: Summary) -> list[str]:
    out = []
    for g in s.groups:
        if g.text.get("defenses") == "none":
            plain = plain_of(g, s.groups)
            if g.text.get("backend") == "plain" or plain is None:
                continue
            mine, name = utility(g)
            theirs = utility(plain)[0]
            if mine is not None and theirs is not None:
                out.append(
                    f"- `{g.label}` ({g.text.get('backend')}, no defense) reaches {show(mine, 3)} {name} "
                    f"against `{plain.label}` {show(theirs, 3)}{resolved(mine, theirs)}."
                )
            continue
        ref = reference(g, s.groups)
        mine, name = utility(g)
        theirs = utility(ref)[0] if ref else None
        if ref is None or mine is None or theirs is None:
            continue
        delta = mine.mean - theirs.mean
        verb = "costs" if delta < 0 else "gains"
        out.append(
            f"- `{g.label}` ({g.text.get('defenses')}) {verb} {abs(delta) * 100:.1f} points of {name} "
            f"against `{ref.label}` ({show(mine, 3)} vs {show(theirs, 3)}{resolved(mine, theirs)})."
        )
    return out


def privacy_lines(s: Summary) -> list[str]:
    out = []
    for g in s.groups:
        eps = g.metrics.get("epsilon")
        if eps is None:
            continue
        delta = g.text.get("delta")
        at = f" at delta {delta:g}" if isinstance(delta, float) else ""
        if math.isinf(eps.mean):
            out.append(f"- `{g.label}`: eps inf{at}: the mechanism adds no noise, so it guarantees nothing.")
        elif eps.mean > EPS_MEANINGFUL * (1 + EPS_ROUNDING):
            out.append(
                f"- `{g.label}`: composed eps {show(eps, 3)}{at} is above {EPS_MEANINGFUL:g}: "
                "not a guarantee to rely on, whatever the attacks below it show."
            )
        else:
            line = f"- `{g.label}`: composed eps {show(eps, 3)}{at}, within {EPS_MEANINGFUL:g}."
            ref = reference(g, s.groups)
            mine, name = utility(g)
            theirs = utility(ref)[0] if ref else None
            if ref is not None and mine is not None and theirs is not None:
                loss = (theirs.mean - mine.mean) * 100
                if loss > RUINOUS_POINTS:
                    line += (
                        f" A guarantee of this size costs {loss:.1f} points of {name} against `{ref.label}` "
                        f"here ({mine.mean:.3f} vs {theirs.mean:.3f}): the noise that buys it drowns much of "
                        "what the model needs on a task this small."
                    )
                else:
                    line += f" It costs {loss:.1f} points of {name} against `{ref.label}`."
            out.append(line)
    return out


def cost_lines(s: Summary) -> list[str]:
    """Crypto cost (an undefended backend against undefended ``plain``) and the
    perturbation's own cost (a defended protocol against the undefended one on its
    backend), side by side."""
    out = []
    for g in s.groups:
        undefended = g.text.get("defenses") == "none"
        if undefended and g.text.get("backend") == "plain":
            continue
        base = plain_of(g, s.groups) if undefended else reference(g, s.groups)
        if base is None or base is g:
            continue
        t, t0 = g.mean("time_per_step_s"), base.mean("time_per_step_s")
        b, b0 = g.mean("bytes_per_step"), base.mean("bytes_per_step")
        if not (t and t0 and b and b0):
            continue
        what = g.text.get("backend") if undefended else f"{g.text.get('defenses')} on {g.text.get('backend')}"
        out.append(
            f"- `{g.label}` ({what}): {t / t0:.1f}x the time and {b / b0:.1f}x the bytes per step of "
            f"`{base.label}`."
        )
    return out


def _eps(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.3g}")


def _audit_sentence(rec: dict[str, Any], party: str, delta: Any) -> str:
    """One audit record in words: claim, measured bound, method and verdict."""
    at = f" at delta {delta:g}" if isinstance(delta, float) else ""
    composed = "" if rec.get("composed") is None else f" ({_eps(rec['composed'])} composed over the run)"
    head = (
        f"party `{party}`, `{rec['mechanism']}` claims eps {_eps(rec['per_release'])} per release"
        f"{composed}{at}"
    )
    if rec.get("verdict") == "unaudited" or rec.get("epsilon_lower") is None:
        why = f": {rec['reason']}" if rec.get("reason") else ""
        return f"{head}; not audited at its boundary{why}"
    conf = rec.get("confidence")
    how = f"{rec.get('method')}, {rec.get('trials')} trials" + (
        f", {conf:.0%} confidence" if isinstance(conf, float) else ""
    )
    if rec.get("basis"):
        how += f", {rec['basis']}"
    line = f"{head}; the audit measured eps ≥ {_eps(rec['epsilon_lower'])} ({how}): {rec['verdict']}"
    if rec.get("verdict") == "violated":
        line += (
            " — the lower bound lies above the claim at that confidence, so the implementation or "
            "the accounting is wrong"
        )
    else:
        line += " (a lower bound below the claim does not prove the claim)"
    return line


def _attack_bounds(g: Group, s: Summary) -> list[str]:
    """What each record-level attack's own counts imply, over the group's seeds."""
    out = []
    for a in s.attacks:
        iv = g.metrics.get(f"{BOUND}{a}")
        if iv is not None:
            out.append(f"`{a}`'s counts imply eps ≥ {show(iv, 3)} on the labels it guessed")
    return out


def audit_lines(s: Summary) -> list[str]:
    """Per compared protocol: each party's claim and what the audit measured (the reported
    sound-claim record, the nominal ones, those not audited), what record-level attacks'
    counts imply; for a protocol without DP, that nothing is claimed and what the attacks
    measured instead."""
    out = []
    for g in s.groups:
        bounds = _attack_bounds(g, s)
        if g.text.get("audit") == NO_DP:
            aps = [
                f"{a} {show(g.metrics[f'attack:{a}'])} (chance {s.chance.get(a, 0.0):.2f})"
                for a in s.attacks
                if g.metrics.get(f"attack:{a}") is not None
            ]
            if not aps and not bounds:
                out.append(f"- `{g.label}`: no DP mechanism, so no epsilon is claimed (eps inf).")
                continue
            line = f"- `{g.label}`: no DP mechanism, so no epsilon is claimed (eps inf); the attacks measured"
            line += " " + "; ".join(aps + bounds) + "."
            out.append(line)
            continue
        run = g.runs[0] if g.runs else {}
        m = run.get("measured") or {}
        parts = [_audit_sentence(rec, p, g.text.get("delta")) for p, rec in (m.get("parties") or {}).items()]
        parts += [
            _audit_sentence(rec, rec["party"], g.text.get("delta"))
            for rec in m.get("unaudited") or []
            if rec not in (m.get("parties") or {}).values()
        ]
        for rec in m.get("nominal") or []:
            verdict = rec.get("verdict")
            tail = (
                "the paper's figure does not hold (the sound figure is the accountant's)"
                if verdict == "violated"
                else str(verdict)
            )
            parts.append(
                f"party `{rec['party']}`, `{rec['mechanism']}`'s nominal (paper's) claim eps "
                f"{_eps(rec['per_release'])} per release against a measured eps ≥ "
                f"{_eps(rec.get('epsilon_lower'))}: {tail}"
            )
        if not parts and not bounds:
            out.append(f"- `{g.label}`: DP mechanisms ran but no audit record was kept.")
            continue
        n = len(g.seeds)
        seeds = f" (first of {n} seeds; the table's eps lower is the mean)" if n > 1 else ""
        line = f"- `{g.label}`{seeds}: " + "; ".join(parts) + "."
        if bounds:
            claim = g.metrics.get("eps_release")
            implied = {a: g.metrics.get(f"{BOUND}{a}") for a in s.attacks}
            above = [
                a
                for a, iv in implied.items()
                if claim is not None and iv is not None and iv.mean > claim.mean
            ]
            line += " " + "; ".join(bounds)[0].upper() + "; ".join(bounds)[1:] + "."
            if above:
                line += (
                    f" Above the claim per release ({_eps(claim.mean if claim else None)}) for "
                    f"{_names(above)}: either what the attacker holds besides the mechanism's output "
                    "(its own features) predicts the labels, or the claim does not hold; the audit's "
                    "verdict, not this figure, decides."
                )
        out.append(line)
    return out


def baseline_lines(s: Summary) -> list[str]:
    """Classification results against their trivial baseline: the accuracy of always
    predicting the test rows' majority class; a row within :data:`NEAR_MAJORITY` of it (or
    below) is flagged."""
    out = []
    for g in s.groups:
        acc, maj = g.metrics.get("test_accuracy"), g.metrics.get("test_majority_rate")
        if acc is None or maj is None:
            continue
        auc = g.metrics.get("test_auc")
        also = f", test AUC {show(auc, 3)}" if auc is not None else ""
        if acc.mean <= maj.mean + NEAR_MAJORITY:
            out.append(
                f"- `{g.label}`: test accuracy {show(acc, 3)} against a majority rate of {show(maj, 3)}"
                f"{also}: no better than predicting the majority class."
            )
        else:
            out.append(
                f"- `{g.label}`: test accuracy {show(acc, 3)} against a majority rate of {show(maj, 3)}"
                f"{also} ({(acc.mean - maj.mean) * 100:+.1f} points)."
            )
    return out


def findings(s: Summary) -> list[str]:
    """The report's 'what it shows' section, as markdown lines."""
    body = [_seeds_line(s), ""]
    sections = (
        ("What each attack achieves", attack_lines(s)),
        ("What each defense costs in utility", utility_lines(s)),
        ("Results against their baseline (the majority class)", baseline_lines(s)),
        ("Privacy budgets", privacy_lines(s)),
        ("Measured privacy: claims, the audit and record-level attacks", audit_lines(s)),
        ("What crypto and each defense cost per step", cost_lines(s)),
    )
    for title, lines in sections:
        if lines:
            body += [f"**{title}**", "", *lines, ""]
    return body
