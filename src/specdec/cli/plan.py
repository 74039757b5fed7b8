"""``specdec plan``: predicted speed-up and extra arithmetic for each γ (spec §3.3–3.5).

Argument parsing and printing only; every number comes from :mod:`specdec.theory`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from .. import strict_json, theory

DESCRIPTION = """\
Predict, from the paper's formulas, what speculative decoding gains for each γ
(drafted tokens per round): expected tokens per target run (Eq. 1), expected
wall-time speed-up (Thm 3.8) and expected total arithmetic (Thm 3.11), all
relative to ordinary decoding with the target alone. The best γ (largest
speed-up, ties to the smaller γ) is marked with '*'.

α is the mean over generated text of β = Σ min(p, q), the overlap of the
target's (p) and the draft's (q) probability lists; c is the time of one draft
run divided by the time of one target run. The paper assumes the target scores
γ + 1 tokens in one run as fast as 1; where it does not (a CPU: `specdec measure`
reports T(k)/T(1)), --verify-slope s uses T(k)/T(1) = 1 + s·(k − 1) instead."""

EPILOG = """\
example: specdec plan --alpha 0.8 --cost 0.05 --plot plan.png
Any gain needs α > c (Cor. 3.9); even a free draft gives at most 1/(1 − α)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="predict speed-up and extra arithmetic for each γ, and pick the best γ",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--alpha", type=float, required=True, metavar="α",
        help="acceptance rate α = E[β] of the draft against the target, in [0, 1) (required)",
    )
    p.add_argument(
        "--cost", type=float, required=True, metavar="c",
        help="c: time of one draft run / time of one target run, ≥ 0 (required)",
    )
    p.add_argument(
        "--cost-ops", type=float, default=None, metavar="ĉ",
        help="ĉ: arithmetic of one draft run / arithmetic of one target run, ≥ 0, used for the "
        "arithmetic column (default: the same as --cost)",
    )
    p.add_argument(
        "--verify-slope", type=float, default=0.0, metavar="s",
        help="the target's cost of scoring k tokens in one run: T(k)/T(1) = 1 + s·(k − 1), s ≥ 0; "
        "0 is the paper's assumption (default: %(default)s)",
    )
    p.add_argument(
        "--max-gamma", type=int, default=12, metavar="N",
        help=f"tabulate γ = 1..N and pick the best among them, N in [1, "
        f"{theory.MAX_GAMMA_LIMIT}] (default: %(default)s)",
    )
    p.add_argument(
        "--plot", default=None, metavar="FILE.png",
        help="also draw speed-up and arithmetic against γ and write the figure to FILE.png "
        "(default: no figure)",
    )
    p.add_argument(
        "--json", action="store_true",
        help="print the plan as JSON instead of a table (default: a table)",
    )
    p.set_defaults(run=run)


def _closing_line(best: theory.PlanRow) -> str:
    head = f"best γ = {best.gamma}: "
    tail = f", {best.arithmetic:.2f}× the arithmetic"
    if best.speedup > 1.0 + 1e-12:
        return f"{head}{best.speedup:.2f}× faster{tail}"
    return f"{head}{best.speedup:.2f}× the speed (no γ gains unless α > c: Cor. 3.9){tail}"


def run(args: argparse.Namespace) -> int:
    c_hat = args.cost if args.cost_ops is None else args.cost_ops
    slope = args.verify_slope
    if not slope >= 0.0 or slope == float("inf"):
        raise ValueError(f"--verify-slope {slope!r} is invalid: must be a finite number >= 0")
    curve = (lambda k: 1.0 + slope * (k - 1)) if slope else None
    rows = theory.plan(args.alpha, args.cost, c_hat=c_hat, max_gamma=args.max_gamma, target_cost=curve)
    paper = theory.plan(args.alpha, args.cost, c_hat=c_hat, max_gamma=args.max_gamma) if slope else None
    best = next(r for r in rows if r.best)

    if args.plot:
        from ..analysis import plots  # matplotlib is slow to import: only when a figure is asked for

        try:
            plots.plot_plan(rows, args.alpha, args.cost, args.plot, c_hat=c_hat, verify_slope=slope, paper_rows=paper)
        except OSError as err:
            reason = err.strerror or err
            raise ValueError(f"cannot write the plot to {args.plot!r}: {reason}") from err

    if args.json:
        print(strict_json.dumps({
            "alpha": args.alpha, "c": args.cost, "c_hat": c_hat, "verify_slope": slope, "best_gamma": best.gamma,
            "speedup_bound": theory.speedup_bound(args.alpha),
            "rows": [asdict(r) for r in rows], "plot": args.plot,
        }, indent=2))
        return 0

    verify = f", T(k)/T(1) = 1 + {slope:g}·(k − 1)" if slope else ""
    print(f"speculative decoding plan: α = {args.alpha:g}, c = {args.cost:g}, ĉ = {c_hat:g}{verify}")
    print(f"    {'γ':>3}  {'tokens/target run':>17}  {'speed-up':>8}  {'arithmetic':>10}")
    for r in rows:
        mark = "*" if r.best else " "
        print(f"  {mark} {r.gamma:>3}  {r.expected_tokens:>17.2f}  {r.speedup:>7.2f}×  "
              f"{r.arithmetic:>9.2f}×")
    print(_closing_line(best))
    if args.plot:
        print(f"figure written to {args.plot}")
    return 0
