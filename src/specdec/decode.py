"""The decode loops: plain autoregressive decoding, and speculative decoding (spec §2.1).

One speculative round, as data (``speculative_round``)::

    drafter.propose(sequence, γ)         → draft_tokens [γ], draft_probs [γ, V]
    target.score([last] + draft_tokens)  → target_probs [γ + 1, V]   (one parallel call)
    rule.verify(...)                     → Verdict(n_accepted, next_token, kind)
    target.trim(...), drafter.commit(...)   roll back what was rejected

Both models keep every token of the sequence but the last in their caches between rounds; the
last one is scored at the start of the next call. So a target call always scores exactly
γ + 1 tokens and its γ + 1 rows are p_1..p_γ and the bonus row.

A *constraint* (``specdec.constraint``: a grammar, a JSON schema) is one more sampling adjustment: the mask of
what it allows after each prefix of the drafts goes on the draft's logits as it draws and on the target's row
at the same position, before the sampling transform, so p and q are adjusted alike and the rule is exact for
the constrained target distribution. Tokens the constraint allows alone are proposed as drafts with a one-hot
q and no draft call: the whole round's drafts when the constraint forces from the round's start (a *forced*
round), else appended to the drafter's drafts when it forces right after them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .checks import check_int
from .constraint import Constraint, DraftMasks, mask_logits
from .drafters import Drafter, ModelDrafter, Proposal, as_drafter, one_hot_rows
from .gamma import GammaPolicy, as_policy
from .models.base import LanguageModel, check_prompt
from .rule import acceptance_overlap, sample, verify
from .sampling import SamplingParams, probs_from_logits
from .stats import GenerationStats, RoundRecord, Timer, TokenLogprob, summarize

MAX_TOP_LOGPROBS = 20  # alternatives a run may report per emitted token (OpenAI's top_logprobs limit)

# From this prompt length on, a draft model reads the prompt after the first token, which the target draws alone
# (a γ 0 round): the first token then waits only for the target's reading (a 3,000-token prompt: about 3 s sooner).
# A fixed length, never a cache state, decides it: a request's draws do not depend on what was cached.
FIRST_TOKEN_ALONE_FROM = 512

RoundCallback = Callable[[RoundRecord, list], None]  # (record, emitted tokens) after each round


@dataclass(frozen=True)
class Generation:
    tokens: list[int]  # the new token ids: max_new_tokens of them, fewer only after EOS
    stats: GenerationStats


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


def autoregressive_generate(
    model: LanguageModel,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    seed: int | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    on_round: RoundCallback | None = None,
    constraint: Constraint | None = None,
    logprobs: int | None = None,
) -> Generation:
    """Plain decoding: one target call per token (under ``constraint``, if given: its mask on each row; with
    ``logprobs`` = k, each token's log-probability and the k most likely tokens in its round records)."""
    run = PlainRun(model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                   eos_token_id=eos_token_id, on_round=on_round, constraint=constraint, logprobs=logprobs)
    run.start()
    while not run.done:
        run.step()
    return run.result()


class DecodeRun:
    """What a plain and a speculative generation share, advanced a step at a time: the sequence (prompt, then
    new tokens), the stop tokens, the seeded generator, the timer and round records; ``start()`` reads the
    prompt, ``step()`` (in the subclass) adds one round's tokens, ``done`` says when to stop. A plain run drafts
    nothing: no drafter, no γ policy."""

    drafter: Drafter | None = None
    policy: GammaPolicy | None = None
    first_token_alone = False  # the first token drawn by the target alone, before the draft reads the prompt
    draft_begun = False
    last_gamma = 0  # the γ the last round drafted at most

    def __init__(self, target: LanguageModel, prompt: Sequence[int], *, max_new_tokens: int,
                 sampling: SamplingParams, seed: int | None, eos_token_id: int | Iterable[int] | None,
                 on_round: RoundCallback | None, constraint: Constraint | None = None,
                 logprobs: int | None = None) -> None:
        if logprobs is not None:
            check_int("logprobs", logprobs, 0, MAX_TOP_LOGPROBS, note=" (alternatives per token)")
        self.logprobs = logprobs
        if constraint is not None and constraint.vocab_size != target.vocab_size:
            raise ValueError(f"the constraint's vocabulary has {constraint.vocab_size} tokens, the target's "
                             f"{target.vocab_size}: they must be equal")
        self.target, self.sampling, self.on_round, self.constraint = target, sampling, on_round, constraint
        self.sequence = check_prompt(target, prompt, max_new_tokens, "target")
        self.max_new_tokens, self.stop = max_new_tokens, _eos_set(eos_token_id)
        self.generator = make_generator(seed, target.device)
        self.timer, self.records = Timer(), []
        self.prompt_length, self.draft_calls = len(self.sequence), 0
        self.started = self.done = False

    @property
    def new_tokens(self) -> list[int]:
        return self.sequence[self.prompt_length :]

    @property
    def ended_by_eos(self) -> bool:
        return bool(self.new_tokens) and self.new_tokens[-1] in self.stop

    @property
    def last_record(self) -> RoundRecord | None:
        return self.records[-1] if self.records else None

    def start(self) -> None:
        t0 = time.perf_counter()
        self.timer.prompt_reused = self.target.prefill(self.sequence[:-1])
        self.begin_draft()
        self.timer.prefill = time.perf_counter() - t0
        self.timer.total += self.timer.prefill
        self.started = True

    def begin_draft(self) -> None:
        """Read the prompt into whatever drafts (nothing for plain decoding)."""

    def next_gamma(self) -> int:
        """The γ of the next round, at most (plain decoding: 0). A server fixes it before its step."""
        return 0

    def keep(self, record: RoundRecord) -> list[int]:
        """Append a round's tokens, cut at EOS and the budget (``done`` then says so); the tokens kept."""
        before = len(self.sequence)
        self.done = _extend(self.sequence, list(record.tokens), self.prompt_length, self.max_new_tokens, self.stop,
                            self.records, record, self.on_round)
        return self.sequence[before:]

    def stats(self) -> GenerationStats:
        return summarize(self.records, len(self.new_tokens), self.draft_calls, self.timer)

    def result(self) -> Generation:
        return Generation(self.new_tokens, self.stats())


class PlainRun(DecodeRun):
    """One plain decoding, advanced a token at a time: each ``step()`` scores the last token and draws the
    next (``autoregressive_generate`` is this loop run to the end; a server interleaves the steps of several
    runs). Every check happens in ``__init__``."""

    def __init__(self, model: LanguageModel, prompt: Sequence[int], *, max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), seed: int | None = None,
                 eos_token_id: int | Iterable[int] | None = None, on_round: RoundCallback | None = None,
                 constraint: Constraint | None = None, logprobs: int | None = None) -> None:
        super().__init__(model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                         eos_token_id=eos_token_id, on_round=on_round, constraint=constraint, logprobs=logprobs)

    def step(self) -> list[int]:
        t0 = time.perf_counter()
        raw = self.target.score(self.sequence[-1:])  # [1, vocab]
        self.timer.target += time.perf_counter() - t0
        logits = raw[0] if self.constraint is None else mask_logits(raw[0], self.constraint.allowed())
        probs = probs_from_logits(logits, self.sampling)  # [vocab]
        token = int(probs.argmax()) if self.sampling.greedy else sample(probs, self.generator)
        if self.constraint is not None:
            self.constraint.consume([token])
        kept = self.keep(RoundRecord(drafted=(), n_accepted=0, next_token=token, kind="bonus",
                                     logprobs=token_logprobs(raw, [token], self.logprobs)))
        self.timer.total += time.perf_counter() - t0
        return kept


def speculative_generate(
    target: LanguageModel,
    draft: LanguageModel | Drafter,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    gamma: int | GammaPolicy,
    sampling: SamplingParams = SamplingParams(),
    seed: int | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    on_round: RoundCallback | None = None,
    constraint: Constraint | None = None,
    logprobs: int | None = None,
) -> Generation:
    """Speculative decoding: each round drafts γ tokens and verifies them in one target call.

    The output has exactly the distribution of ``autoregressive_generate(target, ...)`` with the
    same sampling settings (and the same ``constraint``, a fresh one of the same grammar); greedy output is
    identical token for token. ``gamma`` is a fixed γ or a ``GammaPolicy`` that chooses each round's γ from the
    rounds before it.
    """
    run = SpeculativeRun(target, draft, prompt, max_new_tokens=max_new_tokens, gamma=gamma, sampling=sampling,
                         seed=seed, eos_token_id=eos_token_id, on_round=on_round, constraint=constraint,
                         logprobs=logprobs)
    run.start()
    while not run.done:
        run.step()
    return run.result()


class SpeculativeRun(DecodeRun):
    """One speculative generation, advanced a round at a time: ``start()`` reads the prompt into
    both caches, each ``step()`` is one round and returns the tokens it kept (cut at EOS and the
    budget), ``done`` says when to stop. ``speculative_generate`` is this loop run to the end; a
    server interleaves the steps of several runs. Every check happens in ``__init__``, before a model
    is touched."""

    def __init__(self, target: LanguageModel, draft: LanguageModel | Drafter, prompt: Sequence[int], *,
                 max_new_tokens: int, gamma: int | GammaPolicy, sampling: SamplingParams = SamplingParams(),
                 seed: int | None = None, eos_token_id: int | Iterable[int] | None = None,
                 on_round: RoundCallback | None = None, first_token_alone_from: int = FIRST_TOKEN_ALONE_FROM,
                 constraint: Constraint | None = None, logprobs: int | None = None) -> None:
        self.drafter, self.policy = as_drafter(draft), as_policy(gamma)
        if self.drafter.vocab_size != target.vocab_size:
            raise ValueError(
                f"target and draft vocabularies differ: target has {target.vocab_size} tokens, draft "
                f"{self.drafter.vocab_size}; they must be equal (the same tokenizer)"
            )
        super().__init__(target, prompt, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                         eos_token_id=eos_token_id, on_round=on_round, constraint=constraint, logprobs=logprobs)
        if isinstance(self.drafter, ModelDrafter):
            check_prompt(self.drafter.model, self.sequence, max_new_tokens, "draft")
        self.first_token_alone = len(self.sequence) >= first_token_alone_from and self.drafter.reads_prompt
        self.draft_begun = False
        self._gamma: int | None = None  # the next round's γ, once chosen

    def begin_draft(self) -> None:
        if not self.first_token_alone:
            self.begin_draft_now()

    def begin_draft_now(self) -> None:
        self.drafter.begin(self.sequence)
        self.draft_begun = True

    def next_gamma(self) -> int:
        """The next round's γ, chosen once (by the policy, from finished rounds only; 0 while the target draws
        a long prompt's first token alone). A round yields up to γ + 1 tokens: near the budget, draft only what
        can be kept."""
        if self._gamma is None:
            drafting = self.draft_begun or bool(self.records)
            remaining = self.max_new_tokens - len(self.new_tokens)
            self._gamma = min(self.policy.choose(), remaining - 1) if drafting else 0
        return self._gamma

    def step(self) -> list[int]:
        t0 = time.perf_counter()
        gamma_now, self._gamma = self.next_gamma(), None
        self.last_gamma = gamma_now
        if not self.draft_begun and self.records:  # the first token is out: the draft reads now
            self.begin_draft_now()
            self.timer.prefill += time.perf_counter() - t0
        draft_before, target_before = self.timer.draft, self.timer.target
        room = self.max_new_tokens - len(self.new_tokens) - 1  # drafts a round can still keep
        record = speculative_round(self.target, self.drafter, self.sequence, gamma_now, self.sampling,
                                   self.generator, self.timer, self.constraint, room, self.logprobs)
        if self.draft_begun and not record.wholly_forced:  # a forced round says nothing of the drafter
            self.policy.observe(record, self.timer.draft - draft_before, self.timer.target - target_before)
        self.draft_calls += record.draft_calls
        kept = self.keep(record)
        if self.draft_begun:
            self.drafter.commit(len(self.sequence))
        self.timer.total += time.perf_counter() - t0
        return kept


def speculative_round(
    target: LanguageModel,
    drafter: Drafter,
    sequence: list[int],
    gamma: int,
    sampling: SamplingParams,
    generator: torch.Generator,
    timer: Timer,
    constraint: Constraint | None = None,
    room: int | None = None,
    logprobs: int | None = None,
) -> RoundRecord:
    """Draft γ tokens, score them in one target call, apply the rule, roll the target back. Under a
    ``constraint``, the tokens it forces (at most ``room``, the drafts the budget can keep) are the round's
    drafts instead, the tokens it forces right after the drafter's drafts are appended to them (one-hot q, no
    call: a JSON key after a drafted value), and every position's p and q are masked alike (the module's
    text). With ``logprobs`` = k, the record holds each emitted token's log-probability from the verification
    rows (``token_logprobs``)."""
    t0 = time.perf_counter()
    masks = DraftMasks(constraint) if constraint is not None else None
    forced = constraint.forced()[: max(room or 0, 0)] if constraint is not None else []
    if forced:
        proposal = Proposal(forced, one_hot_rows(forced, target.vocab_size, target.device), calls=0)
    elif gamma > 0:
        proposal = (drafter.propose(sequence, gamma, sampling, generator) if masks is None
                    else drafter.propose(sequence, gamma, sampling, generator, allowed=masks.after))
        if masks is not None and proposal.tokens:  # what the grammar forces after the drafts: more free drafts
            tail = masks.forced_after(proposal.tokens, (room or 0) - len(proposal.tokens))
            if tail:
                forced = tail
                rows = one_hot_rows(tail, target.vocab_size, proposal.probs.device).to(proposal.probs.dtype)
                proposal = Proposal(proposal.tokens + tail, torch.cat([proposal.probs, rows]), proposal.calls)
    else:
        proposal = _no_proposal(target)
    t1 = time.perf_counter()
    n_drafted = len(proposal.tokens)
    logits = target.score(sequence[target.length :] + proposal.tokens)[-(n_drafted + 1) :]  # [γ + 1, vocab]
    t2 = time.perf_counter()
    timer.draft += t1 - t0
    timer.target += t2 - t1
    raw = logits
    if masks is not None:  # the mask after each prefix of the drafts, on the row that follows it
        logits = mask_logits(logits, torch.stack([masks.after(proposal.tokens[:i]) for i in range(n_drafted + 1)]))
    target_probs = probs_from_logits(logits, sampling)  # [γ + 1, vocab]
    draft_tokens = torch.tensor(proposal.tokens, dtype=torch.long, device=target_probs.device)
    draft_probs = proposal.probs
    if draft_probs.device != target_probs.device or draft_probs.dtype != target_probs.dtype:
        draft_probs = draft_probs.to(device=target_probs.device, dtype=target_probs.dtype)
    verdict = verify(draft_tokens, draft_probs, target_probs, generator)
    # β on the output path: the accepted positions and the first rejected one.
    # β on the drafter's own positions only (forced drafts are one-hot on both sides: they say nothing of it)
    on_path = min(verdict.n_accepted + 1, n_drafted - len(forced))
    betas = acceptance_overlap(target_probs[:on_path], draft_probs[:on_path]).tolist() if on_path else []
    target.trim(len(sequence) + verdict.n_accepted)
    emitted = proposal.tokens[: verdict.n_accepted] + [verdict.next_token]
    record = RoundRecord(tuple(proposal.tokens), verdict.n_accepted, verdict.next_token, verdict.kind, tuple(betas),
                         proposal.calls, forced=len(forced), logprobs=token_logprobs(raw, emitted, logprobs))
    if masks is not None:
        masks.settle(record.tokens)
    return record


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int | None) -> tuple[TokenLogprob, ...]:
    """Each of ``tokens`` (the one after row i is ``tokens[i]``) with its log-probability under the raw target
    row (``logits`` [≥ len(tokens), vocab], before sampling adjustments and masks) and the ``top`` most likely
    tokens; () when ``top`` is None. Each row is its own log-softmax, so a token's figures are bit for bit the
    same whether its row was scored alone (plain decoding) or in a block (verification) on the native backend."""
    if top is None:
        return ()
    out = []
    for i, token in enumerate(tokens):
        row = torch.log_softmax(logits[i].double(), dim=-1)  # [vocab]
        best = torch.topk(row, min(top, row.numel())) if top else None
        alternatives = tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best is not None else ()
        out.append(TokenLogprob(int(token), float(row[token]), alternatives))
    return tuple(out)


def _no_proposal(target: LanguageModel) -> Proposal:
    return Proposal([], torch.empty(0, target.vocab_size, device=target.device), calls=0)


def _eos_set(eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(t) for t in eos_token_id)


def _extend(sequence, tokens, prompt_length, max_new_tokens, stop, records, record, on_round) -> bool:
    """Append a round's tokens, cut at EOS or the budget; True when generation is finished."""
    room = max_new_tokens - (len(sequence) - prompt_length)
    kept = tokens[:room]
    eos_at = next((i for i, t in enumerate(kept) if t in stop), None)
    if eos_at is not None:
        kept = kept[: eos_at + 1]
    sequence.extend(kept)
    records.append(record)
    if on_round is not None:
        on_round(record, kept)
    return eos_at is not None or len(kept) == room
