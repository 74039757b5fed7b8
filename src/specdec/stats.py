"""What a generation measured, as typed data: per-round records and run totals.

Vocabulary as in ``specdec.rule``: drafted, accepted, recovered, bonus. β = Σ min(p, q) at one
verified position; α = mean β (spec §3.2); a *round* is one target call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's raw distribution (the log-softmax of its logits,
    before the sampling adjustments and any constraint's mask), and the ``top`` most likely tokens there."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


@dataclass(frozen=True)
class RoundRecord:
    """One round: what the draft proposed and what the target made of it."""

    drafted: tuple[int, ...]  # the γ drafted tokens (empty for a plain decoding step)
    n_accepted: int  # accepted prefix length
    next_token: int  # the target's own token this round
    kind: str  # "recovered" | "bonus"
    betas: tuple[float, ...] = ()  # β at each verified position on the output path
    draft_calls: int = 0  # model calls the drafter spent this round
    forced: int = 0  # drafts the constraint forced (one-hot, no draft call): the last ones (all, in a forced round)
    logprobs: tuple[TokenLogprob, ...] = ()  # of each emitted token, when the run was asked for them

    @property
    def wholly_forced(self) -> bool:
        """Every draft of this round was forced (no drafter was asked)."""
        return self.forced > 0 and self.forced == len(self.drafted)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens this round emitted (before any truncation at EOS or the token budget)."""
        return self.drafted[: self.n_accepted] + (self.next_token,)


@dataclass(frozen=True)
class RoundTotals:
    """Counts over rounds, of one run or pooled over several: the one place α, tokens per target
    call, mean γ and the acceptance rate are computed from (``RoundTotals.of`` reads round records,
    ``RoundTotals.pool`` adds totals up, so pooled α weights each run by its verified positions)."""

    rounds: int = 0  # rounds (target calls) that drafted or decoded
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    beta_sum: float = 0.0  # Σ β over the verified positions
    verified: int = 0  # positions with a β
    target_calls: int | None = 0  # None when some pooled run could not count them

    @classmethod
    def of(cls, records: Iterable[RoundRecord], new_tokens: int | None = None) -> RoundTotals:
        """Totals of round records; ``new_tokens``: the tokens kept (default: all the rounds emitted)."""
        records = list(records)
        betas = [b for r in records for b in r.betas]
        return cls(
            rounds=len(records),
            drafted=sum(len(r.drafted) for r in records),
            accepted=sum(r.n_accepted for r in records),
            new_tokens=sum(len(r.tokens) for r in records) if new_tokens is None else new_tokens,
            beta_sum=sum(betas),
            verified=len(betas),
            target_calls=len(records),
        )

    @classmethod
    def pool(cls, totals: Iterable[RoundTotals]) -> RoundTotals:
        totals = list(totals)
        calls = [t.target_calls for t in totals]
        return cls(
            rounds=sum(t.rounds for t in totals),
            drafted=sum(t.drafted for t in totals),
            accepted=sum(t.accepted for t in totals),
            new_tokens=sum(t.new_tokens for t in totals),
            beta_sum=sum(t.beta_sum for t in totals),
            verified=sum(t.verified for t in totals),
            target_calls=None if any(c is None for c in calls) else sum(calls),
        )

    @property
    def alpha(self) -> float | None:
        """Mean β over the verified positions; None when nothing was verified."""
        return self.beta_sum / self.verified if self.verified else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafts over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_target_call(self) -> float | None:
        return self.new_tokens / self.target_calls if self.target_calls else None

    @property
    def mean_gamma(self) -> float | None:
        """Drafted tokens per round."""
        return self.drafted / self.rounds if self.rounds else None


@dataclass
class Timer:
    """Seconds spent in each part of a decode loop."""

    draft: float = 0.0
    target: float = 0.0
    prefill: float = 0.0  # reading the prompt into both caches, before the first round
    total: float = 0.0
    prompt_reused: int = 0  # prompt tokens the target took from the prefix cache instead of reading them


@dataclass(frozen=True)
class GenerationStats:
    rounds: int
    target_calls: int
    draft_calls: int
    drafted: int
    accepted: int
    new_tokens: int
    draft_seconds: float
    target_seconds: float
    prefill_seconds: float
    total_seconds: float
    alpha: float | None  # mean β over verified positions; None when nothing was drafted
    records: tuple[RoundRecord, ...] = field(default=(), repr=False)
    prompt_reused: int = 0  # prompt tokens the target took from the prefix cache (``models.prefix``)
    forced: int = 0  # drafts a constraint forced (one-hot, no draft call; counted in drafted and accepted too)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafts over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_target_call(self) -> float | None:
        """New tokens per target call; None when there was no target call (as ``RoundTotals``)."""
        return self.new_tokens / self.target_calls if self.target_calls else None

    @property
    def loop_seconds(self) -> float:
        """Time in our own loop: sampling transforms, the rule, bookkeeping, callbacks."""
        return max(0.0, self.total_seconds - self.draft_seconds - self.target_seconds - self.prefill_seconds)

    @property
    def tokens_per_second(self) -> float | None:
        """None when no time was measured."""
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else None

    @property
    def mean_draft_call_seconds(self) -> float | None:
        return self.draft_seconds / self.draft_calls if self.draft_calls else None

    @property
    def mean_target_call_seconds(self) -> float | None:
        return self.target_seconds / self.target_calls if self.target_calls else None

    @property
    def gammas(self) -> tuple[int, ...]:
        """γ drafted in each round (a policy's choice, fewer near the budget or when a drafter
        stops early; 0 for a plain decoding step)."""
        return tuple(len(r.drafted) for r in self.records)

    @property
    def mean_gamma(self) -> float | None:
        return sum(self.gammas) / len(self.gammas) if self.records else None

    @property
    def gamma_histogram(self) -> dict[int, int]:
        """γ drafted → number of rounds that drafted it, in increasing γ."""
        counts: dict[int, int] = {}
        for g in self.gammas:
            counts[g] = counts.get(g, 0) + 1
        return dict(sorted(counts.items()))

    @staticmethod
    def pool(stats: Sequence[GenerationStats]) -> RoundTotals:
        """The round records of several generations pooled (α over all their verified positions)."""
        return RoundTotals.of((r for s in stats for r in s.records), sum(s.new_tokens for s in stats))

    def figures(self, *, drafting: bool = True) -> dict:
        """The figures every serializer of a generation shares (``RunResult.as_json``, the server's
        ``specdec`` field, the explorer's live view), plain JSON numbers, records left out: None
        where nothing was measured (α and the acceptance rate without drafts, tokens per target call
        without a target call, tokens/s without time). ``drafting=False``: a plain run (the target
        alone), whose mean γ is None and γ histogram empty, where a speculative run that drafted
        nothing has mean γ 0."""
        return {
            "new_tokens": self.new_tokens,
            "seconds": self.total_seconds,
            "tokens_per_second": self.tokens_per_second,
            "rounds": self.rounds,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "tokens_per_target_call": self.tokens_per_target_call,
            "mean_gamma": self.mean_gamma if drafting else None,
            "gamma_histogram": {str(g): n for g, n in self.gamma_histogram.items()} if drafting else {},
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "loop_seconds": self.loop_seconds,
            "prompt_tokens_reused": self.prompt_reused,
            "forced": self.forced,
        }


def summarize(records: list[RoundRecord], new_tokens: int, draft_calls: int, timer: Timer) -> GenerationStats:
    totals = RoundTotals.of(records, new_tokens)
    return GenerationStats(
        rounds=totals.rounds,
        target_calls=totals.rounds,
        draft_calls=draft_calls,
        drafted=totals.drafted,
        accepted=totals.accepted,
        new_tokens=new_tokens,
        draft_seconds=timer.draft,
        target_seconds=timer.target,
        prefill_seconds=timer.prefill,
        total_seconds=timer.total,
        alpha=totals.alpha,
        records=tuple(records),
        prompt_reused=timer.prompt_reused,
        forced=sum(r.forced for r in records),
    )
