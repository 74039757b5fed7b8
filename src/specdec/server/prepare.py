"""From a validated request body to a ready :class:`SequenceRun`: model name, prompt ids, settings.

Terms: the *defaults* are the server's ``RunSettings`` (from ``specdec serve``'s options); a
request overrides the fields it sets. A *per-request drafter* may be any ``--draft`` form that
names no file (``model``, ``lookup``, ``lookup+model``) or exactly the server's own; a client never
makes the server open a path, nor look at one: every other value gets one and the same refusal,
whatever it names and whether that exists (``choices.parse_fileless_draft``). Every refusal is
an :class:`ApiError` naming the field at fault. The OpenAI routes and the explorer's live view both
prepare their requests here. A chat request's tools are its ``tools.ToolPlan`` (``tool_plan``): the template
renders them, and ``plan.grammar`` is the grammar its reply must follow.
"""

from __future__ import annotations

import dataclasses

from ..choices import FILELESS_FORMS, parse_fileless_draft, parse_gamma
from ..drafters.history_table import HistoryView
from ..grammar import GrammarError, LazyGrammar, check_ends, json_object_grammar, json_schema_grammar, lark_grammar
from ..sampling import SamplingParams
from ..session import RunSettings
from .engine.runs import SequenceRun
from .errors import ApiError
from .schema import ACCEPTED, ChatRequest, CompletionRequest, SamplingFields
from .text import Texts
from .tools import ToolPlan, tool_plan


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def check_model(body: SamplingFields, names: tuple[str, ...]) -> None:
    if body.model is not None and body.model not in names:
        raise ApiError(404, f"model {body.model!r} does not exist here: this server serves "
                       f"{', '.join(repr(n) for n in names)}", param="model", code="model_not_found")


def check_supported(body: SamplingFields) -> None:
    unsupported = body.unsupported()
    if unsupported is not None:
        raise bad(unsupported[0], unsupported[1], code="unsupported")


def logprobs_of(body: ChatRequest | CompletionRequest) -> int | None:
    """The alternatives per token a request asks for with its log-probabilities, or None (none asked)."""
    if isinstance(body, ChatRequest) and body.top_logprobs is not None and not body.logprobs:
        raise bad("top_logprobs", f"top_logprobs={body.top_logprobs} needs logprobs true; accepted: "
                  f"{ACCEPTED['top_logprobs']}")
    return body.logprob_count()


def sampling_of(body: SamplingFields, default: SamplingParams) -> SamplingParams:
    top_k = default.top_k if body.top_k is None else max(body.top_k, 0)
    chosen = {"temperature": body.temperature, "top_p": body.top_p, "min_p": body.min_p}
    values = {k: getattr(default, k) if v is None else v for k, v in chosen.items()}
    try:
        return SamplingParams(top_k=top_k, **values)
    except ValueError as err:
        raise bad(str(err).split("=", 1)[0], str(err)) from None


MAX_SHOWN = 120  # characters of a refused value quoted back to the client


def shown(value: str) -> str:
    """``value`` quoted for an error message (``repr``: escapes and all), cut when long."""
    return repr(value) if len(value) <= MAX_SHOWN else f"{value[:MAX_SHOWN]!r}… ({len(value)} characters)"


def draft_of(body: SamplingFields, default: str, has_draft_model: bool) -> str:
    """The request's drafter: the server's own ``--draft`` (exactly), or a form that names no file."""
    asked = body.speculative.draft if body.speculative and body.speculative.draft is not None else None
    if asked is None or asked.strip() == default.strip():
        return default
    form = parse_fileless_draft(asked)  # compares names only: never a path looked at on a client's word
    if form is None:
        raise bad("speculative.draft", f"speculative.draft={shown(asked)} is refused: a request may choose "
                  f"{', '.join(FILELESS_FORMS)} or the server's own --draft, never a file or a path")
    if form.needs_draft_model and not has_draft_model:
        modelless = ", ".join(f for f in FILELESS_FORMS if not parse_fileless_draft(f).needs_draft_model)
        raise bad("speculative.draft", f"speculative.draft={shown(asked)} needs a draft model, and this server "
                  f"has none loaded; accepted here: {modelless}")
    return form.text.strip()


def gamma_of(body: SamplingFields, default: int | str) -> int | str:
    asked = body.speculative.gamma if body.speculative and body.speculative.gamma is not None else None
    if asked is None:
        return default
    try:
        gamma = parse_gamma(asked)
    except ValueError:
        gamma = None
    if gamma is None:  # parse_gamma refuses γ above choices.MAX_GAMMA too
        value = shown(asked) if isinstance(asked, str) else repr(asked)
        raise bad("speculative.gamma", f"speculative.gamma={value} is invalid; accepted: {ACCEPTED['gamma']}")
    return gamma


def prompt_ids(body: ChatRequest | CompletionRequest, texts: Texts, vocab_size: int,
               tools: ToolPlan | None = None) -> list[int]:
    param = "messages" if isinstance(body, ChatRequest) else "prompt"
    try:
        if isinstance(body, ChatRequest):  # the template renders the plan's tools (none: tool_choice none)
            ids = texts.chat_ids(body.template_messages(), tools=list(tools.tools) if tools else None)
        elif isinstance(body.prompt, str):
            ids = texts.raw_ids(body.prompt)
        elif isinstance(body.prompt[0], str):
            ids = texts.raw_ids(body.prompt[0])
        else:
            ids = list(body.prompt)
    except ValueError as err:  # text the tokenizer refuses (the toy pair knows eight words)
        raise bad(param, f"{param}: {err}") from None
    except Exception as err:  # the chat template refuses the conversation (roles out of order, say)
        raise bad(param, f"{param}: the chat template refused them: {type(err).__name__}: {err}") from None
    if not ids:
        raise bad(param, f"{param} is empty: it must give at least one token", code="empty_prompt")
    wrong = next((t for t in ids if not 0 <= t < vocab_size), None)
    if wrong is not None:
        raise bad(param, f"prompt token id {wrong} is outside the vocabulary: ids must be in [0, {vocab_size - 1}]")
    return ids


def token_budget(body: ChatRequest | CompletionRequest, default: int, prompt_length: int, context: int | None) -> int:
    """max_tokens as asked; without one, the server's default cut to the context that is left."""
    param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    asked = body.limit()
    if context is not None and prompt_length + (asked or 1) > context:
        raise bad(param if asked else "messages" if isinstance(body, ChatRequest) else "prompt",
                  f"the prompt has {prompt_length} tokens and {param}={asked or 1}: together they exceed the "
                  f"model's context of {context} tokens (prompt + {param} must be <= {context})",
                  code="context_length_exceeded")
    if asked is not None:
        return asked
    return default if context is None else min(default, context - prompt_length)


def answer_schema(body: ChatRequest | CompletionRequest) -> dict | None:
    """The JSON schema ``response_format`` asks the answer to match (``json_object``: any object); None for text."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None:
        raise bad("response_format", "response_format type json_schema needs a json_schema object "
                  "({\"name\": ..., \"schema\": {...}})", code="invalid_grammar")
    return fmt.json_schema.schema_


def grammar_of(body: ChatRequest | CompletionRequest, tools=None) -> str | LazyGrammar | None:
    """The grammar the reply must follow (None: free text), an ApiError naming a bad one:

    - ``tool_choice`` ``required`` or a named function: the reply is calls of the declared tools, their arguments
      matching the tools' schemas (``response_format`` then has no text answer to shape);
    - ``auto`` with ``response_format``: either the format's JSON or calls;
    - ``auto``: free text, and a call constrained from where it is recognised: the call marker, or a call that
      opens the reply once its name is written (a :class:`LazyGrammar`: no mask before);
    - no tools: ``response_format``'s (JSON matching the schema, any JSON object), or None."""
    schema = answer_schema(body)
    try:
        check_ends(schema, "the schema")
    except GrammarError as err:
        raise bad("response_format", f"response_format: {err}", code="invalid_grammar") from None
    try:
        if tools is not None and tools.grammar is not None:
            if tools.choice != "auto":
                return lark_grammar(tools.grammar)
            if schema is not None:
                return lark_grammar(tools.with_answer(schema))
            tagged = tools.format.style == "tagged"  # a marker anywhere (Qwen's); every format: a leading call
            return LazyGrammar(lark_grammar(tools.grammar), tagged=lark_grammar(tools.calls) if tagged else None,
                               trigger=tools.format.marker if tagged else None, leading=lark_grammar(tools.leading),
                               commit=tools.commit, openers=tools.format.openers)
    except GrammarError as err:
        raise bad("tools", f"tools: {err}", code="invalid_grammar") from None
    if schema is None:
        return None
    try:
        return json_object_grammar() if schema == {"type": "object"} else json_schema_grammar(schema)
    except GrammarError as err:
        raise bad("response_format", f"response_format: {err}", code="invalid_grammar") from None


def call_window(defaults: int | None, calls: int | None) -> int | None:
    """The prompt tokens a draft model reads for a reply that must be tool calls: the narrower of the server's
    draft window and its call window (None: all the prompt, the wider)."""
    if calls is None:
        return defaults
    return calls if defaults is None else min(defaults, calls)


def declaration_length(body: ChatRequest | CompletionRequest, texts: Texts, ids: list[int],
                       tools: ToolPlan | None) -> int:
    """The prompt tokens that declare the tools: those before the part that the prompt rendered with the tools and
    rendered without them end with alike (the conversation). A draft model skips them: a call's names and keys are
    the grammar's, on q as on p, and its values come from the conversation; a request that must be calls and one
    that may be of the same conversation then start their draft at the same token and share its prefix cache.
    0 without tools (or when the template refuses the conversation without them)."""
    if tools is None or not isinstance(body, ChatRequest) or not texts.has_chat_template:
        return 0
    try:
        bare = texts.chat_ids(body.template_messages())
    except Exception:  # a template that needs its tools: the draft reads them
        return 0
    same = 0  # the tokens both end with
    while same < min(len(ids), len(bare)) and ids[-1 - same] == bare[-1 - same]:
        same += 1
    return len(ids) - same


def prepare(body: ChatRequest | CompletionRequest, pair, texts: Texts, defaults: RunSettings,
            names: tuple[str, ...], history: HistoryView | None = None,
            call_draft_window: int | None = None) -> SequenceRun:
    """The request's sequence run, every value checked; an ApiError names the first bad field. ``history``: the
    request's tenant's view of the server's history table, which keeps its text once it finishes.
    ``call_draft_window``: the prompt tokens a draft model reads when the reply must be tool calls (``tool_choice``
    ``required`` or a named function: a short reply whose structure the grammar gives, on q as on p; None: the
    server's draft window)."""
    check_model(body, names)
    check_supported(body)
    logprobs = logprobs_of(body)
    sampling = sampling_of(body, defaults.sampling)
    draft = draft_of(body, defaults.draft, pair.draft is not None)
    gamma = gamma_of(body, defaults.gamma)
    tools = tool_plan(body, texts, body.model or names[0])  # tools.grammar: the grammar its reply needs, or None
    ids = prompt_ids(body, texts, pair.target.vocab_size, tools)
    budget = token_budget(body, defaults.max_new_tokens, len(ids), pair.target.max_length)
    seed = body.seed if body.seed is not None else defaults.seed
    # OpenAI's seed: the same request with the same seed gives the same answer. So a sampled request that gives its
    # own seed is reproducible (its γ from its own rounds only, never from time or load); the server's default seed
    # is not a client's promise, and a greedy request's tokens do not depend on γ: both keep the load-aware γ.
    reproducible = body.seed is not None and not sampling.greedy
    grammar = grammar_of(body, tools)
    calls_only = grammar is not None and tools is not None and tools.choice != "auto"  # the reply is calls
    window = call_window(defaults.draft_window, call_draft_window) if calls_only else defaults.draft_window
    settings = dataclasses.replace(defaults, sampling=sampling, draft=draft, gamma=gamma, max_new_tokens=budget,
                                   seed=seed, reproducible=reproducible, grammar=grammar, logprobs=logprobs,
                                   draft_window=window, draft_start=declaration_length(body, texts, ids, tools))
    try:
        return SequenceRun(pair, ids, settings, history=history)
    except GrammarError as err:
        raise bad("tools" if tools is not None and tools.grammar else "response_format", str(err),
                  code="invalid_grammar") from None
    except ValueError as err:
        context = "context" in str(err)
        param = ("messages" if isinstance(body, ChatRequest) else "prompt") if context else None
        raise bad(param, str(err), code="context_length_exceeded" if context else "invalid_value") from None
