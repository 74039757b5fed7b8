"""Figures for the paper's analysis (spec §3.3–3.5): speed-up and extra arithmetic against γ.

Drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global backend switch), so it
is safe in servers, tests and threads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..cache import write_atomic
from ..theory import PlanRow

SPEEDUP_COLOR = "#1f77b4"
ARITHMETIC_COLOR = "#d62728"
BEST_COLOR = "#2ca02c"


def _fmt(x: float) -> str:
    return f"{x:g}"


def plot_plan(
    rows: Sequence[PlanRow],
    alpha: float,
    c: float,
    path: str | os.PathLike[str],
    *,
    c_hat: float | None = None,
    verify_slope: float = 0.0,
    paper_rows: Sequence[PlanRow] | None = None,
) -> None:
    """Draw a :func:`specdec.theory.plan` as the spec's figure and write it as a PNG to ``path``.

    Both series are factors relative to ordinary decoding (one target run per token): the expected
    wall-time speed-up (Thm 3.8) and the expected total arithmetic (Thm 3.11). The best γ gets a
    vertical line and a note. ``c_hat`` (ĉ) only labels the title, when it differs from c.
    With a ``verify_slope`` the plan used T(k)/T(1) = 1 + slope·(k − 1); ``paper_rows`` (the same
    plan under the paper's T(k) = T(1)) are then drawn too, dotted, for comparison.
    The file is written atomically: a temporary file in the same folder, then ``os.replace``.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("rows must hold at least one PlanRow (got an empty plan)")
    best = [r for r in rows if r.best]
    if len(best) != 1:
        raise ValueError(f"rows must mark exactly one best γ, found {len(best)}")
    best_row = best[0]
    gammas = [r.gamma for r in rows]

    fig = Figure(figsize=(7.5, 4.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.axhline(1.0, color="0.6", linewidth=1, linestyle=":", zorder=1)
    cost_label = f", T(k)/T(1) = 1 + {_fmt(verify_slope)}(k−1)" if verify_slope else ""
    ax.plot(
        gammas, [r.speedup for r in rows], "o-", color=SPEEDUP_COLOR, zorder=3,
        label=f"wall-time speed-up (Thm 3.8{cost_label})",
    )
    if paper_rows:
        ax.plot([r.gamma for r in paper_rows], [r.speedup for r in paper_rows], ":", color=SPEEDUP_COLOR,
                alpha=0.6, zorder=2, label="speed-up if T(k) = T(1) (the paper's assumption)")
    ax.plot(
        gammas, [r.arithmetic for r in rows], "s--", color=ARITHMETIC_COLOR, zorder=3,
        label="total arithmetic (Thm 3.11)",
    )
    ax.axvline(best_row.gamma, color=BEST_COLOR, linewidth=1.5, alpha=0.8, zorder=2,
               label=f"best γ = {best_row.gamma}")
    # The note sits low (below 1×, where a plan with a gain has no data) beside the line, on the
    # side with more room; without a gain (α ≤ c) the low left corner holds the data, so go higher.
    gain = best_row.speedup > 1.0
    right_half = best_row.gamma > (gammas[0] + gammas[-1]) / 2
    ax.plot([best_row.gamma], [best_row.speedup], "*", color=BEST_COLOR, markersize=16, zorder=5)
    ax.annotate(  # next to the vertical line, which leads up to the starred best point
        f"best γ = {best_row.gamma}\n{best_row.speedup:.2f}× "
        f"{'faster' if gain else 'the speed (no gain)'}\n{best_row.arithmetic:.2f}× the arithmetic",
        xy=(best_row.gamma, best_row.speedup),
        xytext=(best_row.gamma + (-0.25 if right_half else 0.25), 0.04 if gain else 0.5),
        textcoords=ax.get_xaxis_transform(),  # x in data units, y as a fraction of the axes
        ha="right" if right_half else "left", va="bottom", fontsize=9, zorder=6,
        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": BEST_COLOR},
    )

    ax.set_xlabel("γ (drafted tokens per round)")
    ax.set_ylabel("factor vs. ordinary decoding (×)")
    ax.set_xticks(gammas if len(gammas) <= 16 else gammas[:: (len(gammas) + 15) // 16])
    top = max(max(r.speedup for r in [*rows, *(paper_rows or [])]), max(r.arithmetic for r in rows))
    ax.set_ylim(0, top * 1.12)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9, framealpha=0.9)
    costs = f"c = {_fmt(c)}"
    if c_hat is not None and c_hat != c:
        costs += f", ĉ = {_fmt(c_hat)}"
    ax.set_title(f"Speculative decoding: expected gains for α = {_fmt(alpha)}, {costs}")
    fig.tight_layout()
    save_png(fig, path)


def save_png(fig: Figure, path: str | os.PathLike[str]) -> None:
    """Write a figure as a PNG atomically: a temporary file in the same folder, then ``os.replace``."""
    write_atomic(path, lambda f: fig.savefig(f, format="png"), prefix=".plot-")


def plot_measure(measurement, path: str | os.PathLike[str]) -> None:
    """Predicted against measured speed-up over γ, one panel per temperature (``specdec measure``).

    Lines: Thm 3.8 as in the paper (T(k) = T(1)) and with the measured cost curve T(k); points:
    the measured speed-ups; horizontal lines: policies (auto, heuristic) with their mean γ. The
    recommended γ is starred. Written atomically like :func:`plot_plan`.
    """
    tables = list(measurement.speed)
    if not tables:
        raise ValueError("the measurement has no speed tables to draw")
    fig = Figure(figsize=(6.0 * len(tables), 4.6), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(tables), squeeze=False)[0]
    for ax, table in zip(axes, tables, strict=True):
        gammas = [r.gamma for r in table.rows]
        ax.axhline(1.0, color="0.6", linewidth=1, linestyle=":", zorder=1)
        ax.plot(gammas, [r.predicted for r in table.rows], "--", color="0.45", label="Thm 3.8 (T(k) = T(1))")
        ax.plot(gammas, [r.predicted_cost_curve for r in table.rows], "-", color=SPEEDUP_COLOR,
                label="Thm 3.8 with measured T(k)")
        measured = [(r.gamma, r.measured) for r in table.rows if r.measured is not None]
        if measured:
            ax.plot(*zip(*measured, strict=True), "o", color=ARITHMETIC_COLOR, markersize=7, zorder=4, label="measured")
        for i, run in enumerate(r for r in table.runs if not r.gamma.isdigit()):
            label = f"measured {run.gamma}" + (f" (mean γ {run.mean_gamma:.1f})" if run.mean_gamma is not None else "")
            ax.axhline(run.speedup, color=f"C{i + 4}", linewidth=1.5, linestyle="-.", label=label)
        best = next(r for r in table.rows if r.gamma == table.recommended_gamma)
        ax.plot([best.gamma], [best.predicted_cost_curve], "*", color=BEST_COLOR, markersize=15, zorder=5,
                label=f"recommended γ = {best.gamma}")
        ax.set_xlabel("γ (drafted tokens per round)")
        ax.set_ylabel("speed-up vs. plain decoding (×)")
        ax.set_xticks(gammas if len(gammas) <= 16 else gammas[:: (len(gammas) + 15) // 16])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
        ax.set_title(f"temperature {_fmt(table.temperature)}: α = {table.alpha:.2f}, c = {table.c:.2f} "
                     f"({table.draft})", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
