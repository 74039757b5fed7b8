"""One request's generation, advanced one round at a time, so that the engine can run several at once.

Terms:

- a job's *run* (:class:`SequenceRun`) is one request's speculative generation: its token ids,
  drafter, γ policy, seeded generator and round records. ``start()`` reads the prompt into the
  models' caches; each ``step()`` is one round (draft γ, one target call, verify, roll back) and
  returns the tokens it kept. It is ``decode.SpeculativeRun``, the loop ``speculative_generate``
  itself runs, so a greedy run gives the same tokens as ``session.generate``, and a seeded one the same
  draws (with a fixed γ). Its γ policy is steered (``batch_gamma.steer``): a ``--gamma auto`` run takes the γ
  the engine assigns when it shares a step, its own choice when alone; a *reproducible* run (a request that
  gives its own ``seed``: ``RunSettings.reproducible``) is never steered, and its AdaptiveGamma prices γ with
  the pair's fixed costs (``session.cost_prior``), so its γ and draws depend on its own rounds alone.
- a *plain run* (:class:`PlainSequenceRun`) is the same request decoded with the target alone, one token a
  step: ``decode.autoregressive_generate``'s loop, so its greedy output is that function's token for
  token (and a seeded one draw for draw). The explorer's compare mode runs one after the speculative run.
- a run's *pair* is the one it was built on; inside the server that is the engine's ``slot_pair()``
  (``slots.SlotPair``: the request's own slots of the shared models), kept as ``run.pair``.
- *model state* is what a shared model holds of one sequence (its KV cache, ``state()`` / ``restore()``:
  the ``switch_state`` ability, ``models.base.Abilities``). A backend without it (llama.cpp) cannot switch:
  :func:`can_switch` says so, and the engine then serves its requests one at a time.
"""

from __future__ import annotations

from ... import decode
from ...decode import SpeculativeRun
from ...drafters.history_table import HistoryView
from ...grammar import grammar_for
from ...session import RunSettings, describe_drafter, drafter_for, gamma_policy, record_history
from ...stats import GenerationStats
from .batch_gamma import steer
from .slots import Slot


class SequenceRun(SpeculativeRun):
    """One request's speculative generation on a shared pair: ``decode.SpeculativeRun`` with the
    drafter and γ policy a request's settings name. Every check happens in ``__init__``, before it
    touches a model, so a bad request is refused without disturbing the others."""

    def __init__(self, pair, ids: list[int], settings: RunSettings, history: HistoryView | None = None) -> None:
        settings.validate()
        self.settings, self.pair, self.history = settings, pair, history
        # A reproducible run drafts from its own text only: the table changes with other requests, and which
        # draws a seeded run makes depends on its drafts (its tokens stay exact either way).
        drafter = drafter_for(settings, pair, None if settings.reproducible else history)
        # A reproducible run (a request's own seed) keeps its own policy, priced with the pair's fixed costs:
        # its γ then depends on its own rounds alone, never on the engine's load or measured times.
        policy = gamma_policy(settings, model_of(pair.target), model_of(pair.draft))
        super().__init__(pair.target, drafter, ids, max_new_tokens=settings.max_new_tokens,
                         gamma=policy if settings.reproducible else steer(policy), sampling=settings.sampling,
                         seed=settings.seed, eos_token_id=pair.eos_token_ids,
                         constraint=grammar_for(settings.grammar, pair), logprobs=settings.logprobs)

    def record_history(self) -> None:
        """Keep this finished request's text (prompt and answer) in its tenant's history, if the server keeps one."""
        record_history(self.history, self.sequence[:self.prompt_length], self.new_tokens)

    def figures(self) -> dict:
        """This request's speculation figures, for the response's ``specdec`` field."""
        return figures_of(self.stats(), self.settings.draft, self.settings.gamma, describe_drafter(self.drafter),
                          list(self.policy.chosen))


class PlainSequenceRun(decode.PlainRun):
    """One request's plain decoding on a shared pair (the explorer's compare mode): ``decode.PlainRun``
    (``autoregressive_generate``'s loop, the same calls and draws) with a request's settings, and the
    members the engine reads of a :class:`SequenceRun`."""

    def __init__(self, pair, ids: list[int], settings: RunSettings) -> None:
        settings.validate()
        self.settings, self.pair = settings, pair
        super().__init__(pair.target, ids, max_new_tokens=settings.max_new_tokens, sampling=settings.sampling,
                         seed=settings.seed, eos_token_id=pair.eos_token_ids,
                         constraint=grammar_for(settings.grammar, pair), logprobs=settings.logprobs)

    def record_history(self) -> None:
        """A plain run (the explorer's compare mode) keeps nothing."""

    def figures(self) -> dict:
        """The figures of a plain run, in the keys of ``SequenceRun.figures`` (nothing drafted)."""
        return figures_of(self.stats(), None, 0, "none (the target alone)", [])


def figures_of(s: GenerationStats, draft: str | None, gamma, drafter: str, gamma_chosen: list[int]) -> dict:
    """A run's figures for the response's ``specdec`` field: ``GenerationStats.figures`` with the drafter
    and γ it ran with (a plain run: ``draft`` None, nothing drafted, α, rates and mean γ None)."""
    return {"draft": draft, "gamma": gamma, "drafter": drafter, **s.figures(drafting=bool(draft)),
            "gamma_chosen": gamma_chosen}


def model_of(model):
    """The shared model behind a job's slot (a pair outside the engine: the model itself; None stays None)."""
    return model.model if isinstance(model, Slot) else model


def can_switch(pair) -> bool:
    """Whether every model of the pair can save and restore a sequence's state (its declared ``abilities``)."""
    return all(m.abilities.switch_state for m in (pair.target, pair.draft) if m is not None)
