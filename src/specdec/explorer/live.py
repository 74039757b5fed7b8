"""The live view: one generation per request, streamed as server-sent events.

Each request gets its own callback writing to its own connection, so two readers never see each
other's tokens. The models keep a cache, so one generation at a time runs on a pair; a second
reader waits (and is told so). The ``on_round`` callback raises ``Stop`` when the reader has gone
(closed the tab, pressed Stop) or the server is shutting down, which ends that generation.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from ..decode import autoregressive_generate, speculative_generate
from ..models.base import LanguageModel
from ..sampling import SamplingParams
from .api import BadRequest, get_bool, get_float, get_int, get_str

Send = Callable[[str, dict], None]  # (event name, JSON data) → written to the reader's stream


class LivePair(Protocol):
    """What the live view needs of a model pair (``specdec.pair.ModelPair`` and ``toy.ToyPair``)."""

    target: LanguageModel
    draft: LanguageModel
    eos_token_ids: list[int]

    def encode(self, text: str, chat: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Stop(Exception):
    """Raised from the on_round callback to end a generation nobody is reading any more."""


@dataclass(frozen=True)
class LiveRequest:
    prompt: str
    gamma: int
    max_new_tokens: int
    temperature: float
    compare: bool
    chat: bool
    seed: Optional[int]

    @classmethod
    def parse(cls, data: dict) -> "LiveRequest":
        prompt = get_str(data, "prompt", 4000)
        if not prompt.strip():
            raise BadRequest("prompt is empty: type some text to continue")
        return cls(
            prompt=prompt,
            gamma=get_int(data, "gamma", 4, 1, 16),
            max_new_tokens=get_int(data, "max_new_tokens", 64, 1, 1024),
            temperature=get_float(data, "temperature", 1.0, 0.0, 2.0),
            compare=get_bool(data, "compare", False),
            chat=get_bool(data, "chat", True),
            seed=get_int(data, "seed", None, 0, 2**63 - 1),
        )


class Streamer:
    """The on_round callback: decodes new tokens to text pieces, tagged by origin, with stats."""

    def __init__(self, pair: LivePair, mode: str, send: Send, should_stop: Callable[[], bool]) -> None:
        self.pair, self.mode, self.send, self.should_stop = pair, mode, send, should_stop
        self.ids: list[int] = []
        self.shown = ""
        self.rounds = self.drafted = self.accepted = 0
        self.betas: list[float] = []
        self.start = time.perf_counter()

    def __call__(self, record, tokens: list[int]) -> None:
        if self.should_stop():
            raise Stop
        self.rounds += 1
        self.drafted += len(record.drafted)
        self.accepted += record.n_accepted
        self.betas.extend(record.betas)
        if self.mode == "plain":
            kinds = ["target"] * len(tokens)
        else:
            kinds = (["accepted"] * record.n_accepted + [record.kind])[: len(tokens)]
        pieces = []
        for token, kind in zip(tokens, kinds):
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
        return {
            "tokens": len(self.ids),
            "target_calls": self.rounds,
            "tokens_per_call": len(self.ids) / self.rounds if self.rounds else None,
            "alpha": sum(self.betas) / len(self.betas) if self.betas else None,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "seconds": seconds,
            "tokens_per_second": len(self.ids) / seconds if seconds > 0 else None,
        }


class LiveRunner:
    """Owns the pair (built on first use by ``factory``) and runs one generation at a time on it."""

    def __init__(self, factory: Callable[[], LivePair], label: str, *, slow_load: bool = True) -> None:
        self.factory, self.label, self.slow_load = factory, label, slow_load
        self.stopping = threading.Event()  # set when the server shuts down
        self._pair: Optional[LivePair] = None
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

    def encode_now(self, request: LiveRequest) -> Optional[list[int]]:
        """The prompt's ids if the pair is loaded already (a bad prompt is then a BadRequest)."""
        if not self.loaded:
            return None
        try:
            return self.pair().encode(request.prompt, chat=request.chat)
        except ValueError as err:
            raise BadRequest(str(err)) from err

    def stream(self, request: LiveRequest, ids: Optional[list[int]], send: Send,
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
                send("error", {"message": f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)})
            except OSError:
                pass
        finally:
            with self._count_lock:
                self.active -= 1
                self.finished += 1

    def _stream(self, request: LiveRequest, ids: Optional[list[int]], send: Send,
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
            sampling = SamplingParams(temperature=request.temperature)
            common = dict(max_new_tokens=request.max_new_tokens, sampling=sampling, seed=request.seed,
                          eos_token_id=pair.eos_token_ids)
            modes = ["speculative", "plain"] if request.compare else ["speculative"]
            for mode in modes:
                send("start", {"mode": mode, "prompt_tokens": len(ids), "gamma": request.gamma})
                streamer = Streamer(pair, mode, send, should_stop)
                if mode == "speculative":
                    speculative_generate(pair.target, pair.draft, ids, gamma=request.gamma, on_round=streamer, **common)
                else:
                    autoregressive_generate(pair.target, ids, on_round=streamer, **common)
                send("done", {"mode": mode, "text": pair.decode(streamer.ids), **streamer.stats()})
            send("end", {})
        finally:
            self._run_lock.release()


def toy_factory() -> LivePair:
    from ..models.toy import ToyPair

    return ToyPair()


def real_factory(target: Optional[str] = None, draft: Optional[str] = None, *, device: str = "cpu",
                 dtype: Optional[str] = None) -> Callable[[], LivePair]:
    """A factory loading the real pair when first called (``specdec.session.load``: the pair from
    ``specdec.pair.load_pair``, float32 on CPU by default, warmed up so timings are fair)."""

    def load() -> LivePair:
        try:  # imported only when the live view is first used
            from ..run import load as load_warm
        except ImportError:
            load_warm = None
        if load_warm is not None:
            return load_warm(target, draft, device=device, dtype=dtype or "auto")
        from ..loading.pair import load_pair

        return load_pair(target, draft, device=device, dtype=dtype)

    return load
