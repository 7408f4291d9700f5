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
from securevfl.report.markdown import code, text
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
    """``0.83 ± 0.02`` (no ± for one seed); ``0.98 [0.93, 1.00]`` when the
    metric's range clips the interval."""
    if iv is None:
        return "n/a"
    if math.isinf(iv.mean):
        return "inf"
    if not iv.half:  # one seed, or every seed the same
        return f"{iv.mean:.{digits}f}"
    if iv.clipped and iv.lo is not None and iv.hi is not None:
        return f"{iv.mean:.{digits}f} [{iv.lo:.{digits}f}, {iv.hi:.{digits}f}]"
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
    return ", ".join(code(x) for x in labels)


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
            parts.append(f"{show(iv)} under {code(g.label)}")
            side = "at" if near_chance(iv, chance) else ("above" if iv.mean > chance else "below")
            where[side].append(g.label)
            if lowest is None or iv.mean < lowest[0]:
                lowest = (iv.mean, g.label)
        if not parts or lowest is None:
            continue
        line = f"- **{text(a)}** (chance {chance:.2f}): " + "; ".join(parts) + "."
        said = [
            f"{side} chance under {_names(where[side])}" for side in ("above", "at", "below") if where[side]
        ]
        line += " " + "; ".join(said)[0].upper() + "; ".join(said)[1:] + "."
        if not where["at"] and len(parts) > 1:
            line += f" Closest to chance: {code(lowest[1])} ({lowest[0] - chance:+.2f})."
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
            same.append(f"{code(g.label)} {a.mean:.2f} against {code(plain.label)} {b.mean:.2f}")
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
                    f"- {code(g.label)} ({text(g.text.get('backend'))}, no defense) "
                    f"reaches {show(mine, 3)} {name} "
                    f"against {code(plain.label)} {show(theirs, 3)}{resolved(mine, theirs)}."
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
            f"- {code(g.label)} ({text(g.text.get('defenses'))}) {verb} "
            f"{abs(delta) * 100:.1f} points of {name} "
            f"against {code(ref.label)} ({show(mine, 3)} vs {show(theirs, 3)}{resolved(mine, theirs)})."
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
            out.append(
                f"- {code(g.label)}: eps inf{at}: a mechanism adds no noise, or noise the options give "
                "no bound on (see its `notes` in result.json), so it guarantees nothing."
            )
        elif eps.mean > EPS_MEANINGFUL * (1 + EPS_ROUNDING):
            out.append(
                f"- {code(g.label)}: composed eps {show(eps, 3)}{at} is above {EPS_MEANINGFUL:g}: "
                "not a guarantee to rely on, whatever the attacks below it show."
            )
        else:
            line = f"- {code(g.label)}: composed eps {show(eps, 3)}{at}, within {EPS_MEANINGFUL:g}."
            ref = reference(g, s.groups)
            mine, name = utility(g)
            theirs = utility(ref)[0] if ref else None
            if ref is not None and mine is not None and theirs is not None:
                loss = (theirs.mean - mine.mean) * 100
                if loss > RUINOUS_POINTS:
                    line += (
                        f" A guarantee of this size costs {loss:.1f} points of {name} "
                        f"against {code(ref.label)} "
                        f"here ({mine.mean:.3f} vs {theirs.mean:.3f}): the noise that buys it drowns much of "
                        "what the model needs on a task this small."
                    )
                else:
                    line += f" It costs {loss:.1f} points of {name} against {code(ref.label)}."
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
            f"- {code(g.label)} ({text(what)}): {t / t0:.1f}x the time and {b / b0:.1f}x the bytes "
            "per step of "
            f"{code(base.label)}."
        )
    return out


def _eps(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.3g}")


def _mechanism_sentence(recs: list[dict[str, Any]], delta: Any) -> str:
    """The audit records of one mechanism, claim and basis over the parties, in words: the
    claim, every party's measured bound, the method and the verdict."""
    first = recs[0]
    at = f" at delta {delta:g}" if isinstance(delta, float) else ""
    composed = "" if first.get("composed") is None else f" ({_eps(first['composed'])} composed)"
    claims = sorted({_eps(r["per_release"]) for r in recs})
    if first.get("method") == "none":
        mechs = {r["mechanism"]: _eps(r["per_release"]) for r in recs}
        named = ", ".join(f"{code(m)} (eps {e}{at})" for m, e in mechs.items())
        who = ", ".join(dict.fromkeys(text(r["party"]) for r in recs))
        why = f" ({text(first['reason'])})" if first.get("reason") else ""
        return f"{named} at {who}: not audited{why}"
    bounds = ", ".join(f"{_eps(r['epsilon_lower'])} ({text(r['party'])})" for r in recs)
    conf = first.get("confidence")
    how = f"{first.get('method')}, {first.get('trials')} trials" + (
        f", {conf:.0%} confidence" if isinstance(conf, float) else ""
    )
    how += f", {first['basis']}" if first.get("basis") else ""
    violated = [text(r["party"]) for r in recs if r.get("verdict") == "violated"]
    if first.get("claim") == "nominal":
        head = (
            f"the paper's own (nominal) claim for {code(first['mechanism'])}, "
            f"eps {'/'.join(claims)} per release"
        )
    else:
        head = f"{code(first['mechanism'])} claims eps {'/'.join(claims)} per release{composed}{at}"
    line = f"{head}; the audit measured eps ≥ {bounds} ({how})"
    if not violated:
        return line + ": consistent"
    line += f": violated for {', '.join(violated)}"
    if first.get("claim") == "nominal":
        return line + " (the paper's figure does not hold; the accountant's is the one that holds)"
    return (
        line + " (the bound lies above the claim at that confidence: the implementation or the "
        "accounting is wrong)"
    )


def _attack_bounds(g: Group, s: Summary) -> list[str]:
    """What each record-level attack's own counts imply, over the group's seeds."""
    out = []
    for a in s.attacks:
        iv = g.metrics.get(f"{BOUND}{a}")
        if iv is not None:
            out.append(f"{code(a)}'s counts imply eps ≥ {show(iv, 3)} on the labels it guessed")
    return out


def _by_mechanism(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Audit records grouped by (claim, mechanism, basis): sound claims, then nominal ones,
    then every mechanism not audited for one reason together."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (r.get("method") == "none", r.get("claim") != "sound")):
        if r.get("method") == "none":
            key: tuple[str, ...] = ("none", str(r.get("reason")))
        else:
            key = (str(r.get("claim")), str(r["mechanism"]), str(r.get("basis")), str(r.get("method")))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def audit_lines(s: Summary) -> list[str]:
    """Per compared protocol: each mechanism's claim and what the audit measured at every
    party (sound claims, then those not audited, then the papers' nominal claims) and what
    record-level attacks' counts imply; for a protocol without DP, that nothing is claimed and
    what the attacks measured instead."""
    out = []
    for g in s.groups:
        bounds = _attack_bounds(g, s)
        if g.text.get("audit") == NO_DP:
            aps = [
                f"{text(a)} {show(g.metrics[f'attack:{a}'])} (chance {s.chance.get(a, 0.0):.2f})"
                for a in s.attacks
                if g.metrics.get(f"attack:{a}") is not None
            ]
            if not aps and not bounds:
                out.append(f"- {code(g.label)}: no DP mechanism, so no epsilon is claimed (eps inf).")
                continue
            line = f"- {code(g.label)}: no DP mechanism, so no epsilon is claimed (eps inf); "
            line += "the attacks measured"
            line += " " + "; ".join(aps + bounds) + "."
            out.append(line)
            continue
        run = g.runs[0] if g.runs else {}
        records = (run.get("measured") or {}).get("records") or []
        parts = [_mechanism_sentence(recs, g.text.get("delta")) for recs in _by_mechanism(records)]
        if not parts:
            parts = ["DP mechanisms ran but no audit record was kept"]
        n = len(g.seeds)
        seeds = f" (first of {n} seeds; the table's eps lower is the mean)" if n > 1 else ""
        line = f"- {code(g.label)}{seeds}: " + "; ".join(parts) + "."
        if bounds:
            line += " " + "; ".join(bounds)[0].upper() + "; ".join(bounds)[1:] + "."
            sound = [r for r in records if r.get("claim") == "sound" and r.get("method") != "none"]
            tightest = min(sound, key=lambda r: r["per_release"], default=None)
            implied = {a: g.metrics.get(f"{BOUND}{a}") for a in s.attacks}
            above = [
                a
                for a, iv in implied.items()
                if tightest is not None and iv is not None and iv.mean > tightest["per_release"]
            ]
            if tightest is not None and above:
                line += (
                    f" Above the smallest claim per release, {code(tightest['mechanism'])}'s "
                    f"{_eps(tightest['per_release'])}, for {_names(above)}: either that mechanism does not "
                    "protect what the attack guesses, what the attacker holds besides its output (its "
                    "own features) predicts the labels, or the claim does not hold; the audit's verdict, "
                    "not this figure, decides."
                )
        out.append(line)
    if any("consistent" in line for line in out):
        out.append("- A lower bound below its claim does not prove the claim: this test could not refute it.")
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
                f"- {code(g.label)}: test accuracy {show(acc, 3)} against a majority rate of {show(maj, 3)}"
                f"{also}: no better than predicting the majority class."
            )
        else:
            out.append(
                f"- {code(g.label)}: test accuracy {show(acc, 3)} against a majority rate of {show(maj, 3)}"
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
