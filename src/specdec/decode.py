"""The decode loops: plain autoregressive decoding, and speculative decoding (spec §2.1).

One speculative round, as data (``speculative_round``)::

    drafter.propose(sequence, γ)         → draft_tokens [γ], draft_probs [γ, V]
    target.score([last] + draft_tokens)  → target_probs [γ + 1, V]   (one parallel call)
    rule.verify(...)                     → Verdict(n_accepted, next_token, kind)
    target.trim(...), drafter.commit(...)   roll back what was rejected

Both models keep every token of the sequence but the last in their caches between rounds; the
last one is scored at the start of the next call. So a target call always scores exactly
γ + 1 tokens and its γ + 1 rows are p_1..p_γ and the bonus row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .drafters import Draft, Drafter, ModelDrafter, as_drafter
from .gamma import GammaPolicy, as_policy
from .models.base import LanguageModel, check_prompt
from .rule import acceptance_overlap, sample, verify
from .sampling import SamplingParams, probs_from_logits
from .stats import GenerationStats, RoundRecord, Timer, summarize

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
) -> Generation:
    """Plain decoding: one target call per token."""
    sequence = check_prompt(model, prompt, max_new_tokens, "target")
    stop = _eos_set(eos_token_id)
    generator = make_generator(seed, model.device)
    timer, records, start = Timer(), [], time.perf_counter()
    prompt_length = len(sequence)
    model.prefill(sequence[:-1])
    timer.prefill = time.perf_counter() - start
    while len(sequence) - prompt_length < max_new_tokens:
        t0 = time.perf_counter()
        logits = model.score(sequence[-1:])  # [1, vocab]
        timer.target += time.perf_counter() - t0
        probs = probs_from_logits(logits[0], sampling)  # [vocab]
        token = int(probs.argmax()) if sampling.greedy else sample(probs, generator)
        record = RoundRecord(drafted=(), n_accepted=0, next_token=token, kind="bonus")
        if _extend(sequence, [token], prompt_length, max_new_tokens, stop, records, record, on_round):
            break
    timer.total = time.perf_counter() - start
    new = sequence[prompt_length:]
    return Generation(new, summarize(records, len(new), 0, timer))


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
) -> Generation:
    """Speculative decoding: each round drafts γ tokens and verifies them in one target call.

    The output has exactly the distribution of ``autoregressive_generate(target, ...)`` with the
    same sampling settings; greedy output is identical token for token. ``gamma`` is a fixed γ or
    a ``GammaPolicy`` that chooses each round's γ from the rounds before it.
    """
    policy = as_policy(gamma)
    drafter = as_drafter(draft)
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"target and draft vocabularies differ: target has {target.vocab_size} tokens, draft "
            f"{drafter.vocab_size}; they must be equal (the same tokenizer)"
        )
    sequence = check_prompt(target, prompt, max_new_tokens, "target")
    if isinstance(drafter, ModelDrafter):
        check_prompt(drafter.model, sequence, max_new_tokens, "draft")
    stop = _eos_set(eos_token_id)
    generator = make_generator(seed, target.device)
    timer, records, start = Timer(), [], time.perf_counter()
    prompt_length, draft_calls = len(sequence), 0
    target.prefill(sequence[:-1])
    drafter.begin(sequence)
    timer.prefill = time.perf_counter() - start
    while (remaining := max_new_tokens - (len(sequence) - prompt_length)) > 0:
        # A round yields up to γ + 1 tokens; near the budget, draft only what can be kept.
        draft_before, target_before = timer.draft, timer.target
        gamma_now = min(policy.choose(), remaining - 1)
        record = speculative_round(target, drafter, sequence, gamma_now, sampling, generator, timer)
        policy.observe(record, timer.draft - draft_before, timer.target - target_before)
        draft_calls += record.draft_calls
        done = _extend(sequence, list(record.tokens), prompt_length, max_new_tokens, stop, records, record, on_round)
        drafter.commit(len(sequence))
        if done:
            break
    timer.total = time.perf_counter() - start
    new = sequence[prompt_length:]
    return Generation(new, summarize(records, len(new), draft_calls, timer))


def speculative_round(
    target: LanguageModel,
    drafter: Drafter,
    sequence: list[int],
    gamma: int,
    sampling: SamplingParams,
    generator: torch.Generator,
    timer: Timer,
) -> RoundRecord:
    """Draft γ tokens, score them in one target call, apply the rule, roll the target back."""
    t0 = time.perf_counter()
    draft = drafter.propose(sequence, gamma, sampling, generator) if gamma > 0 else _no_draft(target)
    t1 = time.perf_counter()
    n_drafted = len(draft.tokens)
    logits = target.score(sequence[target.length :] + draft.tokens)[-(n_drafted + 1) :]  # [γ + 1, vocab]
    t2 = time.perf_counter()
    timer.draft += t1 - t0
    timer.target += t2 - t1
    target_probs = probs_from_logits(logits, sampling)  # [γ + 1, vocab]
    draft_tokens = torch.tensor(draft.tokens, dtype=torch.long, device=target_probs.device)
    draft_probs = draft.probs
    if draft_probs.device != target_probs.device or draft_probs.dtype != target_probs.dtype:
        draft_probs = draft_probs.to(device=target_probs.device, dtype=target_probs.dtype)
    verdict = verify(draft_tokens, draft_probs, target_probs, generator)
    # β on the output path: the accepted positions and the first rejected one.
    on_path = min(verdict.n_accepted + 1, n_drafted)
    betas = acceptance_overlap(target_probs[:on_path], draft_probs[:on_path]).tolist() if on_path else []
    target.trim(len(sequence) + verdict.n_accepted)
    return RoundRecord(tuple(draft.tokens), verdict.n_accepted, verdict.next_token, verdict.kind, tuple(betas),
                       draft.calls)


def _no_draft(target: LanguageModel) -> Draft:
    return Draft([], torch.empty(0, target.vocab_size, device=target.device), calls=0)


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
