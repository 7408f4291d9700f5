"""The comparison's figures, drawn on matplotlib ``Figure`` objects directly
(without pyplot, so no global backend is chosen for the importing process):

* privacy-utility per attack: attack performance against utility, one point per
  compared protocol, with the seeds' 95% intervals as error bars;
* grid curves: per attack and per grid key, utility and attack performance against
  the key's values, error bars from the seeds;
* cost: time and bytes per step per protocol on log scales, so crypto cost and
  the (small) cost of perturbation sit side by side;
* the digits reconstruction grid: true against reconstructed features.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from securevfl.report.aggregate import Group, Summary
from securevfl.report.stats import Interval

UTILITY = "utility"


def utility_interval(g: Group) -> tuple[Interval | None, str]:
    """(interval, name) of the group's main performance: test AUC on binary tasks."""
    for key, name in (("test_auc", "test AUC"), ("test_r2", "test R²")):
        if g.metrics.get(key) is not None:
            return g.metrics[key], name
    return g.metrics.get("test_accuracy"), "test accuracy"


def _errs(ivs: Sequence[Interval | None]) -> list[list[float]]:
    """matplotlib's asymmetric error bars (below, above each mean) of ``ivs``:
    each interval as clipped to its metric's range (an accuracy's stops at 1)."""
    pairs = [
        (0.0, 0.0) if iv is None or iv.lo is None or iv.hi is None else (iv.mean - iv.lo, iv.hi - iv.mean)
        for iv in ivs
    ]
    return [[b for b, _ in pairs], [a for _, a in pairs]]


#: a character's mean width in ems, in matplotlib's default sans-serif font (a wide estimate)
CHAR_EM = 0.6


def wrap_title(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize``
    points, so that a long title (a protocol's name with its grid point) wraps
    instead of running past the figure's edge, where it would be clipped."""
    chars = max(16, int(width_in * 72 / (fontsize * CHAR_EM)))
    return textwrap.fill(text, chars, break_on_hyphens=False)


def plot_privacy_utility(summary: Summary, path: Path) -> Path | None:
    """One panel per attack: attack performance (x, lower = more private) against
    main performance (y), one labelled point per protocol with the seeds' intervals."""
    if not summary.attacks:
        return None
    attacks = summary.attacks
    fig = Figure(figsize=(4.6 * len(attacks), 4.2))
    axes = fig.subplots(1, len(attacks), squeeze=False)
    for ax, a in zip(axes[0], attacks, strict=True):
        for g in summary.groups:
            ap = g.metrics.get(f"attack:{a}")
            mp, _ = utility_interval(g)
            if ap is None or mp is None:
                continue
            marker = "o" if g.text.get("defenses") == "none" else "^"
            ax.errorbar(ap.mean, mp.mean, xerr=_errs([ap]), yerr=_errs([mp]), fmt=marker, ms=5, capsize=2)
            ax.annotate(g.label, (ap.mean, mp.mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axvline(summary.chance.get(a, 0.0), color="grey", lw=0.8, ls="--")
        ax.set_title(wrap_title(a, 4.2, 10), fontsize=10)
        ax.set_xlabel("attack performance (AP; dashed = chance)")
        ax.set_ylabel("main performance (test AUC or accuracy)")
        ax.grid(alpha=0.3)
    fig.suptitle(
        wrap_title(
            "privacy-utility: o = no defense, ^ = defended; bars: 95% interval over seeds",
            4.6 * len(attacks),
            12,
        )
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _x_axis(ax: Axes, values: list[Any]) -> tuple[list[float], list[Any]]:
    """x positions for a grid key's values: the values themselves (log scale when
    positive and spread over a decade or more), else evenly spaced categories."""
    if _numeric(values):
        xs = [float(v) for v in values]
        if min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])  # ticks at the grid values only
        ax.xaxis.set_minor_locator(NullLocator())
        return xs, values
    ax.set_xticks(range(len(values)), [str(v) for v in values])
    return [float(i) for i in range(len(values))], values


def plot_grid_curves(summary: Summary, axes_of: dict[str, list[str]], path: Path) -> Path | None:
    """Per protocol with a grid, per grid key (rows) and attack (columns): utility
    and attack performance against the key's values, error bars from the seeds.
    Points that differ in another grid key are drawn as separate lines."""
    panels = [(base, key) for base, keys in axes_of.items() for key in keys]
    attacks: list[str | None] = [*summary.attacks] or [None]
    if not panels:
        return None
    width = max(6.0, 4.4 * len(attacks))
    fig = Figure(figsize=(width, 3.8 * len(panels)))
    grid = fig.subplots(len(panels), len(attacks), squeeze=False)
    for i, (base, key) in enumerate(panels):
        mine = [g for g in summary.groups if g.base == base and key in g.point]
        others: dict[Any, Any] = {}
        for g in mine:
            rest = tuple(sorted((k, str(v)) for k, v in g.point.items() if k != key))
            others.setdefault(rest, []).append(g)
        values = list(dict.fromkeys(g.point[key] for g in mine))
        short = key.rsplit(".", 1)[-1]
        for j, a in enumerate(attacks):
            ax = grid[i][j]
            xs, _ = _x_axis(ax, values)
            pos = dict(zip(map(str, values), xs, strict=True))
            for rest, gs in others.items():
                tag = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in rest)
                gs = sorted(gs, key=lambda g: pos[str(g.point[key])])
                x = [pos[str(g.point[key])] for g in gs]
                mps = [utility_interval(g) for g in gs]
                name = mps[0][1] if mps else UTILITY
                ax.errorbar(
                    x,
                    [m.mean if m else np.nan for m, _ in mps],
                    yerr=_errs([m for m, _ in mps]),
                    marker="o",
                    capsize=3,
                    label=f"{name} {tag}".strip(),
                )
                if a is not None:
                    aps = [g.metrics.get(f"attack:{a}") for g in gs]
                    ax.errorbar(
                        x,
                        [m.mean if m else np.nan for m in aps],
                        yerr=_errs(aps),
                        marker="s",
                        ls="--",
                        capsize=3,
                        label=f"AP {a} {tag}".strip(),
                    )
            if a is not None:
                ax.axhline(summary.chance.get(a, 0.0), color="grey", lw=0.8, ls=":")
            ax.set_xlabel(short)
            ax.set_title(wrap_title(f"{base}: {a or 'utility'}", width / len(attacks) - 0.4, 9), fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(
        "utility and attack performance per grid value\n(dotted = chance; bars: 95% interval over seeds)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def plot_cost(summary: Summary, path: Path) -> Path | None:
    """Time and bytes per step per protocol, horizontal bars on log scales."""
    gs = [g for g in summary.groups if g.mean("time_per_step_s") or g.mean("bytes_per_step")]
    if not gs:
        return None
    fig = Figure(figsize=(10, 0.38 * len(gs) + 1.4))
    ax_t, ax_b = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(gs))
    colors = {"plain": "tab:green", "mpc": "tab:blue", "ckks": "tab:purple", "paillier": "tab:red"}
    for ax, key, scale, unit in (
        (ax_t, "time_per_step_s", 1000.0, "ms per step (active party)"),
        (ax_b, "bytes_per_step", 1 / 1024, "KiB per step (all ranks)"),
    ):
        ivs = [g.metrics.get(key) for g in gs]
        vals = [iv.mean * scale if iv else np.nan for iv in ivs]
        errs = np.array(_errs(ivs)) * scale
        # bars grow from a decade below the smallest value, so every bar has a visible length
        finite = [v for v in vals if np.isfinite(v) and v > 0]
        left = 10 ** math.floor(math.log10(min(finite))) / 10 if finite else 1e-3
        ax.barh(
            y,
            [v - left for v in vals],
            left=left,
            xerr=errs if errs.any() else None,
            color=[colors.get(str(g.text.get("backend")), "tab:grey") for g in gs],
            capsize=2,
        )
        for yi, v in zip(y, vals, strict=True):
            if np.isfinite(v):
                ax.annotate(
                    f"{v:.3g}", (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
                )
        ax.set_xscale("log")
        ax.set_xlim(left=left, right=max(finite) * 4 if finite else None)
        ax.set_xlabel(unit + ", log scale")
        ax.grid(alpha=0.3, axis="x")
    ax_t.set_yticks(y, [g.label for g in gs], fontsize=7)
    ax_t.invert_yaxis()
    fig.suptitle(
        wrap_title("cost per training step; colour = backend; bars: 95% interval over seeds", 10, 9),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def reconstruction_grids(summary: Summary) -> list[tuple[str, Path]]:
    """(protocol, npz) of the feature-reconstruction grid of each compared
    protocol's first seed."""
    out = []
    for g in summary.groups:
        row = g.runs[0]
        folder = row.get("folder")
        for grid in (row.get("grids") or {}).values():
            if grid and folder is not None and (Path(folder) / grid).exists():
                out.append((g.label, Path(folder) / grid))
    return out


def plot_digit_grid(grids: list[tuple[str, Path]], path: Path, n: int = 10) -> Path | None:
    """First row: the victim's true features (as images); then one row per
    protocol: what the active party reconstructed from what it received."""
    if not grids:
        return None
    data = [(name, np.load(p)) for name, p in grids]
    orig = data[0][1]["original"][:n]
    n = len(orig)
    vmin, vmax = float(orig.min()), float(orig.max())
    fig = Figure(figsize=(0.9 * n, 1.25 * (len(data) + 1)))
    axes = fig.subplots(len(data) + 1, n, squeeze=False)
    for j in range(n):
        axes[0][j].imshow(orig[j], cmap="gray_r", vmin=vmin, vmax=vmax)
    axes[0][0].set_ylabel("original", rotation=0, ha="right", va="center", fontsize=8)
    for i, (name, arr) in enumerate(data, 1):
        rec = arr["reconstruction"][:n]
        for j in range(n):
            axes[i][j].imshow(rec[j], cmap="gray_r", vmin=vmin, vmax=vmax)
        axes[i][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
    for row in axes:
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        wrap_title(
            "feature reconstruction by the active party: true vs reconstructed (test rows)", 0.9 * n, 9
        ),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path
