"""One request's generation, advanced one round at a time, so that several requests can take turns.

Terms:

- a *sequence run* (:class:`SequenceRun`) is one request's speculative generation: its token ids,
  drafter, γ policy, seeded generator and round records. ``start()`` reads the prompt into the
  models' caches; each ``step()`` is one round (draft γ, one target call, verify, roll back) and
  returns the tokens it kept. It is ``decode.SpeculativeRun``, the loop ``speculative_generate``
  itself runs, so a greedy run gives the same tokens as ``session.generate``, and a seeded one the same
  draws (with a fixed γ).
- a *plain run* (:class:`PlainRun`) is the same request decoded with the target alone, one token a
  step: ``decode.autoregressive_generate``'s loop, so its greedy output is that function's token for
  token (and a seeded one draw for draw). The explorer's compare mode runs one after the speculative run.
- a run's *pair* is the one it was built on; inside the server that is the engine's ``slot_pair()``
  (``slots.SlotPair``: the request's own slots of the shared models), kept as ``run.pair``.
- *model state* is what a shared model holds of one sequence (its KV cache, ``state()`` / ``restore()``).
  A backend without them (llama.cpp) cannot switch: :func:`can_switch` says so, and the engine then
  serves its requests one at a time.
"""

from __future__ import annotations

import time

from ..choices import make_drafter, make_policy, parse_draft
from ..decode import SpeculativeRun, make_generator
from ..models.base import check_prompt
from ..rule import sample
from ..sampling import probs_from_logits
from ..session import RunSettings, describe_drafter
from ..stats import GenerationStats, RoundRecord, Timer, summarize


class SequenceRun(SpeculativeRun):
    """One request's speculative generation on a shared pair: ``decode.SpeculativeRun`` with the
    drafter and γ policy a request's settings name. Every check happens in ``__init__``, before it
    touches a model, so a bad request is refused without disturbing the others."""

    def __init__(self, pair, ids: list[int], settings: RunSettings) -> None:
        settings.validate()
        self.settings, self.pair = settings, pair
        drafter = make_drafter(parse_draft(settings.draft), draft_model=pair.draft,
                               vocab_size=pair.target.vocab_size, device=pair.target.device,
                               stop_below=settings.stop_below, window=settings.draft_window)
        super().__init__(pair.target, drafter, ids, max_new_tokens=settings.max_new_tokens,
                         gamma=make_policy(settings.gamma), sampling=settings.sampling, seed=settings.seed,
                         eos_token_id=pair.eos_token_ids)

    @property
    def last_record(self) -> RoundRecord | None:
        return self.records[-1] if self.records else None

    def figures(self) -> dict:
        """This request's speculation figures, for the response's ``specdec`` field."""
        s = self.stats()
        return {
            "draft": self.settings.draft, "gamma": self.settings.gamma, "drafter": describe_drafter(self.drafter),
            "alpha": s.alpha, "tokens_per_target_call": s.tokens_per_target_call, "mean_gamma": s.mean_gamma,
            "drafted": s.drafted, "accepted": s.accepted, "acceptance_rate": s.acceptance_rate,
            "target_calls": s.target_calls, "rounds": s.rounds,
            "gamma_chosen": list(getattr(self.policy, "chosen", ())), "prompt_tokens_reused": s.prompt_reused,
        }


class PlainRun:
    """One request's plain decoding on a shared pair, a step per token, with the members the engine
    reads of a :class:`SequenceRun` (``started``, ``done``, ``new_tokens``, ``last_record``, ...).
    ``start()`` reads the prompt into the target's cache; each ``step()`` scores the last token and
    draws the next, as ``decode.autoregressive_generate`` does (the same calls, the same draws)."""

    drafter = None  # the target alone

    def __init__(self, pair, ids: list[int], settings: RunSettings) -> None:
        settings.validate()
        self.settings, self.pair, self.target, self.sampling = settings, pair, pair.target, settings.sampling
        self.max_new_tokens = settings.max_new_tokens
        self.sequence = check_prompt(pair.target, ids, settings.max_new_tokens, "target")
        eos = pair.eos_token_ids
        self.stop = frozenset() if eos is None else frozenset({eos} if isinstance(eos, int) else map(int, eos))
        self.generator = make_generator(settings.seed, pair.target.device)
        self.timer, self.records = Timer(), []
        self.prompt_length = len(self.sequence)
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
        self.target.prefill(self.sequence[:-1])
        self.timer.prompt_reused = getattr(self.target, "last_reused", 0)  # as autoregressive_generate counts it
        self.timer.prefill = time.perf_counter() - t0
        self.timer.total += self.timer.prefill
        self.started = True

    def step(self) -> list[int]:
        t0 = time.perf_counter()
        logits = self.target.score(self.sequence[-1:])  # [1, vocab]
        self.timer.target += time.perf_counter() - t0
        probs = probs_from_logits(logits[0], self.sampling)
        token = int(probs.argmax()) if self.sampling.greedy else sample(probs, self.generator)
        self.sequence.append(token)
        self.records.append(RoundRecord(drafted=(), n_accepted=0, next_token=token, kind="bonus"))
        self.done = token in self.stop or len(self.new_tokens) >= self.max_new_tokens
        self.timer.total += time.perf_counter() - t0
        return [token]

    def stats(self) -> GenerationStats:
        return summarize(self.records, len(self.new_tokens), 0, self.timer)

    def figures(self) -> dict:
        """The figures of a plain run, in the keys of ``SequenceRun.figures`` (nothing drafted)."""
        s = self.stats()
        return {
            "draft": None, "gamma": 0, "drafter": "none (the target alone)", "alpha": None,
            "tokens_per_target_call": s.tokens_per_target_call, "mean_gamma": None, "drafted": 0, "accepted": 0,
            "acceptance_rate": None, "target_calls": s.target_calls, "rounds": s.rounds, "gamma_chosen": [],
            "prompt_tokens_reused": s.prompt_reused,
        }


def switchable(model) -> bool:
    return callable(getattr(model, "state", None)) and callable(getattr(model, "restore", None))


def can_switch(pair) -> bool:
    """Whether every model of the pair can save and restore a sequence's state."""
    return all(switchable(m) for m in (pair.target, pair.draft) if m is not None)
