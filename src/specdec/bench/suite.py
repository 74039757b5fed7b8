"""The benchmark suite behind ``specdec bench``: prompts, settings, the plan, and the runs.

All modes (``specdec.bench.modes``) run in one process over the same loaded models and the same
prompts (``specdec/data/bench_prompts.json``: code writing, code editing, explanation). Each mode is
warmed up once per temperature; then, per temperature and repeat, every prompt is decoded by every
mode, the mode order rotated from one prompt to the next so that no mode always runs first (or
always right after the same neighbour). ``specdec.bench.stats`` turns the runs into the table's
figures; ``specdec.bench.report`` writes them out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from ..checks import check_int
from ..loading.settings import RUNNING_BACKENDS
from ..sampling import SamplingParams
from .modes import Mode, ModeSpec, parse_mode
from .stats import Row, RunRecord, compare_to_plain, machine_info, summarize_runs

# Rough speeds of this project's 2-core machine, used only for --dry-run's time estimate.
ESTIMATE_TOKENS_PER_SECOND = {"native": 15.0, "transformers": 5.0, "llamacpp": 10.0}
ESTIMATE_PROMPT_TOKENS_PER_SECOND = {"native": 150.0, "transformers": 150.0, "llamacpp": 150.0}
ESTIMATE_LOAD_SECONDS = {"native": 10.0, "transformers": 70.0, "llamacpp": 15.0}
ESTIMATE_TOOL_LOAD_SECONDS = 5.0  # a llamacpp-cli-* run starts a process that loads the models again
CHARS_PER_TOKEN = 3.5  # for the estimate only, before any tokenizer is loaded


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str


@dataclass(frozen=True)
class BenchSettings:
    modes: tuple[str, ...]  # modes at temperature 0 (plain is always added)
    sampling_modes: tuple[str, ...]  # modes at temperatures > 0 (plain is always added)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    backends: tuple[str, ...] = ("transformers",)
    max_new_tokens: int = 64
    repeats: int = 1
    warmup_tokens: int = 8
    seed: int = 0

    def validate(self) -> None:
        """Refuse bad values (and bad mode names) before any model is loaded."""
        for name in self.modes + self.sampling_modes:
            parse_mode(name)
        if not self.temperatures or any(not t >= 0 for t in self.temperatures) or len(set(self.temperatures)) < len(
                self.temperatures):
            raise ValueError(f"temperatures={list(self.temperatures)} is invalid: "
                             "give one or more distinct values >= 0")
        bad = [b for b in self.backends if b not in RUNNING_BACKENDS]
        if not self.backends or bad:
            raise ValueError(f"backends={list(self.backends)} is invalid: choose from {', '.join(RUNNING_BACKENDS)}")
        for field, value in (("max_new_tokens", self.max_new_tokens), ("repeats", self.repeats)):
            check_int(field, value)
        check_int("warmup_tokens", self.warmup_tokens, 0)

    def modes_at(self, temperature: float) -> list[ModeSpec]:
        names = self.modes if temperature == 0 else self.sampling_modes
        specs = [parse_mode("plain")] + [parse_mode(n) for n in names]
        return list({s.name: s for s in specs}.values())  # plain first, duplicates dropped


@dataclass(frozen=True)
class PlannedRun:
    temperature: float
    repeat: int
    prompt: BenchPrompt
    mode: str
    backend: str
    seed: int


# ------------------------------------------------------------------------------------ prompts


def load_prompts(path: str | None = None) -> list[BenchPrompt]:
    """The prompt set: the packaged one, or a JSON file of the same shape
    (``{"prompts": [{"id": ..., "category": ..., "text": ...}, ...]}``)."""
    try:
        if path is None:
            text = resources.files("specdec").joinpath("data/bench_prompts.json").read_text(encoding="utf-8")
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        prompts = [BenchPrompt(str(p["id"]), str(p["category"]), str(p["text"])) for p in json.loads(text)["prompts"]]
    except OSError as err:
        raise ValueError(f"cannot read the prompt file {path!r}: {err.strerror or err}") from err
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"prompt file {path!r} is not of the expected shape: a JSON object whose \"prompts\" is a "
                         f"list of {{\"id\", \"category\", \"text\"}} objects ({type(err).__name__}: {err})") from err
    ids = [p.id for p in prompts]
    if not prompts or len(set(ids)) != len(ids):
        raise ValueError(f"prompt file {path!r} must hold at least one prompt, each with its own id; got ids {ids}")
    return prompts


def select_prompts(prompts: Sequence[BenchPrompt], categories: Sequence[str] | None = None,
                   per_category: int | None = None) -> list[BenchPrompt]:
    known = list(dict.fromkeys(p.category for p in prompts))
    chosen = list(categories) if categories else known
    bad = [c for c in chosen if c not in known]
    if bad:
        raise ValueError(f"prompt category {bad[0]!r} is unknown: choose from {', '.join(known)}")
    if per_category is not None:
        check_int("prompts per category", per_category)
    out = []
    for category in chosen:
        out += [p for p in prompts if p.category == category][:per_category]
    return out


# --------------------------------------------------------------------------------------- plan


def plan_runs(settings: BenchSettings, prompts: Sequence[BenchPrompt]) -> list[PlannedRun]:
    """Every measured run in order: per temperature and repeat, each prompt with every mode.

    From one prompt to the next, the mode order rotates by one. With several backends, a prompt's
    runs stay grouped by backend (speed-ups compare modes of one backend, and switching engines
    less often keeps one engine's idle threads out of the other's timings); the backend order
    rotates too.
    """
    runs, turn = [], 0
    for temperature in settings.temperatures:
        keys = mode_keys(settings, temperature)
        backends = list(dict.fromkeys(b for _, b in keys))
        for repeat in range(settings.repeats):
            for prompt in prompts:
                for backend in _rotated(backends, turn):
                    group = [k for k in keys if k[1] == backend]
                    for mode, _ in _rotated(group, turn):
                        runs.append(PlannedRun(temperature, repeat, prompt, mode, backend, settings.seed + repeat))
                turn += 1
    return runs


def _rotated(items: list, shift: int) -> list:
    shift %= max(len(items), 1)
    return items[shift:] + items[:shift]


def mode_keys(settings: BenchSettings, temperature: float) -> list[tuple[str, str]]:
    """(mode, backend) for every mode at this temperature on each backend it can run on."""
    return [(s.name, b) for b in settings.backends for s in settings.modes_at(temperature) if b in s.backends]


def estimate_seconds(settings: BenchSettings, prompts: Sequence[BenchPrompt]) -> float:
    """A rough wall time for the plan, from this machine's typical speeds (for --dry-run)."""
    total = sum(ESTIMATE_LOAD_SECONDS[b] for b in settings.backends)
    runs = plan_runs(settings, prompts)
    warmups = [(b, t) for t in settings.temperatures for _, b in mode_keys(settings, t)]
    first = prompts[0] if prompts else None
    started = [r.mode for r in runs] + [m for t in settings.temperatures for m, _ in mode_keys(settings, t)]
    total += ESTIMATE_TOOL_LOAD_SECONDS * sum(parse_mode(m).kind == "llamacpp-cli" for m in started)
    for backend, tokens, prompt in [(r.backend, settings.max_new_tokens, r.prompt) for r in runs] + [
            (b, settings.warmup_tokens, first) for b, _ in warmups]:
        prompt_tokens = len(prompt.text) / CHARS_PER_TOKEN if prompt else 0
        total += (tokens / ESTIMATE_TOKENS_PER_SECOND[backend]
                  + prompt_tokens / ESTIMATE_PROMPT_TOKENS_PER_SECOND[backend])
    return total


# --------------------------------------------------------------------------------------- runs


def run_plan(plan: Sequence[PlannedRun], modes: Mapping[tuple[str, str], Mode],
             prompt_ids: Mapping[tuple[str, str], list[int]], settings: BenchSettings,
             on_run: Callable[[PlannedRun, RunRecord], None] | None = None) -> list[RunRecord]:
    """Warm every mode up, run the plan, and mark each greedy run against plain decoding.

    ``modes[(name, backend)]`` are built modes; ``prompt_ids[(backend, prompt id)]`` the encoded prompts.
    """
    warm_up(plan, modes, prompt_ids, settings)
    records = []
    for planned in plan:
        ids = prompt_ids[(planned.backend, planned.prompt.id)]
        sampling = SamplingParams(temperature=planned.temperature)
        tokens, figures = modes[(planned.mode, planned.backend)].run(ids, settings.max_new_tokens, sampling,
                                                                     planned.seed)
        record = RunRecord(planned.temperature, planned.repeat, planned.prompt.category, planned.prompt.id,
                           planned.mode, planned.backend, planned.seed, len(ids), tuple(tokens), figures)
        records.append(record)
        if on_run is not None:
            on_run(planned, record)
    return compare_to_plain(records)


def warm_up(plan, modes, prompt_ids, settings: BenchSettings) -> None:
    """One short run of each mode at each temperature, on the first prompt, not recorded."""
    if settings.warmup_tokens == 0 or not plan:
        return
    seen = dict.fromkeys((r.temperature, r.mode, r.backend) for r in plan)
    first = plan[0].prompt.id
    for temperature, mode, backend in seen:
        modes[(mode, backend)].run(prompt_ids[(backend, first)], settings.warmup_tokens,
                                   SamplingParams(temperature=temperature), settings.seed)


# ---------------------------------------------------------------------------- the whole bench


@dataclass(frozen=True)
class BenchResult:
    settings: BenchSettings
    prompts: tuple[BenchPrompt, ...]
    records: tuple[RunRecord, ...]
    rows: tuple[Row, ...]
    machine: dict
    command: str = ""
    notes: tuple[str, ...] = ()  # e.g. a backend skipped, and why


def needs_draft_model(settings: BenchSettings) -> bool:
    return any(s.needs_draft_model for t in settings.temperatures for s in settings.modes_at(t))


def usable_backends(backends: Sequence[str]) -> tuple[list[str], list[str]]:
    """(backends that can run here, a note for each one skipped)."""
    usable, notes = [], []
    for backend in backends:
        if backend == "llamacpp":
            from ..models import llamacpp

            if not llamacpp.available():
                notes.append(f"llamacpp rows skipped: llama-cpp-python is not installed ({llamacpp.INSTALL_HINT})")
                continue
        if backend == "native":
            from ..loading.backend import native_available

            why_not = native_available()
            if why_not:
                notes.append(f"native rows skipped: {why_not}")
                continue
        usable.append(backend)
    return usable, notes


def encode_prompts(pairs: Mapping[str, object], prompts: Sequence[BenchPrompt]) -> dict[tuple[str, str], list[int]]:
    """Prompt ids per (backend, prompt id), with the chat template when the tokenizer has one."""
    return {(backend, p.id): list(pair.encode(p.text, chat=bool(getattr(pair, "has_chat_template", False))))
            for backend, pair in pairs.items() for p in prompts}


def build_modes(settings: BenchSettings, pairs: Mapping[str, object]) -> dict[tuple[str, str], Mode]:
    from .modes import build_mode

    specs = {s.name: s for t in settings.temperatures for s in settings.modes_at(t)}
    keys = dict.fromkeys(k for t in settings.temperatures for k in mode_keys(settings, t))
    return {(name, backend): build_mode(specs[name], backend, pairs[backend]) for name, backend in keys}


def run_bench(settings: BenchSettings, prompts: Sequence[BenchPrompt], pairs: Mapping[str, object], *,
              command: str = "", notes: Sequence[str] = (),
              on_run: Callable[[PlannedRun, RunRecord], None] | None = None) -> BenchResult:
    """Run the whole bench on loaded pairs (``pairs[backend]``: target, draft, encode, eos_token_ids)."""
    settings.validate()
    missing = [b for b in settings.backends if b not in pairs]
    if missing:
        raise ValueError(f"no loaded model pair for backend {missing[0]!r}: pairs were given for {', '.join(pairs)}")
    if not prompts:
        raise ValueError("no prompts to run: give at least one")
    modes = build_modes(settings, pairs)
    records = run_plan(plan_runs(settings, prompts), modes, encode_prompts(pairs, prompts), settings, on_run)
    order = [parse_mode(n).name for n in settings.modes + settings.sampling_modes]
    machine = machine_info()
    if "llamacpp" in pairs and hasattr(pairs["llamacpp"].target, "threads"):
        machine["llamacpp_threads"] = list(pairs["llamacpp"].target.threads)  # (one-token, batch) calls
    return BenchResult(settings, tuple(prompts), tuple(records), tuple(summarize_runs(records, order)),
                       machine, command, tuple(notes))


def load_pairs(settings: BenchSettings, target: str | None, draft: str | None, *,
               threads: int | None = None, log: Callable[[str], None] = lambda msg: None,
               draft_head: int | None = None, kernels: str = "native",
               dequantize: bool = False) -> dict[str, object]:
    """Load the target/draft pair once per backend (the draft only when a mode needs it).

    ``target``: a --target value; ``draft``: a drafter value naming the draft model, ``model`` (the
    default draft) or ``model:PATH`` (what the CLI makes of --draft-model PATH); ``dequantize``: the native
    backend may run matrices of a type its kernels do not read as float32 copies (``LoadSettings``)."""
    from .. import session

    session.set_threads(threads)
    with_draft = needs_draft_model(settings)
    pairs = {}
    for backend in settings.backends:
        # No prefix cache: every mode reads each prompt whole, as the anchors do (a fair comparison).
        pairs[backend] = session.load(session.load_settings(
            draft, target=target, with_draft=with_draft, backend=backend, threads=threads, draft_head=draft_head,
            kernels=kernels, cache_gb=0, dequantize=dequantize), log=log)
    return pairs
