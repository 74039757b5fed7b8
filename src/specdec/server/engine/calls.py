"""How the engine thread answers a batch of calls (``plan.Batch``) on the shared models, and what each costs.

- a *score* batch (``draft`` or ``verify``): every call scores tokens of its own job on one model. A model
  whose ``abilities.batch_scores`` holds answers them with one ``score_many`` (the native backend: one forward
  pass, one read of the weights for every row; the transformers backend on a GPU: one padded pass); any other
  switchable model restores each job's state and scores it in turn (transformers on the CPU, where turns keep
  each job's bits);
- a *read*: at most ``budget`` tokens of one ``prefill`` call; the call stays open until the whole prompt is
  read. A model that reads a prefix (``abilities.read_prefix``) consults its prefix cache at the first chunk and
  gives it the rows after the last; any other reads the prompt whole;
- :class:`CallCosts` keeps T(rows) per model role as measured on these calls (``batch_gamma`` prices a step
  with it).

Each function answers its calls and returns the batch's :class:`plan.Part` list. Only the engine thread runs
these, while every busy job waits on a call, so the models' own "current sequence" is the engine's to use. A
pair that cannot switch state (llama.cpp) serves one job at a time, and its calls go straight to the models.
"""

from __future__ import annotations

import time

from ...gamma import CostEstimate
from .plan import Part
from .slots import Call, Exchange

ROLES = ("target", "draft")


class CallCosts:
    """T(rows) of the target's and the draft's calls, as measured (``gamma.CostEstimate``'s call curve)."""

    def __init__(self) -> None:
        self.by_role = {role: CostEstimate() for role in ROLES}

    def observe(self, role: str, rows: int, seconds: float) -> None:
        if rows > 0:
            self.by_role[role].observe_call(rows, seconds)

    def measured(self, role: str) -> bool:
        return bool(self.by_role[role].by_k)

    def curve(self, role: str):
        """rows → seconds of one call of ``role``'s model (units of one row before anything was timed)."""
        return self.by_role[role].call_curve()


def answer_trims(exchange: Exchange, calls: list[Call], switchable: bool) -> list[Part]:
    parts = []
    for call in calls:
        slot, model = call.slot, call.slot.model
        if switchable:
            model.restore(slot.state)
            model.trim(call.length)
            slot.state = model.state()
        else:
            model.trim(call.length)
        parts.append(Part(slot.job, call.length, slot.length, slot.role))
        slot.length = call.length
        exchange.answer(call)
    return parts


def answer_scores(exchange: Exchange, calls: list[Call], switchable: bool, costs: CallCosts) -> list[Part]:
    """One model's score calls, each of its own job."""
    model = calls[0].slot.model
    start = time.perf_counter()
    parts = [Part(c.slot.job, c.slot.length, c.slot.length + len(c.tokens), c.slot.role) for c in calls]
    try:
        if switchable and model.abilities.batch_scores:
            logits, states = model.score_many([c.slot.state for c in calls], [c.tokens for c in calls])
        else:
            logits, states = [], []
            for call in calls:
                if switchable:
                    model.restore(call.slot.state)
                logits.append(model.score(call.tokens))
                states.append(model.state() if switchable else None)
    except Exception as err:  # a backend failure: every job of the batch sees it
        for call in calls:
            exchange.answer(call, error=err)
        return parts
    costs.observe(calls[0].slot.role, sum(len(c.tokens) for c in calls), time.perf_counter() - start)
    for call, rows, state in zip(calls, logits, states, strict=True):
        call.slot.state = state
        call.slot.length += len(call.tokens)
        exchange.answer(call, rows)
    return parts


def answer_read(exchange: Exchange, call: Call, budget: int | None, switchable: bool) -> list[Part]:
    """Read up to ``budget`` tokens (None: all) of ``call``'s prompt; the part says which were read."""
    slot, model, tokens = call.slot, call.slot.model, call.tokens
    try:
        if not (switchable and model.abilities.read_prefix):
            if switchable and slot.state is not None:
                model.restore(slot.state)
            call.reused = model.prefill(tokens)
            first, call.progress = call.reused, len(tokens)
        else:
            if call.progress == 0:
                call.progress = call.reused = model.reuse_prefix(tokens)
            else:
                model.restore(slot.state)
            first = call.progress
            read = len(tokens) - first if budget is None else min(budget, len(tokens) - first)
            model.read(tokens[first : first + read])
            call.progress += read
            if call.progress == len(tokens):
                model.keep_prefix(tokens)
        slot.state = model.state() if switchable else None
    except Exception as err:
        exchange.answer(call, error=err)
        return []
    part = Part(slot.job, first, call.progress, slot.role)
    if call.progress == len(tokens):
        slot.length = len(tokens)
        exchange.answer(call, call.reused)
    return [part]
