"""Measure what the paper's analysis needs on this machine: α, c, T(k), and the speed-ups.

- α as the paper measures it (§4.2): the target generates text on its own at the chosen sampling
  settings; at every position β = Σ min(p, q), p from the target's own decoding rows, q the
  draft's distribution there under the same settings (the draft scores the whole text in one
  call). α is the mean β over all positions of all prompts, one figure per draft and temperature
  (the paper's Table 3).
- c: one draft call over one target call, both scoring 1 token after the same context; and the
  target's cost curve T(k)/T(1) of scoring k tokens in one call (the paper assumes it is 1).
- Thm 3.8 per γ, as in the paper and with the measured T(k), next to the speed-up measured by
  running speculative and plain decoding in this process on the same prompts and seeds.

Everything returns typed data; printing and figures are the CLI's and ``plots``' business.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from .. import theory
from ..checks import check_int
from ..choices import FORM_TABLE, DrafterForm, make_policy, parse_draft, parse_gamma
from ..decode import autoregressive_generate, speculative_generate
from ..drafters import ModelDrafter
from ..models.base import LanguageModel
from ..models.recording import RecordingModel
from ..rule import acceptance_overlap
from ..sampling import SamplingParams, probs_from_logits
from ..stats import GenerationStats

Log = Callable[[str], None]
NGRAM_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


@dataclass(frozen=True)
class MeasureSettings:
    temperatures: tuple[float, ...] = (0.0, 1.0)
    max_new_tokens: int = 64
    gammas: tuple[int | str, ...] = (1, 2, 3, 4, 5, "auto")  # measured speed-ups; () skips that part
    max_gamma: int = 12  # predictions for γ = 1..max_gamma; T(k) is timed for k = 1..max(16, max_gamma + 1)
    repeats: int = 5  # timings per k (the median is kept)
    seed: int = 0

    def validate(self) -> None:
        if not self.temperatures:
            raise ValueError("temperatures is empty: give at least one temperature (e.g. 0 1)")
        for t in self.temperatures:
            SamplingParams(temperature=t)  # names a bad temperature
        check_int("max_new_tokens", self.max_new_tokens, 2)
        for g in self.gammas:
            parse_gamma(g)
        check_int("max_gamma", self.max_gamma, 1, 63)
        check_int("repeats", self.repeats)

    @property
    def ks(self) -> list[int]:
        return list(range(1, max(16, self.max_gamma + 1) + 1))


@dataclass(frozen=True)
class NamedDraft:
    name: str  # "model", "bigram (stdlib.ngram)", ...
    model: LanguageModel


@dataclass(frozen=True)
class AlphaRow:
    draft: str
    temperature: float
    alpha: float  # mean β over `positions` positions of the target's own text
    positions: int


@dataclass(frozen=True)
class DraftCost:
    draft: str
    seconds: float  # median time of one call scoring 1 token
    c: float  # seconds / the target's T(1)


@dataclass(frozen=True)
class SpeedRow:
    gamma: int
    predicted: float  # Thm 3.8 (T(k) = T(1))
    predicted_cost_curve: float  # Thm 3.8 with the measured T(k)
    measured: float | None = None  # measured speed-up over plain decoding, when γ was run


@dataclass(frozen=True)
class PolicyRun:
    gamma: str  # "auto" / "heuristic" / a fixed γ
    speedup: float
    tokens_per_second: float
    mean_gamma: float | None
    alpha: float | None  # α seen by the run itself (β of the verified positions)
    draft_call_seconds: float | None = None  # mean draft call inside the decode loop
    target_call_seconds: float | None = None  # mean target call (scoring γ + 1 tokens) inside the loop


@dataclass(frozen=True)
class SpeedTable:
    temperature: float
    draft: str
    alpha: float
    c: float
    recommended_gamma: int  # largest Thm 3.8 with the measured T(k)
    plain_tokens_per_second: float | None
    plain_call_seconds: float | None  # mean target call of plain decoding, inside its loop
    rows: tuple[SpeedRow, ...]
    runs: tuple[PolicyRun, ...]  # every measured γ and policy, in the order given


@dataclass(frozen=True)
class Measurement:
    prompts: int
    max_new_tokens: int
    context_tokens: int  # the context the call timings were taken after
    alphas: tuple[AlphaRow, ...]
    target_seconds: dict[int, float]  # k → median seconds of one target call scoring k tokens
    draft_costs: tuple[DraftCost, ...]
    speed: tuple[SpeedTable, ...] = field(default=())

    @property
    def target_cost_ratios(self) -> dict[int, float]:
        """T(k) / T(1) for every timed k."""
        return {k: t / self.target_seconds[1] for k, t in self.target_seconds.items()}

    def alpha(self, draft: str, temperature: float) -> float:
        return next(r.alpha for r in self.alphas if r.draft == draft and r.temperature == temperature)

    def as_json(self) -> dict:
        out = asdict(self)
        out["target_seconds"] = {str(k): t for k, t in self.target_seconds.items()}
        out["target_cost_ratios"] = {str(k): r for k, r in self.target_cost_ratios.items()}
        return out


def target_text(target: LanguageModel, prompt: Sequence[int], sampling: SamplingParams, max_new_tokens: int,
                seed: int, eos_token_ids: Sequence[int] = ()) -> tuple[list[int], torch.Tensor]:
    """The target's own continuation and the p it drew each token from: (tokens [n], target_probs [n, V])."""
    recorder = RecordingModel(target)
    gen = autoregressive_generate(recorder, prompt, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                                  eos_token_id=list(eos_token_ids) or None)
    rows = torch.stack(recorder.rows[: len(gen.tokens)])  # [n, vocab]
    return gen.tokens, probs_from_logits(rows, sampling)


def draft_betas(draft: LanguageModel, prompt: Sequence[int], tokens: Sequence[int], target_probs: torch.Tensor,
                sampling: SamplingParams) -> torch.Tensor:
    """β at each generated position: the draft scores prompt + text in one call. → [n]."""
    draft.prefill([])
    logits = draft.score(list(prompt) + list(tokens)[:-1])[-len(tokens):]  # [n, vocab]: row j predicts token j
    draft_probs = probs_from_logits(logits, sampling).to(device=target_probs.device, dtype=target_probs.dtype)
    return acceptance_overlap(target_probs, draft_probs)


def measure_alphas(target: LanguageModel, drafts: Sequence[NamedDraft], prompts: Sequence[Sequence[int]],
                   settings: MeasureSettings, eos_token_ids: Sequence[int] = (), log: Log = lambda m: None
                   ) -> tuple[list[AlphaRow], list[int]]:
    """α per draft and temperature; also returns the first prompt with its text (a real context)."""
    rows, context = [], []
    for temperature in settings.temperatures:
        sampling = SamplingParams(temperature=temperature)
        betas: dict[str, list[torch.Tensor]] = {d.name: [] for d in drafts}
        for i, prompt in enumerate(prompts):
            log(f"  α at temperature {temperature:g}: target text for prompt {i + 1}/{len(prompts)}")
            tokens, target_probs = target_text(target, prompt, sampling, settings.max_new_tokens,
                                               settings.seed + i, eos_token_ids)
            if not context:
                context = list(prompt) + tokens
            for d in drafts:
                betas[d.name].append(draft_betas(d.model, prompt, tokens, target_probs, sampling))
        for d in drafts:
            all_betas = torch.cat(betas[d.name])
            rows.append(AlphaRow(d.name, temperature, float(all_betas.mean()), int(all_betas.numel())))
    return rows, context


def time_calls(model: LanguageModel, context: Sequence[int], ks: Sequence[int], repeats: int) -> dict[int, float]:
    """Median seconds of one call scoring k tokens after ``context``, the cache trimmed back each time.

    One untimed pass over every k first (first calls of a shape allocate); then ``repeats``
    passes, k interleaved, so a busy moment of the machine spreads over all k.
    """
    model.prefill(list(context))
    base = model.length
    samples: dict[int, list[float]] = {k: [] for k in ks}
    for timed in [False] + [True] * repeats:
        for k in ks:
            tokens = [context[i % len(context)] for i in range(k)]
            start = time.perf_counter()
            model.score(tokens)
            elapsed = time.perf_counter() - start
            model.trim(base)
            if timed:
                samples[k].append(elapsed)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure_speed(target: LanguageModel, draft: LanguageModel, prompts: Sequence[Sequence[int]],
                  sampling: SamplingParams, settings: MeasureSettings, eos_token_ids: Sequence[int] = (),
                  log: Log = lambda m: None) -> tuple[float, float, list[PolicyRun]]:
    """Plain decoding and speculative decoding with each γ on every prompt (same seeds).

    Per prompt: plain, every γ, plain again, so a machine that gets busier or quieter during
    the runs biases no γ against the plain baseline. Returns plain tokens/s, the plain runs' mean
    target call (T(1) inside the loop) and one run per γ; a speed-up is tokens/s over plain
    tokens/s, each summed over the prompts.
    """
    common = dict(max_new_tokens=settings.max_new_tokens, sampling=sampling, eos_token_id=list(eos_token_ids) or None)
    plain: list[GenerationStats] = []
    speculative: dict[str, list[GenerationStats]] = {str(g): [] for g in settings.gammas}
    for i, prompt in enumerate(prompts):
        log(f"  speed at temperature {sampling.temperature:g}: prompt {i + 1}/{len(prompts)}")
        plain.append(autoregressive_generate(target, prompt, seed=settings.seed + i, **common).stats)
        for g in settings.gammas:
            out = speculative_generate(target, ModelDrafter(draft), prompt, gamma=make_policy(g),
                                       seed=settings.seed + i, **common)
            speculative[str(g)].append(out.stats)
        plain.append(autoregressive_generate(target, prompt, seed=settings.seed + i, **common).stats)
    plain_tps = _tokens_per_second(plain)
    runs = [_policy_run(name, stats, plain_tps) for name, stats in speculative.items()]
    return plain_tps, sum(s.target_seconds for s in plain) / sum(s.target_calls for s in plain), runs


def _tokens_per_second(stats: Sequence[GenerationStats]) -> float:
    return sum(s.new_tokens for s in stats) / sum(s.total_seconds for s in stats)


def _policy_run(name: str, stats: Sequence[GenerationStats], plain_tps: float) -> PolicyRun:
    tps = _tokens_per_second(stats)
    pooled = GenerationStats.pool(stats)
    draft_calls, target_calls = sum(s.draft_calls for s in stats), sum(s.target_calls for s in stats)
    return PolicyRun(
        name, tps / plain_tps, tps,
        mean_gamma=pooled.mean_gamma,
        alpha=pooled.alpha,
        draft_call_seconds=sum(s.draft_seconds for s in stats) / draft_calls if draft_calls else None,
        target_call_seconds=sum(s.target_seconds for s in stats) / target_calls if target_calls else None,
    )


def speed_table(temperature: float, draft: str, alpha: float, c: float, target_seconds: dict[int, float],
                settings: MeasureSettings, plain_tps: float | None, plain_call: float | None,
                runs: Sequence[PolicyRun]) -> SpeedTable:
    """Thm 3.8 per γ (as in the paper, and with the measured T(k)) next to the measured speed-ups."""
    a = min(alpha, 0.999)  # Eq. 1 needs α < 1 (a draft that always agrees under greedy decoding)
    measured = {int(r.gamma): r.speedup for r in runs if r.gamma.isdigit()}
    rows = tuple(
        SpeedRow(g, theory.expected_speedup(a, g, c), theory.expected_speedup_cost_curve(a, g, c, target_seconds),
                 measured.get(g))
        for g in range(1, settings.max_gamma + 1)
    )
    best = theory.optimal_gamma(a, c, settings.max_gamma, target_cost=target_seconds)
    return SpeedTable(temperature, draft, alpha, c, best, plain_tps, plain_call, rows, tuple(runs))


def measure(target: LanguageModel, drafts: Sequence[NamedDraft], prompts: Sequence[Sequence[int]],
            settings: MeasureSettings = MeasureSettings(), *, eos_token_ids: Sequence[int] = (),
            log: Log = lambda m: None) -> Measurement:
    """All of it. The speed-ups are measured with the first draft (which must be a model that
    ModelDrafter can draft from: any LanguageModel, n-gram tables included)."""
    settings.validate()
    if not drafts:
        raise ValueError("drafts is empty: give at least one draft to measure")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    for d in drafts:
        if d.model.vocab_size != target.vocab_size:
            raise ValueError(f"draft {d.name!r} has a vocabulary of {d.model.vocab_size} tokens, the target "
                             f"{target.vocab_size}; they must be equal (the same tokenizer)")
    log("measuring α (the target's own text, β per position) ...")
    alphas, context = measure_alphas(target, drafts, prompts, settings, eos_token_ids, log)
    if target.max_length is not None:
        context = context[: max(1, target.max_length - max(settings.ks) - 1)]
    log(f"timing target calls scoring k = 1..{max(settings.ks)} tokens after {len(context)} tokens ...")
    target_seconds = time_calls(target, context, settings.ks, settings.repeats)
    costs = []
    for d in drafts:
        seconds = time_calls(d.model, context, [1], settings.repeats)[1]
        costs.append(DraftCost(d.name, seconds, seconds / target_seconds[1]))
    tables = []
    for temperature in settings.temperatures:
        plain_tps, plain_call, runs = None, None, []
        if settings.gammas:
            plain_tps, plain_call, runs = measure_speed(target, drafts[0].model, prompts,
                                                        SamplingParams(temperature=temperature),
                                                        settings, eos_token_ids, log)
        alpha = next(r.alpha for r in alphas if r.draft == drafts[0].name and r.temperature == temperature)
        tables.append(speed_table(temperature, drafts[0].name, alpha, costs[0].c, target_seconds, settings,
                                  plain_tps, plain_call, runs))
    return Measurement(len(prompts), settings.max_new_tokens, len(context), tuple(alphas), target_seconds,
                       tuple(costs), tuple(tables))


# The drafters --drafts takes: those of specdec.choices' one table that are language models
# (α needs the draft's whole distribution q at every position; prompt lookup has none).
MEASURABLE_FORMS = tuple(form for form in FORM_TABLE
                         if form.source is not None and not form.name.startswith(("lookup", "history")))
FORM_USAGES = ", ".join(form.usage for form in MEASURABLE_FORMS)


def parse_drafts(specs: Sequence[str]) -> list[DrafterForm]:
    """--drafts values → parsed drafter specs (``specdec.choices.parse_draft``), each a language
    model: 'model', or an n-gram table file from ``specdec fit-draft`` ('ngram:FILE' any order;
    'unigram:FILE' etc. check the order). A bad one is a ValueError naming it and the forms."""
    if not specs:
        raise ValueError(f"no drafts given: give one or more of {FORM_USAGES}")
    out = []
    for spec in specs:
        try:
            parsed = parse_draft(spec)
        except ValueError as err:
            raise ValueError(f"--drafts {str(spec)!r} is invalid ({_reason(err)}); "
                             f"accepted forms: {FORM_USAGES}") from None
        if parsed.lookup or parsed.history:
            raise ValueError(f"--drafts {str(spec)!r} is invalid (prompt lookup and history have no distribution q "
                             f"to measure α with); accepted forms: {FORM_USAGES}")
        out.append(parsed)
    return out


def _reason(err: ValueError) -> str:
    """The why of parse_draft's message, without its own list of forms."""
    text = str(err)
    start, end = text.find("is invalid ("), text.rfind("); accepted forms:")
    return text[start + len("is invalid ("):end] if start >= 0 and end > start else text


def load_drafts(specs: Sequence[str], draft_model: LanguageModel | None, vocab_size: int) -> list[NamedDraft]:
    """The drafts --drafts names: the loaded draft model and n-gram tables read from their files."""
    from ..models.ngram import NgramModel

    drafts = []
    for spec in parse_drafts(specs):
        if spec.source == "model":
            if draft_model is None:
                raise ValueError("draft 'model' needs a draft model, and none is loaded")
            drafts.append(NamedDraft("model", draft_model))
            continue
        path = spec.path
        table = NgramModel.load(path, vocab_size=vocab_size)
        drafts.append(NamedDraft(f"{NGRAM_NAMES.get(table.order, f'order-{table.order} n-gram')} "
                                 f"({os.path.basename(path)})", table))
    names = [d.name for d in drafts]
    if len(set(names)) != len(names):
        raise ValueError(f"drafts {names} name the same draft twice: give each once")
    return drafts
