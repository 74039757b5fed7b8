"""What a benchmark run measured, as typed data, and the figures of the table made from it.

``RunRecord``: one measured run (its tokens and ``RunFigures``). ``Row``: one line of the table,
a mode on a backend over one prompt category's runs at one temperature: tokens/s median and
min–max over the runs (prompts × repeats), speed-up = ratio of the medians of the mode and of
``plain`` on the same backend, α and tokens per target call pooled over the runs (ratios of sums),
mean γ = drafted tokens per round, and for greedy runs whether every output equals plain decoding
of the same prompt on the same backend, token for token.

Where a mode times its parts (ours), a row also holds the speed-up of the decoding alone (prompt
reading left out on both sides) and what the paper predicts for it from the figures measured in
the same runs: Thm 3.8 with α (pooled β), γ (mean drafted per round, rounded) and c = seconds per
drafted token / T(1), T(1) being plain decoding's seconds per target call; then the same with the
measured cost of a verification call, T(γ + 1) / T(1), in place of the paper's assumption 1.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .. import theory
from ..machine import cpu_flags, cpu_model
from ..stats import RoundTotals
from .figures import RunFigures
from .modes import parse_mode

CATEGORIES = ("code-writing", "code-editing", "explanation")  # the packaged prompt set's, in table order


@dataclass(frozen=True)
class RunRecord:
    """One measured run: its place in the plan, its tokens and what it measured."""

    temperature: float
    repeat: int
    category: str
    prompt_id: str
    mode: str
    backend: str
    seed: int
    prompt_tokens: int
    tokens: tuple[int, ...]
    figures: RunFigures
    same_as_plain: bool | None = None  # greedy only: equal, token for token, to plain decoding

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.figures.seconds if self.figures.seconds > 0 else 0.0


@dataclass(frozen=True)
class Row:
    """One line of the table: a mode on a backend, over one category's runs at one temperature."""

    temperature: float
    category: str
    mode: str
    backend: str
    runs: int
    median_tps: float
    min_tps: float
    max_tps: float
    speedup: float | None  # median tokens/s over plain's median (same backend, category, temperature)
    alpha: float | None
    tokens_per_target_call: float | None
    mean_gamma: float | None  # drafted tokens per round
    same_as_plain: bool | None  # greedy: every run equal to plain; None when sampled
    differing_runs: int = 0
    decode_speedup: float | None = None  # the same ratio with prompt reading left out (seconds per token)
    predicted_paper: float | None = None  # Thm 3.8 from this row's α, γ, c
    predicted_cost_curve: float | None = None  # Thm 3.8 with the measured T(γ + 1) / T(1)


def compare_to_plain(records: Sequence[RunRecord]) -> list[RunRecord]:
    """Set ``same_as_plain`` on greedy runs: equal to plain's tokens for the same prompt, repeat and backend."""
    plain = {(r.backend, r.prompt_id, r.repeat): r.tokens for r in records if r.mode == "plain" and r.temperature == 0}
    out = []
    for r in records:
        reference = plain.get((r.backend, r.prompt_id, r.repeat)) if r.temperature == 0 else None
        out.append(replace(r, same_as_plain=None if reference is None else r.tokens == reference))
    return out


# -------------------------------------------------------------------------------- aggregation


def summarize_runs(records: Sequence[RunRecord], mode_order: Sequence[str] = ()) -> list[Row]:
    """One Row per (temperature, category, mode, backend): by temperature, category, backend, then
    plain first and the other modes in ``mode_order`` (unlisted ones last, by name)."""
    groups: dict[tuple, list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.temperature, r.category, r.mode, r.backend), []).append(r)
    plain_runs = {k: rs for k, rs in groups.items() if k[2] == "plain"}
    plain_median = {k: statistics.median(x.tokens_per_second for x in rs) for k, rs in plain_runs.items()}
    rows = []
    rank = {m: i for i, m in enumerate(dict.fromkeys(["plain", *mode_order]))}
    backends = list(dict.fromkeys(r.backend for r in records))

    def order(key: tuple) -> tuple:
        temperature, category, mode, backend = key
        category_rank = CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)
        return temperature, category_rank, category, backends.index(backend), rank.get(mode, len(rank)), mode

    for (temperature, category, mode, backend), rs in sorted(groups.items(), key=lambda kv: order(kv[0])):
        tps = [r.tokens_per_second for r in rs]
        median = statistics.median(tps)
        base = plain_median.get((temperature, category, "plain", backend))
        checked = [r.same_as_plain for r in rs if r.same_as_plain is not None]
        pooled = pool_runs(rs)
        row = Row(
            temperature, category, mode, backend, len(rs), median, min(tps), max(tps),
            speedup=median / base if base else None,
            alpha=pooled.alpha,
            tokens_per_target_call=pooled.tokens_per_target_call,
            mean_gamma=pooled.mean_gamma,
            same_as_plain=all(checked) if checked else None,
            differing_runs=checked.count(False),
        )
        rows.append(with_predictions(row, rs, plain_runs.get((temperature, category, "plain", backend), [])))
    return rows


def decode_seconds_per_token(records: Sequence[RunRecord]) -> float | None:
    """Seconds per new token with prompt reading left out; None when a run cannot tell its prefill."""
    if not records or any(r.figures.prefill_seconds is None for r in records):
        return None
    return ratio_of_sums([r.figures.seconds - r.figures.prefill_seconds for r in records],
                         [len(r.tokens) for r in records])


def with_predictions(row: Row, records: Sequence[RunRecord], plain: Sequence[RunRecord]) -> Row:
    """``row`` with its decoding-only speed-up and Thm 3.8's predictions (module docstring)."""
    base, mine = decode_seconds_per_token(plain), decode_seconds_per_token(records)
    if base is None or mine is None or not mine:
        return row
    row = replace(row, decode_speedup=base / mine)
    f = [r.figures for r in records]
    t1 = ratio_of_sums([r.figures.target_seconds or 0.0 for r in plain], [r.figures.target_calls for r in plain])
    d = ratio_of_sums([x.draft_seconds or 0.0 for x in f], [x.drafted for x in f])
    verify = ratio_of_sums([x.target_seconds or 0.0 for x in f], [x.target_calls for x in f])
    if row.alpha is None or row.mean_gamma is None or not t1 or d is None or not verify:
        return row
    alpha, gamma, c = min(row.alpha, 1.0 - 1e-9), max(1, round(row.mean_gamma)), d / t1
    return replace(row, predicted_paper=theory.expected_speedup(alpha, gamma, c),
                   predicted_cost_curve=theory.expected_tokens(alpha, gamma) / (gamma * c + verify / t1))


def ratio_of_sums(numerators: Sequence[float], denominators: Sequence[float | None]) -> float | None:
    """Σ numerators / Σ denominators; None if any denominator is unknown or they sum to 0."""
    if any(d is None for d in denominators) or not sum(denominators):
        return None
    return sum(numerators) / sum(denominators)


def pool_runs(records: Sequence[RunRecord]) -> RoundTotals:
    """The runs' figures pooled (``stats.RoundTotals``): α over all their verified positions (each
    run's α weighted by its positions), tokens per target call (unknown unless every run counted
    its calls) and drafted tokens per round."""
    return RoundTotals.pool(
        RoundTotals(rounds=r.figures.rounds, drafted=r.figures.drafted, accepted=r.figures.accepted,
                    new_tokens=len(r.tokens), target_calls=r.figures.target_calls,
                    beta_sum=r.figures.alpha * r.figures.verified if r.figures.alpha is not None else 0.0,
                    verified=r.figures.verified if r.figures.alpha is not None else 0)
        for r in records
    )


def best_rows(rows: Sequence[Row]) -> list[Row]:
    """The drafting mode with the largest speed-up per (temperature, category, backend).

    Per backend, since each backend's speed-ups are over its own plain decoding; the plain
    baselines (plain, hf-plain, llamacpp-own-plain) are not candidates."""
    best: dict[tuple, Row] = {}
    for row in rows:
        key = (row.temperature, row.category, row.backend)
        candidate = parse_mode(row.mode).drafts and row.speedup is not None
        if candidate and (key not in best or row.speedup > best[key].speedup):
            best[key] = row
    return list(best.values())


def fastest_rows(rows: Sequence[Row]) -> list[Row]:
    """The row with the highest median tokens/s per (temperature, category), over every backend."""
    fastest: dict[tuple, Row] = {}
    for row in rows:
        key = (row.temperature, row.category)
        if key not in fastest or row.median_tps > fastest[key].median_tps:
            fastest[key] = row
    return list(fastest.values())


@dataclass(frozen=True)
class GammaComparison:
    """Adaptive γ against the best fixed γ found in hindsight, for one drafter in one table group."""

    temperature: float
    category: str
    backend: str
    drafter: str
    best_fixed: Row
    adaptive: tuple[Row, ...]  # the auto / heuristic rows of the same drafter


def compare_gammas(rows: Sequence[Row]) -> list[GammaComparison]:
    """For every drafter run with at least one fixed γ and one γ policy in the same group."""
    groups: dict[tuple, list[tuple[object, Row]]] = {}
    for row in rows:
        spec = parse_mode(row.mode)
        if spec.kind == "ours" and row.speedup is not None:
            key = (row.temperature, row.category, row.backend, spec.drafter)
            groups.setdefault(key, []).append((spec.gamma, row))
    out = []
    for (temperature, category, backend, drafter), members in groups.items():
        fixed = [row for g, row in members if g.isdigit()]
        adaptive = tuple(row for g, row in members if not g.isdigit())
        if fixed and adaptive:
            best = max(fixed, key=lambda r: r.speedup)
            out.append(GammaComparison(temperature, category, backend, drafter, best, adaptive))
    return out


def slower_than_plain(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.mode != "plain" and r.speedup is not None and r.speedup < 1.0]


# ------------------------------------------------------------------------------------ machine


def machine_info() -> dict:
    """The machine and library versions, recorded with every result."""
    versions = {}
    for package in ("torch", "transformers", "llama_cpp_python", "specdec"):
        try:
            versions[package] = importlib.metadata.version(package.replace("_python", "-python"))
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    import torch

    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
