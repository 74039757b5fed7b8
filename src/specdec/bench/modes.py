"""The ways of decoding that ``specdec bench`` compares, each behind one small interface.

A mode has a ``name``, the ``backend`` its models run on, and
``run(prompt_ids, max_new_tokens, sampling, seed) -> (tokens, RunFigures)``: it decodes one
prompt and reports what it measured. Every mode times only its own decoding call (prompt
reading included), so the figures compare like for like:

- ``plain``: our ``autoregressive_generate`` on the target;
- ``DRAFTER:GAMMA``: our ``speculative_generate`` with a drafter from ``choices.make_drafter``
  (``model``, ``lookup``, ``lookup+model``, ``ngram:FILE`` …) and a γ policy from
  ``choices.make_policy`` (an integer, ``auto``, ``heuristic`` …); a fresh drafter and policy per run;
- ``hf-plain``, ``hf-assisted``, ``hf-lookup[:N]``: transformers' own ``generate`` on the same torch
  modules our ``HFModel`` wraps: plain, with ``assistant_model`` (its default settings), and with
  its prompt lookup (``prompt_lookup_num_tokens=N``, default 10);
- ``llamacpp-own-plain``: llama-cpp-python's own generation loop on the same GGUF file;
- ``llamacpp-cli-plain``, ``llamacpp-cli-spec[:N]``, ``llamacpp-cli-lookup[:N]``: llama.cpp's own
  command-line tools (llama-completion, llama-speculative with the draft model, llama-lookup) on
  the same GGUF files, one process per run, timed by their own printed timings
  (``specdec.bench.llamacpp_cli``).

``parse_mode`` checks a name before any model is loaded and lists the accepted forms when it is bad.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .. import choices
from ..decode import Generation, autoregressive_generate, speculative_generate
from ..loading.settings import RUNNING_BACKENDS
from ..sampling import SamplingParams
from .figures import RunFigures

BACKENDS = RUNNING_BACKENDS  # the backends a mode may run on
HF_LOOKUP_DEFAULT_TOKENS = 10  # transformers' docs use 10 candidate tokens for prompt lookup
ACCEPTED_FORMS = (
    "plain | hf-plain | hf-assisted | hf-lookup[:N] | llamacpp-own-plain | llamacpp-cli-plain | "
    "llamacpp-cli-spec[:N] | llamacpp-cli-lookup[:N] | DRAFTER:GAMMA, where DRAFTER is "
    "a --draft drafter (e.g. model, lookup, lookup+model, ngram:FILE) and GAMMA an integer >= 1 or a γ "
    "policy (e.g. auto, heuristic); e.g. model:3, lookup:auto, lookup+model:auto"
)


class Mode(Protocol):
    name: str
    backend: str

    def run(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
            seed: int) -> tuple[list[int], RunFigures]: ...


@dataclass(frozen=True)
class ModeSpec:
    """A checked mode name: what kind of mode it is and the backends it can run on."""

    name: str
    kind: str  # "plain" | "ours" | "hf" | "llamacpp-own" | "llamacpp-cli"
    backends: tuple[str, ...]
    drafter: str | None = None  # ours: the drafter form
    gamma: str | None = None  # ours: the γ form
    lookup_tokens: int | None = None  # hf-lookup: prompt_lookup_num_tokens

    @property
    def drafts(self) -> bool:
        """False for the plain-decoding baselines (plain, hf-plain, llamacpp-own-plain, llamacpp-cli-plain)."""
        return self.kind == "ours" or self.name.startswith(("hf-assisted", "hf-lookup", "llamacpp-cli-spec",
                                                            "llamacpp-cli-lookup"))

    @property
    def needs_draft_model(self) -> bool:
        if self.kind == "ours":
            return choices.needs_draft_model(self.drafter)
        return self.name == "hf-assisted" or self.name.startswith("llamacpp-cli-spec")


def parse_mode(name: str) -> ModeSpec:
    """Check a mode name (no models needed); ValueError naming the accepted forms if it is bad."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"mode {name!r} is invalid: accepted forms are {ACCEPTED_FORMS}")
    name = name.strip()
    if name == "plain":
        return ModeSpec(name, "plain", BACKENDS)
    if name in ("hf-plain", "hf-assisted"):
        return ModeSpec(name, "hf", ("transformers",))
    if name == "hf-lookup" or name.startswith("hf-lookup:"):
        count = name.partition(":")[2] or str(HF_LOOKUP_DEFAULT_TOKENS)
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"mode {name!r} is invalid: hf-lookup:N needs an integer N >= 1 (candidate tokens); "
                             f"accepted forms are {ACCEPTED_FORMS}")
        return ModeSpec(f"hf-lookup:{int(count)}", "hf", ("transformers",), lookup_tokens=int(count))
    if name == "llamacpp-own-plain":
        return ModeSpec(name, "llamacpp-own", ("llamacpp",))
    if name.startswith("llamacpp-cli-"):
        from .llamacpp_cli import parse_cli_mode

        try:
            return ModeSpec(parse_cli_mode(name)[0], "llamacpp-cli", ("native", "llamacpp"))
        except ValueError as err:
            raise ValueError(f"{err}; accepted forms are {ACCEPTED_FORMS}") from err
    drafter, sep, gamma_spec = name.rpartition(":")
    if not sep or not drafter or not gamma_spec:
        raise ValueError(f"mode {name!r} is invalid: accepted forms are {ACCEPTED_FORMS}")
    try:
        gamma_value = choices.parse_gamma(gamma_spec)
        draft = choices.parse_draft(drafter)
    except ValueError as err:
        raise ValueError(f"mode {name!r} is invalid: {err}; accepted forms are {ACCEPTED_FORMS}") from err
    if draft.source == "model" and draft.path is not None:
        raise ValueError(f"mode {name!r} is invalid: the bench loads one draft model (its --draft-model option), so a "
                         f"drafter names it as 'model', not {draft.path!r}; accepted forms are {ACCEPTED_FORMS}")
    return ModeSpec(f"{drafter}:{gamma_value}", "ours", BACKENDS, drafter=drafter, gamma=str(gamma_value))


def build_mode(spec: ModeSpec, backend: str, pair) -> Mode:
    """The runnable mode for a checked spec, on a loaded pair of that backend."""
    if backend not in spec.backends:
        raise ValueError(f"mode {spec.name!r} runs on the {' or '.join(spec.backends)} backend, not {backend!r}")
    if spec.needs_draft_model and getattr(pair, "draft", None) is None:
        raise ValueError(f"mode {spec.name!r} needs a draft model, but the {backend} pair was loaded without one")
    if spec.kind == "plain":
        return PlainMode(spec.name, backend, pair)
    if spec.kind == "ours":
        return SpeculativeMode(spec.name, backend, pair, spec.drafter, spec.gamma)
    if spec.kind == "hf":
        return HFGenerateMode(spec.name, pair, assisted=spec.name == "hf-assisted", lookup_tokens=spec.lookup_tokens)
    if spec.kind == "llamacpp-cli":
        from .llamacpp_cli import LlamaCppToolMode

        return LlamaCppToolMode(spec.name, pair, backend)
    return LlamaCppOwnPlainMode(spec.name, pair)


class PlainMode:
    """Our plain decoding loop: one target call per token."""

    def __init__(self, name: str, backend: str, pair) -> None:
        self.name, self.backend, self.pair = name, backend, pair

    def run(self, prompt_ids, max_new_tokens, sampling, seed):
        gen = autoregressive_generate(self.pair.target, prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                      seed=seed, eos_token_id=self.pair.eos_token_ids)
        return gen.tokens, run_figures(gen)


class SpeculativeMode:
    """Our speculative decoding with one drafter form and one γ form (fresh drafter and policy per run)."""

    def __init__(self, name: str, backend: str, pair, drafter_spec: str, gamma_spec: str) -> None:
        self.name, self.backend, self.pair = name, backend, pair
        self.drafter_spec, self.gamma_spec = drafter_spec, gamma_spec
        self._new_drafter()  # fail now (e.g. a missing n-gram file), not in the middle of a long run

    def run(self, prompt_ids, max_new_tokens, sampling, seed):
        gen = speculative_generate(self.pair.target, self._new_drafter(), prompt_ids, max_new_tokens=max_new_tokens,
                                   gamma=choices.make_policy(self.gamma_spec), sampling=sampling, seed=seed,
                                   eos_token_id=self.pair.eos_token_ids)
        return gen.tokens, run_figures(gen)

    def _new_drafter(self):
        target = self.pair.target
        return choices.make_drafter(self.drafter_spec, draft_model=self.pair.draft, vocab_size=target.vocab_size,
                                     device=target.device)


def run_figures(gen: Generation) -> RunFigures:
    """The bench's record of one of our generations (rounds counted only where it drafted; β positions
    kept, to pool α over runs)."""
    s = gen.stats
    return RunFigures(seconds=s.total_seconds, target_calls=s.target_calls, rounds=s.rounds if s.drafted else 0,
                      drafted=s.drafted, accepted=s.accepted, alpha=s.alpha,
                      verified=sum(len(r.betas) for r in s.records), prefill_seconds=s.prefill_seconds,
                      draft_seconds=s.draft_seconds, target_seconds=s.target_seconds)


class HFGenerateMode:
    """transformers' ``generate`` on the target's torch module: plain, assisted, or prompt lookup.

    Target calls are counted with a forward hook. The assistant's generation config is restored
    after every run, so each run starts from transformers' defaults (some of its settings, like
    the ``heuristic`` schedule, are documented to carry over between calls).
    """

    backend = "transformers"

    def __init__(self, name: str, pair, *, assisted: bool = False, lookup_tokens: int | None = None) -> None:
        if not hasattr(pair.target, "model") or not hasattr(pair.target.model, "generate"):
            raise ValueError(f"mode {name!r} needs a transformers target (a model with .generate)")
        self.name, self.pair, self.assisted, self.lookup_tokens = name, pair, assisted, lookup_tokens

    def run(self, prompt_ids, max_new_tokens, sampling, seed):
        model = self.pair.target.model
        eos = list(self.pair.eos_token_ids)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy, eos_token_id=eos or None,
                      pad_token_id=eos[0] if eos else 0)
        if not sampling.greedy:
            kwargs |= dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                           min_p=sampling.min_p or None)
        assistant = self.pair.draft.model if self.assisted else None
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        if self.lookup_tokens is not None:
            kwargs["prompt_lookup_num_tokens"] = self.lookup_tokens
        saved_config = copy.deepcopy(assistant.generation_config) if assistant is not None else None
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.pair.target.device)  # [1, n]
        calls = [0]
        hook = model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
        torch.manual_seed(seed)  # transformers samples from torch's global generator
        try:
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)  # [1, n + new]
            seconds = time.perf_counter() - start
        finally:
            hook.remove()
            if assistant is not None:
                assistant.generation_config = saved_config
        tokens = out[0, input_ids.shape[1]:].tolist()
        return tokens, RunFigures(seconds=seconds, target_calls=calls[0])


class LlamaCppOwnPlainMode:
    """llama-cpp-python's own token loop (``Llama.generate``) on the target's GGUF file.

    A ``Llama`` of its own is loaded from the same file with the same context size, batch and
    threads as our backend's target; its other settings are llama-cpp-python's defaults (what a
    user of it gets). Its prompt cache is reset before every run, so each run reads its prompt.
    """

    backend = "llamacpp"

    def __init__(self, name: str, pair) -> None:
        target = pair.target
        if not hasattr(target, "path") or not hasattr(target, "threads"):
            raise ValueError(f"mode {name!r} needs a llama.cpp target (the llamacpp backend)")
        from llama_cpp import Llama

        n_threads, n_threads_batch = target.threads
        self.llama = Llama(model_path=target.path, n_ctx=target.max_length, n_batch=target.n_batch,
                           n_ubatch=target.n_batch, n_threads=n_threads, n_threads_batch=n_threads_batch,
                           verbose=False)
        self.name, self.pair = name, pair

    def run(self, prompt_ids, max_new_tokens, sampling, seed):
        stop = set(self.pair.eos_token_ids)
        self.llama.set_seed(seed)
        self.llama.reset()
        tokens: list[int] = []
        start = time.perf_counter()
        for token in self.llama.generate(list(prompt_ids), **_llama_sampling(sampling)):
            tokens.append(int(token))
            if token in stop or len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return tokens, RunFigures(seconds=seconds, target_calls=len(tokens))


def _llama_sampling(sampling: SamplingParams) -> dict:
    """llama.cpp's sampler settings for our SamplingParams (temp 0 = greedy; no penalties)."""
    if sampling.greedy:
        return dict(temp=0.0, repeat_penalty=1.0)
    return dict(temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                repeat_penalty=1.0)
