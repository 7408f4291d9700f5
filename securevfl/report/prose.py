"""The report's prose, written from the numbers it holds: what each attack
achieves under each protocol against its chance level, what each defense costs
in utility against the undefended run, what each backend costs per step against
``plain``, and which privacy budgets are too large to be read as a guarantee.
Pure functions of a :class:`~securevfl.report.aggregate.Summary`."""

from __future__ import annotations

import math

from securevfl.report.aggregate import Group, Summary
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


def findings(s: Summary) -> list[str]:
    """The report's 'what it shows' section, as markdown lines."""
    body = [_seeds_line(s), ""]
    sections = (
        ("What each attack achieves", attack_lines(s)),
        ("What each defense costs in utility", utility_lines(s)),
        ("Privacy budgets", privacy_lines(s)),
        ("What crypto and each defense cost per step", cost_lines(s)),
    )
    for title, lines in sections:
        if lines:
            body += [f"**{title}**", "", *lines, ""]
    return body
