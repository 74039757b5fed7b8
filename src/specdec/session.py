"""One user-facing run on a real pair: settings, loading with timings, streaming, the report.

The CLI's ``generate`` runs on this (the server and the explorer's live view run the same loop,
``decode.SpeculativeRun``, through the server's engine); it returns typed results and leaves printing
to its callers (``RunResult.report`` formats, it does not print).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TextIO

import torch

from . import theory
from .checks import check_int
from .choices import make_drafter, make_policy, parse_draft, parse_gamma
from .decode import MAX_TOP_LOGPROBS, Generation, autoregressive_generate, speculative_generate
from .drafters import CompositeDrafter, Drafter, HistoryDrafter
from .drafters.history_table import HistoryTable, HistoryView, as_view
from .drafters.model import DEFAULT_DRAFT_WINDOW, MIN_DRAFT_WINDOW
from .gamma import CostEstimate, GammaPolicy
from .grammar import LazyGrammar, grammar_for
from .loading.backend import resolve_backend
from .loading.pair import ModelPair, load_pair
from .loading.settings import LoadSettings, check_threads
from .models.prefix import PrefixCache
from .sampling import SamplingParams

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunSettings:
    """One run's settings. ``reproducible``: the run's γ depends on its own finished rounds alone, so the same
    run with the same ``seed`` gives the same tokens, whatever the machine's speed or the server's load. It
    matters only for ``gamma="auto"``, whose AdaptiveGamma then prices γ with the pair's fixed costs
    (:func:`cost_prior`) instead of measured call times, and which the server's engine never steers with the
    other requests' load (``server.engine.batch_gamma``); a fixed or heuristic γ depends on the rounds alone
    anyway. It needs a ``seed``. The server sets it for a request that gives its own ``seed`` (not for the
    server's default seed); the CLI leaves it False."""

    gamma: int | str = "auto"  # drafted tokens per round: an integer, "auto" (learned online) or "heuristic"
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    seed: int | None = 0
    chat: bool | None = None  # None: use the chat template when the tokenizer has one
    stop_below: float | None = None  # draft stops early after a token it gave q below this
    draft: str = "model"  # the drafter (choices.parse_draft): model, lookup, ngram:FILE, lookup+model, ...
    draft_window: int | None = DEFAULT_DRAFT_WINDOW  # prompt tokens a draft model reads (None: all of them)
    draft_start: int = 0  # prompt tokens a draft model skips at the start (the server's: a tool declaration)
    reproducible: bool = False  # γ from this run's own rounds only, never from time or load (see above)
    grammar: str | LazyGrammar | None = None  # a grammar text (specdec.grammar: a JSON schema's, ...) to match
    logprobs: int | None = None  # each emitted token's log-probability and this many alternatives (0..20), or off

    def validate(self) -> None:
        """Refuse bad values before any model is loaded."""
        parse_gamma(self.gamma)
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} is invalid: must be an integer >= 1")
        if self.stop_below is not None and not 0.0 <= self.stop_below < 1.0:
            raise ValueError(f"stop_below={self.stop_below!r} is invalid: must be in [0, 1)")
        parse_draft(self.draft)
        if self.draft_window is not None:
            check_int("draft_window", self.draft_window, MIN_DRAFT_WINDOW, note=" (prompt tokens a draft model reads)")
        check_int("draft_start", self.draft_start, 0, note=" (prompt tokens a draft model skips)")
        if not isinstance(self.reproducible, bool):
            raise ValueError(f"reproducible={self.reproducible!r} is invalid: must be True or False")
        if self.reproducible and self.seed is None:
            raise ValueError("reproducible=True needs a seed: a run without one draws differently every time")
        if self.grammar is not None and not isinstance(self.grammar, (str, LazyGrammar)):
            raise ValueError(f"grammar={self.grammar!r} is invalid: must be a grammar text or a LazyGrammar "
                             "(specdec.grammar) or None")
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS, note=" (alternatives per token)")


# The fixed T(k) of a reproducible run (cost_prior): T(k)/T(1) = 1 + PRIOR_VERIFY_SLOPE·(k − 1), measured on the
# default target (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, native backend, 2-core AMD EPYC, 200 tokens of context) in
# benchmarks/results/batch-rows.md: T(1) = 27.7 ms and T(4) = 44.5 ms (medians), so (44.5 / 27.7 − 1) / 3 = 0.20.
PRIOR_VERIFY_SLOPE = 0.2


def weight_bytes(model) -> int | None:
    """The bytes of a model's weights, the same on every start: its GGUF file's size (native and llama.cpp
    backends: a model with a ``path`` to a file), or a transformers model's parameters and buffers; None when
    neither is known (the toy and bigram tables)."""
    path = getattr(model, "path", None)
    if isinstance(path, str | os.PathLike) and os.path.isfile(path):
        return os.path.getsize(path)
    module = getattr(model, "model", None)
    if isinstance(module, torch.nn.Module):
        return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    return None


def cost_prior(target, draft, drafts_by_model: bool) -> tuple[float, Callable[[int], float]]:
    """The fixed costs a reproducible ``--gamma auto`` run prices γ with on this pair: ``(c, T)``, derived from
    the pair itself, never from timings, so the same pair gives the same costs on every start and machine.

    - c, a draft call over a target call: decoding is memory-bound (each token reads every weight once), so
      the ratio of the models' :func:`weight_bytes` (the GGUF files' sizes; a cut draft head reads less, so
      this errs high); 0 when no draft model drafts (``drafts_by_model`` False: lookup and n-gram tables cost
      next to nothing); ``CostEstimate().prior_c`` when either model's bytes are unknown.
    - T(k)/T(1) = 1 + PRIOR_VERIFY_SLOPE·(k − 1), the default target's measured slope (see the constant).
    """
    if not drafts_by_model or draft is None:
        c = 0.0
    else:
        draft_bytes, target_bytes = weight_bytes(draft), weight_bytes(target)
        c = draft_bytes / target_bytes if draft_bytes and target_bytes else CostEstimate().prior_c
    return c, lambda k: 1.0 + PRIOR_VERIFY_SLOPE * (k - 1)


def gamma_policy(settings: RunSettings, target, draft) -> GammaPolicy:
    """A fresh γ policy for one run of ``settings`` on the pair ``target`` / ``draft`` (the models, not a
    server's slots of them): ``settings.gamma``'s (``choices.make_policy``); a reproducible ``auto`` one with
    the pair's fixed costs (:func:`cost_prior`), so that its γ depends on its own rounds' β alone."""
    if settings.reproducible and parse_gamma(settings.gamma) == "auto":
        c, curve = cost_prior(target, draft, parse_draft(settings.draft).needs_draft_model)
        return make_policy("auto", c=c, target_cost=curve)
    return make_policy(settings.gamma)


def set_threads(threads: int | None) -> None:
    """torch's CPU threads (None: left as they are); checked as ``LoadSettings.threads`` is."""
    if check_threads(threads) is not None:
        torch.set_num_threads(threads)


def load(settings: LoadSettings | None = None, log: Log = lambda msg: None) -> ModelPair:
    """Load the pair ``settings`` names (None: the default pair, every setting at its default), warm it
    up and give it a prefix cache of ``settings.cache_gb`` (``models.prefix``; 0 = off): a prompt that
    starts as an earlier one did reads only the rest. :func:`load_settings` builds the settings for a
    ``--draft`` value (no draft model for a drafter that needs none)."""
    s = (settings or LoadSettings()).for_device()
    with_draft = s.with_draft
    draft_name = (s.draft_model or "Qwen2.5-Coder-0.5B-Instruct (default)") if with_draft else "none"
    backend = resolve_backend(s.backend, s.target, s.draft_model if with_draft else None, device=s.device,
                              dequantize=s.dequantize)
    weights = {"llamacpp": "llama.cpp, the GGUF weights as stored",
               "native": "specdec's kernels over the GGUF weights as stored"}.get(
        backend, f"transformers, {'int8 weights' if s.quantize == 'int8' else s.dtype}")
    log(f"loading target {s.target or 'Qwen2.5-Coder-1.5B-Instruct (default)'} and draft model "
        f"{draft_name} on {s.device}, {weights} ...")
    start = time.perf_counter()
    pair = load_pair(replace(s, backend=backend,
                             draft_head=s.draft_head if with_draft and backend != "llamacpp" else None))
    warm_up(pair)
    share_prefix_cache(pair, PrefixCache.of_gb(s.cache_gb))
    log(f"loaded in {time.perf_counter() - start:.1f} s")
    return pair


def load_settings(drafter: str | None = "model", **fields) -> LoadSettings:
    """:class:`LoadSettings` for a ``--draft`` value: the draft model it names (``model:PATH``; None or
    ``model`` = the default draft), and none loaded when the drafter needs none (lookup, ngram:FILE,
    lookup+ngram:FILE) or ``with_draft=False`` says so; ``fields``: the other settings."""
    form = parse_draft(drafter)
    with_draft = fields.pop("with_draft", True) and form.needs_draft_model
    return LoadSettings(draft_model=form.path if with_draft else None, with_draft=with_draft, **fields)


def warm_up(pair: ModelPair) -> None:
    """One short pass through each model, so first-call allocations don't count in timings."""
    for model in (pair.target, pair.draft):
        if model is not None:
            model.prefill(list(range(16)))
            model.score([16, 17, 18, 19, 20])
            model.score([21])


def share_prefix_cache(pair, cache: PrefixCache) -> None:
    """One prefix cache for the pair's models that can keep prompt rows (the native backend's)."""
    for model in (pair.target, pair.draft):
        if model is not None and model.abilities.read_prefix:
            model.prefix_cache = cache


def prefix_cache_of(pair) -> PrefixCache | None:
    return pair.target.prefix_cache if pair.target.abilities.read_prefix else None


class TextStream:
    """An ``on_round`` callback that writes newly decoded text to a stream as tokens arrive."""

    def __init__(self, pair: ModelPair, out: TextIO) -> None:
        self.pair, self.out = pair, out
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, record, tokens: list[int]) -> None:
        self.ids.extend(tokens)
        text = self.pair.decode(self.ids)
        if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            return
        self.out.write(text[len(self.shown):])
        self.out.flush()
        self.shown = text


@dataclass(frozen=True)
class RunResult:
    text: str
    prompt_tokens: int
    settings: RunSettings
    speculative: Generation
    baseline: Generation | None = None
    baseline_text: str | None = None
    gamma_chosen: tuple[int, ...] = ()  # the γ the policy chose per round (drafted: stats.gammas)
    drafter: str = ""  # which drafter ran (choices.make_drafter), in words
    backend: str = ""  # what ran the models: transformers or llamacpp ("" for other pairs, e.g. the toy one)

    @property
    def cost_ratio(self) -> float | None:
        """The paper's c: mean draft call over one plain target call T(1) (needs the --compare run)."""
        draft_call = self.speculative.stats.mean_draft_call_seconds
        if self.baseline is None or not draft_call or not self.baseline.stats.mean_target_call_seconds:
            return None
        return draft_call / self.baseline.stats.mean_target_call_seconds

    @property
    def predicted_speedup(self) -> float | None:
        """Thm 3.8 from the measured α and c (the paper assumes verifying γ + 1 tokens costs T(1)),
        over the γ each round drafted: Σ E[tokens](γ_r) / Σ (γ_r·c + 1)."""
        alpha, c = self.speculative.stats.alpha, self.cost_ratio
        if alpha is None or c is None:
            return None
        return theory.expected_speedup_over_rounds(min(alpha, 0.999), self.speculative.stats.gammas, c)

    @property
    def predicted_speedup_measured_costs(self) -> float | None:
        """Σ E[tokens](γ_r) · T(1) / (draft + verify seconds of all rounds), every time measured in this run."""
        s, alpha = self.speculative.stats, self.speculative.stats.alpha
        if self.baseline is None or alpha is None or not s.mean_draft_call_seconds:
            return None
        tokens = sum(theory.expected_tokens(min(alpha, 0.999), g) for g in s.gammas)
        return tokens * self.baseline.stats.mean_target_call_seconds / (s.draft_seconds + s.target_seconds)

    @property
    def speedup(self) -> float | None:
        if self.baseline is None:
            return None
        ours, plain = self.speculative.stats.tokens_per_second, self.baseline.stats.tokens_per_second
        return ours / plain if ours is not None and plain else None  # None: a run without measured time

    @property
    def identical_to_baseline(self) -> bool | None:
        if self.baseline is None or not self.settings.sampling.greedy:
            return None
        return self.baseline.tokens == self.speculative.tokens

    def as_json(self) -> dict:
        """The speculative run's figures (``GenerationStats.figures``), with the text, the settings
        and, after a --compare run, the comparison with the baseline."""
        out = {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            **self.speculative.stats.figures(),
            "gamma": self.settings.gamma,
            "draft": self.settings.draft,
            "drafter": self.drafter,
            "gamma_chosen": list(self.gamma_chosen),
            "cost_ratio_c": self.cost_ratio,
            "predicted_speedup": self.predicted_speedup,
            "predicted_speedup_measured_costs": self.predicted_speedup_measured_costs,
            "temperature": self.settings.sampling.temperature,
            "seed": self.settings.seed,
            "backend": self.backend or None,
        }
        if self.baseline is not None:
            out |= {
                "baseline_tokens_per_second": self.baseline.stats.tokens_per_second,
                "baseline_new_tokens": self.baseline.stats.new_tokens,
                "speedup": self.speedup,
                "identical_to_baseline": self.identical_to_baseline,
            }
        return out

    def report(self) -> str:
        s = self.speculative.stats
        lines = [
            f"speculative: {s.new_tokens} tokens in {s.total_seconds:.2f} s = {_num(s.tokens_per_second)} tokens/s "
            f"(γ = {self.settings.gamma}, {'greedy' if self.settings.sampling.greedy else 'sampling'})",
            f"  drafter: {self.drafter or self.settings.draft}",
            f"  γ drafted per round: mean {_num(s.mean_gamma)}, rounds per γ "
            + ", ".join(f"{g}: {n}" for g, n in s.gamma_histogram.items()),
            f"  target calls {s.target_calls}, tokens per target call {_num(s.tokens_per_target_call)}, "
            f"accepted {s.accepted}/{s.drafted} drafts ({_pct(s.acceptance_rate)}), α = {_num(s.alpha)}"
            + (f"; {s.forced} drafts forced by the grammar (no draft call)" if s.forced else ""),
            f"  time: prompt {s.prefill_seconds:.2f} s, target {s.target_seconds:.2f} s, "
            f"draft {s.draft_seconds:.2f} s, "
            f"our loop {1000 * s.loop_seconds / max(s.rounds, 1):.1f} ms/round",
        ]
        if self.backend:
            lines.append(f"  backend: {'llama.cpp' if self.backend == 'llamacpp' else self.backend}")
        if self.baseline is not None:
            b = self.baseline.stats
            same = {True: "identical output", False: "OUTPUT DIFFERS", None: "sampled: outputs differ by design"}
            lines.append(
                f"plain decoding: {b.new_tokens} tokens in {b.total_seconds:.2f} s = "
                f"{_num(b.tokens_per_second)} tokens/s"
                f" → speed-up {_num(self.speedup)}× ({same[self.identical_to_baseline]})"
            )
            lines.append(
                f"  c = {_num(self.cost_ratio)} (draft call / plain target call); Thm 3.8 predicts "
                f"{_num(self.predicted_speedup)}×, {_num(self.predicted_speedup_measured_costs)}× with the measured "
                f"cost of verifying γ + 1 tokens ({1000 * s.mean_target_call_seconds:.0f} ms vs "
                f"{1000 * b.mean_target_call_seconds:.0f} ms for one)"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class Streamed:
    """One generation by ``generate``: tokens and stats, and for a speculative one how it drafted."""

    generation: Generation
    gamma_chosen: tuple[int, ...] = ()  # the γ the policy chose per round
    drafter: str = ""  # which drafter ran, in words ("" for plain decoding)


History = HistoryTable | HistoryView | None  # what a history form drafts from (a table: its tenant "")


def drafter_for(settings: RunSettings, pair, history: History = None) -> Drafter:
    """A fresh drafter for one run on ``pair``: the one ``settings.draft`` names (``choices.make_drafter``), with
    the run's ``stop_below``, ``draft_window`` and ``draft_start``, the pair's draft model, the target's vocabulary
    and device, and the ``history`` a history form drafts from."""
    return make_drafter(settings.draft, draft_model=pair.draft, vocab_size=pair.target.vocab_size,
                        device=pair.target.device, stop_below=settings.stop_below, window=settings.draft_window,
                        start=settings.draft_start, history=history)


def record_history(history: History, ids: list[int], tokens: list[int]) -> None:
    """Keep a finished run's text (prompt ``ids`` and answer ``tokens``) in ``history`` (None: nowhere)."""
    if (view := as_view(history)) is not None:
        view.record(list(ids) + list(tokens))


def generate(pair: ModelPair, ids: list[int], settings: RunSettings, *, speculative: bool = True,
             on_round=None, history: History = None) -> Streamed:
    """The streaming core of :func:`run` (and the tests' reference for a request alone): the drafter a
    ``settings.draft`` drafter form names, a fresh γ policy from ``settings.gamma`` (an int, "auto" or
    "heuristic"), and speculative generation from the prompt ``ids`` (plain decoding with the
    target when ``speculative`` is false), calling ``on_round(record, tokens)`` after every round; under
    ``settings.grammar``, a fresh matcher of it constrains the run (``specdec.grammar``). ``history``: what a
    history form drafts from (it records nothing: :func:`run` does)."""
    common = dict(max_new_tokens=settings.max_new_tokens, sampling=settings.sampling, seed=settings.seed,
                  eos_token_id=pair.eos_token_ids, on_round=on_round, constraint=grammar_for(settings.grammar, pair))
    if not speculative:
        return Streamed(autoregressive_generate(pair.target, ids, **common))
    drafter = drafter_for(settings, pair, history)
    policy = gamma_policy(settings, pair.target, pair.draft)
    generation = speculative_generate(pair.target, drafter, ids, gamma=policy, **common)
    return Streamed(generation, tuple(policy.chosen), describe_drafter(drafter))


def run(pair: ModelPair, prompt: str, settings: RunSettings, *, compare: bool = False,
        on_round=None, log: Log = lambda msg: None, history: History = None) -> RunResult:
    """``prompt`` generated on ``pair`` (and with ``compare`` decoded plainly too); ``history``: the table a
    history form drafts from, which then keeps this run's text (prompt and answer) for the next runs."""
    chat = pair.has_chat_template if settings.chat is None else settings.chat
    ids = pair.encode(prompt, chat=chat)
    cache = prefix_cache_of(pair)
    # With --compare both runs must meet the prefix cache as it was: the first one keeps nothing new.
    with cache.holding() if compare and cache is not None else contextlib.nullcontext():
        speculative = generate(pair, ids, settings, on_round=on_round, history=history)
    record_history(history, ids, speculative.generation.tokens)
    baseline = baseline_text = None
    if compare:
        log("\ndecoding the same prompt plainly with the target for comparison ...")
        baseline = generate(pair, ids, settings, speculative=False).generation
        baseline_text = pair.decode(baseline.tokens)
    return RunResult(pair.decode(speculative.generation.tokens), len(ids), settings, speculative.generation, baseline,
                     baseline_text, speculative.gamma_chosen, speculative.drafter, backend=getattr(pair, "backend", ""))


def describe_drafter(drafter) -> str:
    """The drafter's name; for a composite also how many rounds each part drafted."""
    name, rounds = drafter.name, drafter.rounds if isinstance(drafter, CompositeDrafter) else None
    if rounds:
        name += f" (rounds drafted: {rounds['first']} by the first, {rounds['fallback']} by the fallback)"
    first = drafter.first if isinstance(drafter, CompositeDrafter) else drafter
    if isinstance(first, HistoryDrafter) and (n := first.sources)["history"] + n["request"]:
        name += f" (history drafts: {n['request']} from this request, {n['history']} from earlier ones)"
    return name


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
