"""The explorer's JSON endpoints, as plain functions: request dict in, response dict out.

Every number comes from the engine: the toy rounds from ``decode.speculative_round`` with the
real acceptance rule, the histogram from ``rule.verify`` (via ``toy.worked_example_draws``), the γ
curves from ``specdec.theory``. A request the functions cannot use raises ``BadRequest``, which the
server turns into HTTP 400 with the message.
"""

from __future__ import annotations

import math
import secrets
import threading
from collections import OrderedDict
from typing import Any

from .. import theory
from ..checks import check_int
from ..choices import MAX_GAMMA
from ..decode import make_generator, speculative_round
from ..drafters import ModelDrafter
from ..models.toy import TOY_DRAFT, TOY_PROMPT, TOY_TARGET, TOY_WORDS, toy_models, worked_example_draws
from ..sampling import SamplingParams
from ..stats import RoundTotals, Timer

TOY_MAX_GAMMA = 8  # the γ slider of the toy figure (a request's γ: choices.MAX_GAMMA)
PLAN_MAX_GAMMA = 16  # the γ range of the "Choosing γ" curves and of its best-γ readout
MAX_TOY_TOKENS = 600  # a toy text longer than this asks for a Reset
MAX_SESSIONS = 256  # toy sessions kept (least recently used dropped first)


class BadRequest(ValueError):
    """The request cannot be served as sent: HTTP 400 with this message."""


class NotFound(LookupError):
    """A well-formed request naming something that no longer exists: HTTP 404."""


# --------------------------------------------------------------------------- input checks


def get_int(data: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = data.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    return check_int(name, value, low, high, error=BadRequest)


def get_float(data: dict, name: str, default: float | None, low: float, high: float) -> float:
    value = data.get(name, default)
    try:
        number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not math.isfinite(number) or not low <= number <= high:
        raise BadRequest(f"{name}={value!r} is invalid: must be a number in [{low:g}, {high:g}]")
    return number


# --------------------------------------------------------------------------- figure 1: the toy pair


class ToySession:
    """One reader's toy text: its own pair of bigram models, generator and counters."""

    def __init__(self, seed: int | None) -> None:
        self.lock = threading.Lock()
        self.target, draft_model = toy_models()
        self.drafter = ModelDrafter(draft_model)
        self.generator = make_generator(seed)
        self.sequence = [TOY_WORDS.index(w) for w in TOY_PROMPT]
        self.prompt_length = len(self.sequence)
        self.totals, self.gamma = RoundTotals(), None  # the rounds so far
        self.target.prefill(self.sequence[:-1])  # the loop's invariant: all but the last token
        self.drafter.begin(self.sequence)

    def run_round(self, gamma: int) -> dict:
        if len(self.sequence) >= MAX_TOY_TOKENS:
            raise BadRequest(f"the text is {len(self.sequence)} words long: press Reset to start again")
        start = len(self.sequence)
        record = speculative_round(self.target, self.drafter, self.sequence, gamma, SamplingParams(),
                                   self.generator, Timer())
        self.sequence.extend(record.tokens)
        self.drafter.commit(len(self.sequence))
        self.totals = RoundTotals.pool([self.totals, RoundTotals.of([record])])
        self.gamma = gamma
        context = [self.sequence[start - 1], *record.drafted]  # the word before each draft
        drafts = []
        for i, token in enumerate(record.drafted):
            p, q = float(TOY_TARGET[context[i], token]), float(TOY_DRAFT[context[i], token])
            status = "accepted" if i < record.n_accepted else "rejected" if i == record.n_accepted else "unchecked"
            drafts.append({"word": TOY_WORDS[token], "status": status, "p": p, "q": q,
                           "keep": 1.0 if q <= p else p / q})
        return {
            "gamma": gamma,
            "drafts": drafts,
            "next": {"word": TOY_WORDS[record.next_token], "kind": record.kind},
            "n_accepted": record.n_accepted,
            "betas": list(record.betas),
            **self.summary(),
        }

    def summary(self) -> dict:
        produced, totals = len(self.sequence) - self.prompt_length, self.totals
        alpha = totals.alpha
        # Eq. (1) at the α measured so far and the last γ: what tokens per run should approach.
        expected = theory.expected_tokens(alpha, self.gamma) if alpha is not None and alpha < 1 else None
        return {
            "words": [TOY_WORDS[t] for t in self.sequence],
            "prompt_length": self.prompt_length,
            "target_runs": totals.rounds,
            "tokens": produced,
            "tokens_per_run": totals.tokens_per_target_call,
            "drafted": totals.drafted,
            "accepted": totals.accepted,
            "alpha": alpha,
            "expected_tokens": expected,
        }


class ToySessions:
    """Toy sessions by id, so that two browser tabs never share a text or a generator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, ToySession] = OrderedDict()

    def reset(self, data: dict) -> dict:
        seed = get_int(data, "seed", None, 0, 2**63 - 1)
        session = ToySession(seed)
        sid = secrets.token_hex(8)
        with self._lock:
            self._sessions.pop(str(data.get("session")), None)
            self._sessions[sid] = session
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return {"session": sid, **session.summary()}

    def round(self, data: dict) -> dict:
        gamma = get_int(data, "gamma", None, 1, TOY_MAX_GAMMA)
        sid = data.get("session")
        if not isinstance(sid, str):
            raise BadRequest("session is missing: call /api/toy/reset first")
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                raise NotFound(f"session {sid!r} is unknown or expired: press Reset")
            self._sessions.move_to_end(sid)
        with session.lock:
            return session.run_round(gamma)


def toy_info() -> dict:
    return {"words": list(TOY_WORDS), "prompt": list(TOY_PROMPT), "max_gamma": TOY_MAX_GAMMA}


# --------------------------------------------------------------------------- figure 2: 10,000 draws


class DrawCache:
    """Histogram results by (n, seed): the page's first load and its tests reuse the same run."""

    def __init__(self, size: int = 16) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._results: OrderedDict[tuple, dict] = OrderedDict()

    def draws(self, data: dict) -> dict:
        n = get_int(data, "n", 10_000, 1, 100_000)
        seed = get_int(data, "seed", 0, 0, 2**63 - 1)
        key = (n, seed)
        with self._lock:
            if key in self._results:
                return self._results[key]
        result = worked_example_draws(n, seed)
        with self._lock:
            self._results[key] = result
            while len(self._results) > self._size:
                self._results.popitem(last=False)
        return result


# --------------------------------------------------------------------------- figure 3: choosing γ


def plan(data: dict) -> dict:
    alpha = get_float(data, "alpha", 0.8, 0.0, 0.999)
    c = get_float(data, "c", 0.05, 0.0, 10.0)
    max_gamma = get_int(data, "max_gamma", PLAN_MAX_GAMMA, 1, MAX_GAMMA)
    rows = theory.plan(alpha, c, max_gamma=max_gamma)  # ĉ = c: arithmetic tracks time
    best = theory.optimal_gamma(alpha, c, max_gamma=max_gamma)
    return {
        "alpha": alpha,
        "c": c,
        "max_gamma": max_gamma,
        "best_gamma": best,
        "best_speedup": rows[best - 1].speedup,
        "speedup_bound": theory.speedup_bound(alpha),
        "guaranteed": theory.guaranteed_speedup(alpha, c),
        "rows": [{"gamma": r.gamma, "tokens": r.expected_tokens, "speedup": r.speedup,
                  "arithmetic": r.arithmetic} for r in rows],
    }


def as_dict(value: Any) -> dict:
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    return value
