"""The live view: one generation per request, streamed as server-sent events.

Each request gets its own callback writing to its own connection, so two readers never see each
other's tokens. The models keep a cache, so one generation at a time runs on a pair; a second
reader waits (and is told so). The ``on_round`` callback raises ``Stop`` when the reader has gone
(closed the tab, pressed Stop) or the server is shutting down, which ends that generation.
Generations go through the CLI's run path (``run.generate``), so every drafter spec and γ policy
the CLI takes works here too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..checks import check_int
from ..drafters import parse_draft
from ..models.base import LanguageModel
from ..run import RunSettings, generate
from ..run import load as load_warm
from ..sampling import SamplingParams
from ..stats import RoundTotals
from .api import BadRequest, get_bool, get_float, get_int, get_str

MAX_GAMMA = 16  # the largest integer γ a live request may ask for
LIVE_DRAFTS = ("model", "lookup", "lookup+model", "ngram:FILE", "lookup+ngram:FILE")

Send = Callable[[str, dict], None]  # (event name, JSON data) → written to the reader's stream


class LivePair(Protocol):
    """What the live view needs of a model pair (``specdec.pair.ModelPair`` and ``toy.ToyPair``)."""

    target: LanguageModel
    draft: LanguageModel | None  # None when loaded for a drafter that needs no model
    eos_token_ids: list[int]

    def encode(self, text: str, chat: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Stop(Exception):
    """Raised from the on_round callback to end a generation nobody is reading any more."""


@dataclass(frozen=True)
class LiveRequest:
    prompt: str
    gamma: int | str  # an integer, "auto" (learned online) or "heuristic"
    max_new_tokens: int
    temperature: float
    compare: bool
    chat: bool
    seed: int | None
    draft: str = "model"  # a drafter spec (``drafters.parse_draft``) the loaded pair can serve

    @classmethod
    def parse(cls, data: dict) -> LiveRequest:
        prompt = get_str(data, "prompt", 4000)
        if not prompt.strip():
            raise BadRequest("prompt is empty: type some text to continue")
        return cls(
            prompt=prompt,
            gamma=get_gamma(data, "gamma", 4),
            max_new_tokens=get_int(data, "max_new_tokens", 64, 1, 1024),
            temperature=get_float(data, "temperature", 1.0, 0.0, 2.0),
            compare=get_bool(data, "compare", False),
            chat=get_bool(data, "chat", True),
            seed=get_int(data, "seed", None, 0, 2**63 - 1),
            draft=get_draft(data, "draft", "model"),
        )

    def settings(self) -> RunSettings:
        """The run settings ``run.generate`` takes (the CLI's run path)."""
        return RunSettings(gamma=self.gamma, max_new_tokens=self.max_new_tokens, seed=self.seed, chat=self.chat,
                           sampling=SamplingParams(temperature=self.temperature), draft=self.draft)


def get_gamma(data: dict, name: str, default: int | str) -> int | str:
    """An integer in [1, MAX_GAMMA] (or its digits), "auto" or "heuristic"."""
    value = data.get(name, default)
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("auto", "heuristic"):
        return text
    if text is not None and text.isdigit():
        value = int(text)
    check_int(name, value, 1, MAX_GAMMA, note=", 'auto' or 'heuristic'", error=BadRequest)
    return value


def get_draft(data: dict, name: str, default: str) -> str:
    """A drafter spec the live view can build per request: no draft model paths (the pair's own
    draft model is ``model``)."""
    value = data.get(name, default)
    if isinstance(value, str) and len(value) > 1000:
        raise BadRequest(f"{name} is {len(value)} characters long: at most 1000 are accepted")
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{name}={value!r} is invalid: must be one of {', '.join(LIVE_DRAFTS)}")
    try:
        spec = parse_draft(value)
    except ValueError as err:  # it names the value and the accepted forms
        raise BadRequest(str(err)) from None
    if spec.source == "model" and spec.path is not None:
        raise BadRequest(f"{name}={value!r} is invalid: the live view drafts with the loaded pair's draft model "
                         f"('model'), not another one; accepted forms: {', '.join(LIVE_DRAFTS)}")
    return value.strip()


class Streamer:
    """The on_round callback: decodes new tokens to text pieces, tagged by origin, with stats."""

    def __init__(self, pair: LivePair, mode: str, send: Send, should_stop: Callable[[], bool]) -> None:
        self.pair, self.mode, self.send, self.should_stop = pair, mode, send, should_stop
        self.ids: list[int] = []
        self.shown = ""
        self.records: list = []  # the rounds so far (``stats.RoundRecord``)
        self.start = time.perf_counter()

    def __call__(self, record, tokens: list[int]) -> None:
        if self.should_stop():
            raise Stop
        self.records.append(record)
        if self.mode == "plain":
            kinds = ["target"] * len(tokens)
        else:
            kinds = (["accepted"] * record.n_accepted + [record.kind])[: len(tokens)]
        pieces = []
        for token, kind in zip(tokens, kinds, strict=True):
            self.ids.append(int(token))
            text = self.pair.decode(self.ids)
            if text.endswith("\ufffd"):  # half of a multi-byte character: the next token shows it
                pieces.append({"text": "", "kind": kind})
                continue
            pieces.append({"text": text[len(self.shown):], "kind": kind})
            self.shown = text
        self.send("round", {"mode": self.mode, "pieces": pieces, **self.stats()})

    def stats(self) -> dict:
        seconds = time.perf_counter() - self.start
        totals = RoundTotals.of(self.records, len(self.ids))
        return {
            "tokens": len(self.ids),
            "target_calls": totals.target_calls,
            "tokens_per_call": totals.tokens_per_target_call,
            "alpha": totals.alpha,
            "acceptance_rate": totals.acceptance_rate,
            "mean_gamma": totals.mean_gamma if self.mode != "plain" else None,
            "seconds": seconds,
            "tokens_per_second": len(self.ids) / seconds if seconds > 0 else None,
        }


class LiveRunner:
    """Owns the pair (built on first use by ``factory``) and runs one generation at a time on it."""

    def __init__(self, factory: Callable[[], LivePair], label: str, *, slow_load: bool = True) -> None:
        self.factory, self.label, self.slow_load = factory, label, slow_load
        self.stopping = threading.Event()  # set when the server shuts down
        self._pair: LivePair | None = None
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.active = 0  # generations streaming right now (waiting ones included)
        self.finished = 0  # generations ended (completed, failed or stopped)

    @property
    def loaded(self) -> bool:
        return self._pair is not None

    def pair(self) -> LivePair:
        with self._load_lock:
            if self._pair is None:
                self._pair = self.factory()
            return self._pair

    def encode_now(self, request: LiveRequest) -> list[int] | None:
        """The prompt's ids if the pair is loaded already (a bad prompt, or a drafter needing a
        draft model the pair was loaded without, is then a BadRequest)."""
        if not self.loaded:
            return None
        pair = self.pair()
        if pair.draft is None and parse_draft(request.draft).needs_draft_model:
            raise BadRequest(f"draft={request.draft!r} is invalid: {self.label} has no draft model loaded; "
                             f"use lookup or ngram:FILE")
        try:
            return pair.encode(request.prompt, chat=request.chat)
        except ValueError as err:
            raise BadRequest(str(err)) from err

    def stream(self, request: LiveRequest, ids: list[int] | None, send: Send,
               client_gone: Callable[[], bool]) -> None:
        """Run ``request``, sending events until done; returns early when the reader has gone."""
        with self._count_lock:
            self.active += 1
        should_stop = lambda: self.stopping.is_set() or client_gone()  # noqa: E731
        try:
            self._stream(request, ids, send, should_stop)
        except (Stop, BrokenPipeError, ConnectionResetError):
            pass  # the reader left: nothing to tell anyone
        except Exception as err:  # a failure in the model or the pair: the reader sees it
            try:
                message = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                send("error", {"message": message})
            except OSError:
                pass
        finally:
            with self._count_lock:
                self.active -= 1
                self.finished += 1

    def _stream(self, request: LiveRequest, ids: list[int] | None, send: Send,
                should_stop: Callable[[], bool]) -> None:
        if not self.loaded and self.slow_load:
            send("status", {"message": f"loading {self.label} (the first time takes a while) …"})
        pair = self.pair()
        if ids is None:
            ids = pair.encode(request.prompt, chat=request.chat)
        told = False
        while not self._run_lock.acquire(timeout=0.2):
            if should_stop():
                return
            if not told:
                send("status", {"message": "waiting for another reader's generation to finish …"})
                told = True
        try:
            settings = request.settings()
            modes = ["speculative", "plain"] if request.compare else ["speculative"]
            for mode in modes:
                send("start", {"mode": mode, "prompt_tokens": len(ids), "gamma": request.gamma,
                               "draft": request.draft})
                streamer = Streamer(pair, mode, send, should_stop)
                streamed = generate(pair, ids, settings, speculative=mode == "speculative", on_round=streamer)
                extra = ({"drafter": streamed.drafter, "gamma_chosen": list(streamed.gamma_chosen)}
                         if streamed.drafter else {})
                send("done", {"mode": mode, "text": pair.decode(streamer.ids), **streamer.stats(), **extra})
            send("end", {})
        finally:
            self._run_lock.release()


def toy_factory() -> LivePair:
    from ..models.toy import ToyPair

    return ToyPair()


def real_factory(target: str | None = None, draft: str | None = None, *, device: str = "cpu",
                 dtype: str | None = None) -> Callable[[], LivePair]:
    """A factory loading the real pair when first called (``run.load``, as the CLI's run does: the
    pair from ``loading.pair.load_pair``, warmed up so timings are fair; ``draft`` a --draft value,
    no draft model loaded for lookup or n-gram drafters)."""

    def load() -> LivePair:
        return load_warm(target, draft, device=device, dtype=dtype or "auto")

    return load
