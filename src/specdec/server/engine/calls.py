"""How the engine thread answers the calls of the requests' slots (``slots``), and what each kind costs.

Terms:

- a *group* is the open ``score`` calls on one model; :func:`answer_scores` answers a group with one
  ``score_many`` (the native backend: one forward pass, one read of the weights for every row; the
  transformers backend on a GPU: one padded pass), or, for a backend without it (or whose ``batch_scores``
  is False: transformers on the CPU, where turns keep each request's bits), by restoring each request's
  state and scoring it in turn;
- a *chunk* of a prompt: :func:`answer_prefill` reads at most ``budget`` tokens of a ``prefill`` call
  and leaves the call open until the whole prompt is read (a backend that cannot read in parts reads
  it whole); the prefix cache is consulted at the first chunk and given the rows after the last;
- :class:`CallCosts` keeps T(rows) per model role as measured on these calls (the load-aware γ prices
  an engine step with it: ``batch_gamma``).

Only the engine thread runs these, while every busy request waits on a call; so the models' own
"current sequence" is the engine's to use. A pair that cannot save its state (llama.cpp) serves one
request at a time, and its calls go straight to the models.
"""

from __future__ import annotations

import time

from ...gamma import CostEstimate
from .slots import Call, Exchange


class CallCosts:
    """T(rows) of the target's and the draft's calls, as measured (``gamma.CostEstimate``'s curve)."""

    def __init__(self) -> None:
        self.by_role = {"target": CostEstimate(), "draft": CostEstimate()}

    def observe(self, role: str, rows: int, seconds: float) -> None:
        if rows > 0:
            self.by_role[role].observe_call(rows, seconds)

    def curve(self, role: str):
        """rows → seconds (units of one target row before anything was timed)."""
        return self.by_role[role].target_curve()


def answer_trims(exchange: Exchange, calls: list[Call], switchable: bool) -> None:
    for call in calls:
        slot, model = call.slot, call.slot.model
        if switchable:
            model.restore(slot.state)
            model.trim(call.length)
            slot.state = model.state()
        else:
            model.trim(call.length)
        slot._length = call.length
        exchange.answer(call)


def answer_scores(exchange: Exchange, calls: list[Call], switchable: bool, costs: CallCosts) -> None:
    """One group: every call scores tokens of its own request on the same model."""
    model = calls[0].slot.model
    start = time.perf_counter()
    try:
        if switchable and callable(getattr(model, "score_many", None)) and getattr(model, "batch_scores", True):
            logits, states = model.score_many([c.slot.state for c in calls], [c.tokens for c in calls])
        else:
            logits, states = [], []
            for call in calls:
                if switchable:
                    model.restore(call.slot.state)
                logits.append(model.score(call.tokens))
                states.append(model.state() if switchable else None)
    except Exception as err:  # a backend failure: every request of the group sees it
        for call in calls:
            exchange.answer(call, error=err)
        return
    costs.observe(calls[0].slot.role, sum(len(c.tokens) for c in calls), time.perf_counter() - start)
    for call, rows, state in zip(calls, logits, states, strict=True):
        call.slot.state = state
        call.slot._length += len(call.tokens)
        exchange.answer(call, rows)


def answer_prefill(exchange: Exchange, call: Call, budget: int | None, switchable: bool) -> int:
    """Read up to ``budget`` tokens (None: all) of ``call``'s prompt; returns how many were read."""
    slot, model, tokens = call.slot, call.slot.model, call.tokens
    try:
        if not (switchable and callable(getattr(model, "reuse_prefix", None))):
            if switchable and slot.state is not None:
                model.restore(slot.state)
            model.prefill(tokens)
            read = len(tokens)
            call.progress = len(tokens)
        else:
            if call.progress == 0:
                call.progress = slot.last_reused = model.reuse_prefix(tokens)
            else:
                model.restore(slot.state)
            read = len(tokens) - call.progress if budget is None else min(budget, len(tokens) - call.progress)
            model.read(tokens[call.progress : call.progress + read])
            call.progress += read
            if call.progress == len(tokens):
                model.keep_prefix(tokens)
        slot.state = model.state() if switchable else None
    except Exception as err:
        exchange.answer(call, error=err)
        return 0
    if call.progress == len(tokens):
        slot._length = len(tokens)
        exchange.answer(call)
    return read
