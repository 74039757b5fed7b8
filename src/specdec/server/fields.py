"""Every field a request body can carry, classified: what this server does with each, and why.

Terms: a *request body* is the JSON a client POSTs. Every field the official openai SDK can send is in
``FIELDS``, per route, as one of three kinds (docs/request-fields.md is that table in words, with the test of
each; tests/test_request_fields.py holds the SDK's list, the doc and the server to it):

- *honoured*: done as OpenAI does, within the limits ``schema.ACCEPTED`` states (a value outside them is a 400
  naming the field);
- *ignored*: accepted and without effect, because it changes nothing in the answer (who asks, how OpenAI would
  bill, cache or keep it: ``user``, ``metadata``, ``prompt_cache_key``, ...); a value that asks for more than
  this server does (``store`` true, ``service_tier`` flex) is refused as below;
- *refused*: not implemented; any value but the one that asks for nothing (``NEUTRAL``: ``n`` 1, a penalty 0, no
  ``audio``, ...) is a 400 naming the field, code ``unsupported``: a client never gets silently other behaviour.

Other servers' request fields (vLLM's, llama.cpp's ``llama-server``'s) that would change the answer there are
``OTHER_SERVERS``: refused as a refused field is (a 400 naming it, code ``unsupported``, the message saying what to
send instead), but for the value that asks for nothing (``repetition_penalty`` 1, ``ignore_eos`` false, ...).
Fields in neither table are ignored, as some clients send a few of their own. ``unsupported`` finds the first
field of a body that asks for what this server does not do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

HONOURED, IGNORED, REFUSED = "honoured", "ignored", "refused"
EXTRAS = ("speculative", "top_k", "min_p")  # ours: no OpenAI SDK sends them but through extra_body
# Every field of a request body, per route, by kind (the module's docstring says what each kind means). The keys
# are exactly the fields of ChatRequest and CompletionRequest; docs/request-fields.md lists the same, with the test
# that holds each one (tests/test_request_fields.py checks both, and fails on a field a newer SDK sends that is
# not here).
_SHARED = {
    "model": HONOURED, "max_tokens": HONOURED, "temperature": HONOURED, "top_p": HONOURED, "seed": HONOURED,
    "stop": HONOURED, "stream": HONOURED, "stream_options": HONOURED, "logprobs": HONOURED,
    "n": REFUSED, "presence_penalty": REFUSED, "frequency_penalty": REFUSED, "logit_bias": REFUSED,
    "user": IGNORED,
    "speculative": HONOURED, "top_k": HONOURED, "min_p": HONOURED,
}
FIELDS = {
    "chat": _SHARED | {
        "messages": HONOURED, "max_completion_tokens": HONOURED, "top_logprobs": HONOURED,
        "response_format": HONOURED, "tools": HONOURED, "tool_choice": HONOURED, "parallel_tool_calls": HONOURED,
        "functions": REFUSED, "function_call": REFUSED, "audio": REFUSED, "modalities": REFUSED,
        "moderation": REFUSED, "reasoning_effort": REFUSED, "verbosity": REFUSED, "web_search_options": REFUSED,
        "metadata": IGNORED, "prediction": IGNORED, "prompt_cache_key": IGNORED, "prompt_cache_options": IGNORED,
        "prompt_cache_retention": IGNORED, "safety_identifier": IGNORED, "service_tier": IGNORED, "store": IGNORED,
    },
    "completions": _SHARED | {
        "prompt": HONOURED, "response_format": HONOURED,  # response_format: ours here (the SDK sends it for chat)
        "echo": REFUSED, "suffix": REFUSED, "best_of": REFUSED,
    },
}


def _absent(value) -> bool:
    return value is None


def _zero(value) -> bool:
    return value is None or (not isinstance(value, bool) and value == 0)


# A refused field (and an ignored one that could ask for more): (is this value the one that asks for nothing,
# the value accepted in words, why no other is). Checked in this order; the first found is the 400's param.
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "functions": (_absent, "null", "deprecated by OpenAI; declare tools and use tool_choice"),
    "function_call": (_absent, "null", "deprecated by OpenAI; declare tools and use tool_choice"),
    "n": (lambda v: v in (None, 1), "1", "one choice per request (send n requests, each with its own seed)"),
    "presence_penalty": (_zero, "0", "penalties are not implemented (they would change the target's distribution)"),
    "frequency_penalty": (_zero, "0", "penalties are not implemented (they would change the target's distribution)"),
    "logit_bias": (lambda v: not v, "{} or null", "logit biases are not implemented (they would change the target's "
                   "distribution)"),
    "audio": (_absent, "null", "this server writes text only, no audio"),
    "modalities": (lambda v: v is None or v == ["text"], '["text"] or null', "this server writes text only"),
    "moderation": (_absent, "null", "this server runs no moderation"),
    "reasoning_effort": (_absent, "null", "this server cannot steer a model's reasoning"),
    "verbosity": (_absent, "null", "this server cannot steer a model's verbosity"),
    "web_search_options": (_absent, "null", "this server searches no web"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "'auto', 'default' or null",
                     "this server has one tier"),
    "store": (lambda v: v is not True, "false or null", "this server stores no answers"),
    "echo": (lambda v: v is not True, "false or null", "echoing the prompt is not implemented"),
    "suffix": (lambda v: not v, "an empty string or null", "suffix (insertion) is not implemented"),
    "best_of": (lambda v: v in (None, 1), "1 or null", "one candidate per request"),
}


def _one(value) -> bool:
    return value is None or (not isinstance(value, bool) and value == 1)


def _false(value) -> bool:
    return value is None or value is False


def _true(value) -> bool:
    return value is None or value is True


def _empty(value) -> bool:
    return value is None or (isinstance(value, list | dict | str) and not value)


def _equals(*values) -> Callable[[Any], bool]:
    """None, or one of ``values`` (numbers compared as numbers, never a bool)."""
    return lambda v: v is None or (not isinstance(v, bool) and any(v == x for x in values))


class Other(NamedTuple):
    """A field of another server's API: whose, the values that ask for nothing (in words too), what to do instead.
    ``tunes``: the fields it only tunes (a sampler's parameter): when the body sends them and they ask for
    nothing, any value of this one is accepted as well (it changes nothing there either)."""

    server: str
    neutral: Callable[[Any], bool]
    accepted: str
    why: str
    tunes: tuple[str, ...] = ()


VLLM, LLAMA, BOTH = "vLLM", "llama.cpp", "vLLM and llama.cpp"
_PENALTY = "repetition penalties are not implemented (they would change the target's distribution)"
_SAMPLER = "is not implemented (the sampler here: temperature, top_k, top_p, min_p)"
_GRAMMAR = ("a grammar is not accepted over this API (the server builds its own from response_format and tools); "
            "for JSON send response_format {type: json_schema, json_schema: {name, schema}} or {type: json_object}")
_JSON = "send response_format {type: json_schema, json_schema: {name, schema}} instead"
# Another server's request field that would change the answer there, by name: a 400 naming it unless its value asks
# for nothing (tests/test_request_fields.py sends each, and each neutral value; docs/request-fields.md lists them).
# A field of our own request models (echo on completions, logit_bias) is checked by NEUTRAL instead.
OTHER_SERVERS: dict[str, Other] = {
    # what the answer is made of: other servers' grammars
    "guided_json": Other(VLLM, _absent, "null", _JSON),
    "guided_regex": Other(VLLM, _absent, "null", "regular-expression constraints are not accepted over this API; "
                          "send response_format json_schema {type: string, pattern} (the answer is then a JSON "
                          "string matching it)"),
    "guided_choice": Other(VLLM, _absent, "null", "send response_format json_schema with {\"enum\": [...]} "
                           "(the answer is then one of them, as a JSON string)"),
    "guided_grammar": Other(VLLM, _absent, "null", _GRAMMAR),
    "guided_decoding_backend": Other(VLLM, _absent, "null", "constraints here are llguidance's only: leave it out"),
    "guided_whitespace_pattern": Other(VLLM, _absent, "null", "JSON here is laid out as json.dumps writes it "
                                       "(\", \" and \": \"): leave it out"),
    "structured_outputs": Other(VLLM, _absent, "null", _JSON),
    "grammar": Other(LLAMA, _empty, "null or an empty string", _GRAMMAR),
    "json_schema": Other(LLAMA, _absent, "null", _JSON),
    # how long the answer is, where it ends
    "n_predict": Other(LLAMA, _absent, "null", "send max_tokens instead"),
    "min_tokens": Other(VLLM, _equals(0), "0 or null", "a minimum length is not implemented: the answer ends where "
                        "the model ends it (or at max_tokens)"),
    "ignore_eos": Other(BOTH, _false, "false or null", "the answer always ends at the model's end of generation; "
                        "set max_tokens for its length"),
    "stop_token_ids": Other(VLLM, _empty, "[] or null", "send stop strings (stop) instead"),
    "include_stop_str_in_output": Other(VLLM, _false, "false or null", "a stop string is cut from the answer, as "
                                        "OpenAI does"),
    "t_max_predict_ms": Other(LLAMA, _equals(0), "0 or null", "an answer is not cut by time: set max_tokens"),
    "n_indent": Other(LLAMA, _equals(0), "0 or null", "a minimum indentation is not implemented"),
    # how the next token is drawn
    "repetition_penalty": Other(VLLM, _one, "1 or null", _PENALTY),
    "repeat_penalty": Other(LLAMA, _one, "1 or null", _PENALTY),
    "repeat_last_n": Other(LLAMA, _equals(0, 64), "0, 64 or null (or any with repeat_penalty 1)", _PENALTY,
                           ("repeat_penalty",)),
    "penalty_last_n": Other(LLAMA, _equals(0, 64), "0, 64 or null (or any with repeat_penalty 1)", _PENALTY,
                            ("repeat_penalty",)),
    "penalize_nl": Other(LLAMA, _false, "false or null (or any with repeat_penalty 1)", _PENALTY,
                        ("repeat_penalty",)),
    "dry_multiplier": Other(LLAMA, _equals(0), "0 or null", "DRY " + _SAMPLER),
    "dry_base": Other(LLAMA, _equals(1.75), "1.75 or null (or any with dry_multiplier 0)", "DRY " + _SAMPLER,
                      ("dry_multiplier",)),
    "dry_allowed_length": Other(LLAMA, _equals(2), "2 or null (or any with dry_multiplier 0)", "DRY " + _SAMPLER,
                                ("dry_multiplier",)),
    "dry_penalty_last_n": Other(LLAMA, _equals(-1, 0, 64), "-1, 0, 64 or null (or any with dry_multiplier 0)",
                                "DRY " + _SAMPLER, ("dry_multiplier",)),
    "dry_sequence_breakers": Other(LLAMA, lambda v: v is None or v == ["\n", ":", '"', "*"],
                                   'null or ["\\n", ":", "\\"", "*"] (or any with dry_multiplier 0)',
                                   "DRY " + _SAMPLER, ("dry_multiplier",)),
    "xtc_probability": Other(LLAMA, _equals(0), "0 or null", "XTC " + _SAMPLER),
    "xtc_threshold": Other(LLAMA, _equals(0.1), "0.1 or null (or any with xtc_probability 0)", "XTC " + _SAMPLER,
                           ("xtc_probability",)),
    "mirostat": Other(LLAMA, _equals(0), "0 or null", "Mirostat " + _SAMPLER),
    "mirostat_tau": Other(LLAMA, _equals(5), "5 or null (or any with mirostat 0)", "Mirostat " + _SAMPLER,
                          ("mirostat",)),
    "mirostat_eta": Other(LLAMA, _equals(0.1), "0.1 or null (or any with mirostat 0)", "Mirostat " + _SAMPLER,
                          ("mirostat",)),
    "typical_p": Other(LLAMA, _one, "1 or null", "locally typical sampling " + _SAMPLER),
    "tfs_z": Other(LLAMA, _one, "1 or null", "tail-free sampling " + _SAMPLER),
    "top_n_sigma": Other(LLAMA, lambda v: v is None or (not isinstance(v, bool) and isinstance(v, int | float)
                                                        and v <= 0), "a number <= 0 or null",
                         "top-n-sigma " + _SAMPLER),
    "dynatemp_range": Other(LLAMA, _equals(0), "0 or null", "dynamic temperature " + _SAMPLER),
    "dynatemp_exponent": Other(LLAMA, _one, "1 or null (or any with dynatemp_range 0)",
                               "dynamic temperature " + _SAMPLER, ("dynatemp_range",)),
    "min_keep": Other(LLAMA, _equals(0), "0 or null", "a sampler's minimum of tokens kept is not implemented"),
    "samplers": Other(LLAMA, _absent, "null", "the sampler chain here is fixed (top_k, top_p, min_p, temperature)"),
    "use_beam_search": Other(VLLM, _false, "false or null", "beam search is not implemented"),
    "length_penalty": Other(VLLM, _one, "1 or null (or any with use_beam_search false)",
                            "beam search is not implemented", ("use_beam_search",)),
    "early_stopping": Other(VLLM, _false, "false or null (or any with use_beam_search false)",
                            "beam search is not implemented", ("use_beam_search",)),
    "bad_words": Other(VLLM, _empty, "[] or null", "banned words are not implemented"),
    "allowed_token_ids": Other(VLLM, _absent, "null", "a token allow-list is not implemented; for a fixed set of "
                               "answers send response_format json_schema with an enum"),
    "logits_processors": Other(VLLM, _empty, "[] or null", "logits processors are not implemented"),
    "lora": Other(LLAMA, _empty, "[] or null", "LoRA adapters are not implemented"),
    "n_cmpl": Other(LLAMA, _one, "1 or null", "one choice per request (send several requests, each with its own "
                    "seed)"),
    # what the answer carries beside its text
    "n_probs": Other(LLAMA, _equals(0), "0 or null", "send logprobs (chat: logprobs true and top_logprobs; "
                     "completions: logprobs, the alternatives per token) instead"),
    "post_sampling_probs": Other(LLAMA, _false, "false or null", "log-probabilities here are the target's raw ones "
                                 "(logprobs)"),
    "prompt_logprobs": Other(VLLM, _absent, "null", "the prompt's log-probabilities are not returned"),
    "return_tokens_as_token_ids": Other(VLLM, _false, "false or null", "tokens are returned as text"),
    "skip_special_tokens": Other(VLLM, _true, "true or null", "special tokens are always left out of the text"),
    "spaces_between_special_tokens": Other(VLLM, _true, "true or null (or any with skip_special_tokens true)",
                                           "special tokens are left out of the text", ("skip_special_tokens",)),
    "reasoning_format": Other(LLAMA, lambda v: v is None or v == "none", "'none' or null",
                              "the reply's reasoning is not split out: it stays in the text (as 'none')"),
    # what the prompt is
    "truncate_prompt_tokens": Other(VLLM, _absent, "null", "a prompt is never cut: one longer than the context is a "
                                    "400"),
    "chat_template": Other(VLLM, _absent, "null", "the model's own chat template renders every conversation"),
    "chat_template_kwargs": Other(BOTH, _empty, "{} or null", "the chat template gets no variables but the "
                                  "messages and tools"),
    "add_generation_prompt": Other(VLLM, _true, "true or null", "the reply always starts a new assistant turn"),
    "continue_final_message": Other(VLLM, _false, "false or null", "continuing the last assistant message is not "
                                    "implemented: the reply starts a new assistant turn"),
    "echo": Other(VLLM, _false, "false or null", "echoing the prompt is not implemented"),
    "documents": Other(BOTH, _empty, "[] or null", "documents are not rendered into the prompt: put them in the "
                       "messages"),
}


def shown(value) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


def unsupported(ours: dict[str, Any], others: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first field set to something this server cannot honour, else None. ``ours``: the
    body's values of the ``NEUTRAL`` fields its route has (a missing one is null); ``others``: the body's
    ``OTHER_SERVERS`` fields, as sent."""
    for name, (neutral, accepted, why) in NEUTRAL.items():
        value = ours.get(name)
        if not neutral(value):
            return name, f"{name}={shown(value)} is not supported: {why}; accepted: {accepted}"
    for name, other in OTHER_SERVERS.items():  # in the table's order: a sampler before its parameters
        if name not in others:
            continue
        value = others[name]
        moot = other.tunes and all(t in others and OTHER_SERVERS[t].neutral(others[t]) for t in other.tunes)
        if not (other.neutral(value) or moot):
            return name, (f"{name}={shown(value)} ({other.server}'s field) is not supported: {other.why}; "
                          f"accepted: {other.accepted}")
    return None
