"""Tool calls through the real chat templates of Llama 3.1, 3.2 and 3.3 Instruct and Qwen3 (and Qwen2.5 Instruct's),
end to end: the format chosen from the template, the tools and a call's history as the template renders them, the
model's calls as that family writes them read back (whole and at every split), the call grammar taking them token
by token, and the official openai client getting them back from ``specdec serve`` on a scripted pair.

The files, none downloaded here: llama.cpp's source tree ships the chat templates of many models
(``models/templates/*.jinja``, as their Hugging Face repositories have them) and vocabulary-only GGUF files
(``models/ggml-vocab-*.gguf``); llama-cpp-python's source distribution vendors that tree, and ``bash
scripts/setup.sh test`` keeps it in the specdec cache (as ``tests/test_tokenizer_llamacpp.py`` reads it). The
files are extracted once into ``<cache>/llama.cpp-tools`` (the vocabularies where that module puts them, so both
share the converted tokenizers). Without that file these tests skip naming the command, and fail when
``SPECDEC_REQUIRE_REAL`` is set. Llama 3.3's template is Llama 3.1's, byte for byte (asserted); 3.2's differs
(today's date from ``strftime_now``, no built-in tools).

The tokenizers (:func:`family_tokenizer`), llama.cpp's vocabularies as each family's tokenizer has them:

- Llama 3.1-3.3: ``ggml-vocab-llama-bpe.gguf`` is Llama 3's byte-level BPE with Llama 3.0's names for its special
  tokens; Llama 3.1 renamed three of the reserved ones (128004 ``<|finetune_right_pad_id|>``, 128008
  ``<|eom_id|>``, 128010 ``<|python_tag|>``), renamed here the same way. A generation ends at ``<|end_of_text|>``,
  ``<|eom_id|>`` or ``<|eot_id|>`` (Llama 3.1 Instruct's ``generation_config.json``).
- Qwen3 (and Qwen2.5): ``ggml-vocab-qwen2.gguf`` is Qwen2's BPE padded to 151,936 ids with ``[PAD…]`` tokens;
  Qwen2.5 and Qwen3 put their added tokens at 151646-151668 (Qwen3's ``tokenizer_config.json``): the vision and
  box markers special, ``<tool_call>``, ``</tool_call>``, the FIM markers, ``<tool_response>``,
  ``</tool_response>``, ``<think>`` and ``</think>`` not. A generation ends at ``<|im_end|>`` or ``<|endoftext|>``.

The server decodes the generated ids with ``skip_special_tokens`` (``ModelPair.decode``): Llama's
``<|python_tag|>`` and ``<|eom_id|>`` never reach the call parser, Qwen's ``<tool_call>`` and ``<think>`` (not
special) do. The parser tests feed it that text, as the server does.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import tarfile
from dataclasses import dataclass

import openai
import pytest
from test_tool_calls import ARGS, SEARCH, TOOLS, WEATHER
from tool_pair import scripted_pair

from specdec.cache import cache_dir, write_atomic
from specdec.grammar import Grammar
from specdec.loading.chat import chat_prompt_ids, special_strings
from specdec.sampling import SamplingParams
from specdec.server import ServeConfig, create_app
from specdec.server.runner import ServerThread
from specdec.server.schema import ChatRequest
from specdec.server.tool_parser import CallArgs, CallStart, Content, read_calls
from specdec.server.tools import HERMES, LLAMA3, ToolFormat, call_grammar, tool_format_of
from specdec.session import RunSettings

SETUP = "bash scripts/setup.sh test"  # downloads llama-cpp-python's source distribution into the cache
TEMPLATES = {  # our name → the file in llama.cpp's models/templates
    "llama-3.1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama-3.2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "llama-3.3": "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct.jinja",
}
QWEN3_ADDED = ([(t, True) for t in ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                                    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                                    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")]
               + [(t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                                       "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                       "<tool_response>", "</tool_response>", "<think>", "</think>")])


@dataclass(frozen=True)
class Family:
    vocab: str  # llama.cpp's vocabulary file
    renamed: dict  # id → (the family's token text, special)
    bos: str | None
    eos: tuple[str, ...]  # the tokens that end a generation; the first is the tokenizer's EOS
    opening: str  # what the template's generation prompt ends with: the reply follows it
    format: ToolFormat
    result_marker: str  # in a prompt whose history has a tool's result


LLAMA = Family("llama-bpe", {128004: ("<|finetune_right_pad_id|>", True), 128008: ("<|eom_id|>", True),
                             128010: ("<|python_tag|>", True)}, "<|begin_of_text|>",
               ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), "<|start_header_id|>assistant<|end_header_id|>\n\n",
               LLAMA3, "<|start_header_id|>ipython<|end_header_id|>")
QWEN = Family("qwen2", {151646 + i: added for i, added in enumerate(QWEN3_ADDED)}, None,
              ("<|im_end|>", "<|endoftext|>"), "<|im_start|>assistant\n", HERMES, "<tool_response>")
FAMILY = {"llama-3.1": LLAMA, "llama-3.2": LLAMA, "llama-3.3": LLAMA, "qwen3": QWEN, "qwen2.5": QWEN}

HISTORY = [{"role": "user", "content": "Weather in Lisbon?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 18}'}]
# The calls as each family writes them (Llama 3.1's prompt: {"name": function name, "parameters": dictionary of
# argument name and its value}; Qwen's: <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n
# </tool_call>), and as the templates write them in the history.
LLAMA_CALL = '{"name": "get_weather", "parameters": ' + ARGS + "}"
QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>"
QWEN_CALL2 = '<tool_call>\n{"name": "search", "arguments": {"q": "Lisbon {weather}"}}\n</tool_call>'
THINKING = "<think>\nThe user wants the weather in Lisbon, in celsius: get_weather gives it.\n</think>"
ANSWER = "It is 18 °C in Lisbon right now."


# ----------------------------------------------------------------------------- the files

def _unavailable(why: str):
    if os.environ.get("SPECDEC_REQUIRE_REAL"):
        pytest.fail(f"SPECDEC_REQUIRE_REAL is set but {why}")
    pytest.skip(why)


def _sdist() -> pathlib.Path | None:
    """llama-cpp-python's source distribution in the cache: the installed binding's version, else the newest (the
    rule of tests/test_tokenizer_llamacpp.py)."""
    folder = cache_dir() / "llama.cpp-tools" / "sdist"
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
        return found[-1] if found else None
    path = folder / f"llama_cpp_python-{version}.tar.gz"
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def models() -> dict[str, pathlib.Path]:
    """Each file these tests read (``templates/….jinja``, ``ggml-vocab-….gguf``) → its path, extracted once from
    the source distribution's ``vendor/llama.cpp/models`` in one pass over the archive."""
    sdist = _sdist()
    if sdist is None:
        _unavailable(f"llama-cpp-python's source distribution is not in {cache_dir() / 'llama.cpp-tools' / 'sdist'} "
                     f"({SETUP} downloads it)")
    version = sdist.name[len("llama_cpp_python-"):-len(".tar.gz")]
    tools = cache_dir() / "llama.cpp-tools"
    wanted = {f"templates/{name}": tools / f"templates-{version}" / name for name in TEMPLATES.values()}
    for family in (LLAMA, QWEN):  # with their test files, as test_tokenizer_llamacpp extracts them
        for ext in ("", ".inp", ".out"):
            name = f"ggml-vocab-{family.vocab}.gguf{ext}"
            wanted[name] = tools / f"vocab-{version}" / name
    missing = {member for member, path in wanted.items() if not path.is_file()}
    if missing:
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/models/"
        with tarfile.open(sdist) as tar:
            for info in tar:
                member = info.name[len(prefix):] if info.name.startswith(prefix) else None
                if member in missing:
                    data = tar.extractfile(info).read()
                    wanted[member].parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(wanted[member], lambda f, data=data: f.write(data))
        absent = sorted(m for m in missing if not wanted[m].is_file())
        assert not absent, f"{sdist} has no vendor/llama.cpp/models/{absent}"
    return wanted


def template_text(models, name: str) -> str:
    return models[f"templates/{TEMPLATES[name]}"].read_text(encoding="utf-8")


_BASES: dict[str, tuple] = {}  # vocabulary → (the GGUF file's tokenizer, the family's backend)


def family_tokenizer(models, family: Family):
    """The family's tokenizer backend (``tokenizers.Tokenizer``): llama.cpp's vocabulary with the family's token
    names; and the file's own tokenizer (specdec's reading)."""
    from tokenizers import Tokenizer

    from specdec.loading.tokenizer import gguf_tokenizer

    if family.vocab not in _BASES:
        base = gguf_tokenizer(str(models[f"ggml-vocab-{family.vocab}.gguf"]))
        data = json.loads(base.backend_tokenizer.to_str())
        vocab, added = data["model"]["vocab"], {e["id"]: e for e in data["added_tokens"]}
        for i, (text, special) in family.renamed.items():
            entry = added[i]
            assert entry["content"].startswith(("<|reserved_special_token_", "[PAD")), entry  # a free slot
            del vocab[entry["content"]]
            vocab[text] = i
            entry["content"], entry["special"] = text, special
        _BASES[family.vocab] = base, Tokenizer.from_str(json.dumps(data))
    return _BASES[family.vocab]


def tokenizer_for(models, name: str):
    """A transformers tokenizer of the template ``name``'s family, with that template."""
    from transformers import PreTrainedTokenizerFast

    family = FAMILY[name]
    special = {"bos_token": family.bos} if family.bos else {}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=family_tokenizer(models, family)[1], eos_token=family.eos[0],
                                        **special)
    tokenizer.chat_template = template_text(models, name)
    return tokenizer


@pytest.fixture(scope="module")
def tokenizers(models):
    """Template name → its tokenizer, built once per template text (Llama 3.3's is 3.1's: one tokenizer, so that
    the server's llguidance view of it is built once)."""
    made: dict[str, object] = {}

    def get(name: str):
        key = (FAMILY[name].vocab, template_text(models, name))
        if key not in made:
            made[key] = tokenizer_for(models, name)
        return made[key]

    return get


def test_the_tokenizers_are_the_files_with_the_families_token_names(models, tokenizers):
    assert template_text(models, "llama-3.3") == template_text(models, "llama-3.1")
    assert template_text(models, "llama-3.2") != template_text(models, "llama-3.1")
    llama, qwen = tokenizers("llama-3.1"), tokenizers("qwen3")
    assert [llama.convert_tokens_to_ids(t) for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|eom_id|>",
                                                     "<|eot_id|>", "<|python_tag|>")] == [
        128000, 128006, 128008, 128009, 128010]
    assert [qwen.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                                                    "<think>", "</think>")] == [
        151645, 151657, 151658, 151665, 151667, 151668]
    assert {"<|python_tag|>", "<|eom_id|>", "<|eot_id|>"} <= set(special_strings(llama))
    assert "<|im_start|>" in special_strings(qwen) and not {"<tool_call>", "<think>"} & set(special_strings(qwen))
    text = 'Größere {"name": "x", "parameters": {}}\n\n  def f():\n\treturn 1  # 我们 <|im_end|><|eot_id|>'
    for name, tokenizer in (("llama-3.1", llama), ("qwen3", qwen)):
        base = family_tokenizer(models, FAMILY[name])[0]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == base(text, add_special_tokens=False)["input_ids"] and tokenizer.decode(ids) == text


# ----------------------------------------------------------------------------- the format, the rendered prompt

@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_format_is_chosen_from_the_real_template(tokenizers, name):
    found, why = tool_format_of(tokenizers(name))
    assert found is FAMILY[name].format, why


def rendered(tokenizer, messages, tools=TOOLS) -> tuple[str, list[int]]:
    """The prompt as the server makes it: the history through ``template_messages`` (arguments parsed)."""
    ids = chat_prompt_ids(tokenizer, ChatRequest(messages=messages).template_messages(), tools=tools)
    return tokenizer.decode(ids), ids


def llama_system(date: str) -> str:
    return ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
            f"Date: December 2023\nToday Date: {date}\n\n<|eot_id|>")


LLAMA_TOOLS_TURN = ("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
                    "JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
                    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
                    'value}.Do not use variables.\n\n')
LLAMA_HISTORY = ("Weather in Lisbon?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" + LLAMA_CALL
                 # a string result is "iterable" to Jinja: Meta's template writes it as a JSON string
                 + '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"{\\"celsius\\": 18}"<|eot_id|>'
                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
QWEN_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
              "function signatures within <tools></tools> XML tags:\n<tools>\n" + json.dumps(WEATHER) + "\n"
              + json.dumps(SEARCH) + "\n</tools>\n\nFor each function call, return a json object with function name "
              "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
              "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
QWEN_HISTORY = ("<|im_start|>user\nWeather in Lisbon?<|im_end|>\n<|im_start|>assistant\n" + QWEN_CALL
                + '<|im_end|>\n<|im_start|>user\n<tool_response>\n{"celsius": 18}\n</tool_response><|im_end|>\n'
                "<|im_start|>assistant\n")


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_real_template_renders_the_tools_and_a_call_s_history(tokenizers, name):
    """Every character of the prompt: the tools' schemas as the template writes them (Llama: in the first user turn,
    ``tojson(indent=4)``), the history's call with its arguments as a JSON object (the server parses the client's
    string: given the string, Llama's template would write it quoted, as a JSON string), the tool's result."""
    tokenizer = tokenizers(name)
    text, ids = rendered(tokenizer, HISTORY)
    if FAMILY[name] is LLAMA:
        date = "26 Jul 2024" if name != "llama-3.2" else re.search(r"Today Date: (\d\d \w{3} \d{4})\n", text)[1]
        tools = "".join(json.dumps(t, indent=4) + "\n\n" for t in TOOLS)
        assert text == llama_system(date) + LLAMA_TOOLS_TURN + tools + LLAMA_HISTORY
        assert ids.count(tokenizer.convert_tokens_to_ids("<|eot_id|>")) == 4  # each a token of its own
    else:
        system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n" if name == "qwen2.5" else ""
        assert text == "<|im_start|>system\n" + system + QWEN_TOOLS + QWEN_HISTORY
        assert ids.count(tokenizer.convert_tokens_to_ids("<tool_call>")) == 3  # the system prompt names it twice


@pytest.mark.parametrize("name", ["llama-3.1", "llama-3.2", "qwen3"])
def test_the_history_s_call_reads_back_as_the_same_call(tokenizers, name):
    """The call as the template wrote it in the history, read by the format's parser: the same name and arguments
    (the model sees its calls written so, and writes its next ones alike)."""
    family = FAMILY[name]
    text, _ = rendered(tokenizers(name), HISTORY)
    turn = text.split(family.opening)[1]
    turn = turn[:turn.index(family.eos[0])]
    content, calls = read_calls(family.format.parser(["get_weather", "search"]), turn)
    assert content is None and names_args(calls) == [("get_weather", ARGS)]


def test_llama_s_template_refuses_two_calls_in_one_turn_and_qwen3_s_renders_them(tokenizers):
    two = [HISTORY[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
        for i in range(2)]}]
    with pytest.raises(Exception, match="only supports single tool-calls"):
        rendered(tokenizers("llama-3.1"), two)
    assert "\n</think>\n\n" + QWEN_CALL + "\n" + QWEN_CALL + "<|im_end|>\n" in rendered(tokenizers("qwen3"), two)[0]


# ----------------------------------------------------------------------------- the model's calls, read

def names_args(calls):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


LLAMA_REPLIES = [  # (the model's tokens as text, content, calls)
    (LLAMA_CALL + "<|eot_id|>", None, [("get_weather", ARGS)]),
    ("<|python_tag|>" + LLAMA_CALL + "<|eom_id|>", None, [("get_weather", ARGS)]),
    ('{"name": "get_weather", "parameters": {"city": "Lisbon"}}<|eom_id|>', None,
     [("get_weather", '{"city": "Lisbon"}')]),
    ('<|python_tag|>{"name": "search", "parameters": {"q": "a \\"quoted\\" {brace}"}}<|eot_id|>', None,
     [("search", '{"q": "a \\"quoted\\" {brace}"}')]),
    (ANSWER + "<|eot_id|>", ANSWER, []),
    ('Call {"name": "get_weather", "parameters": {}} later.<|eot_id|>',
     'Call {"name": "get_weather", "parameters": {}} later.', []),
]
QWEN_REPLIES = [
    (QWEN_CALL + "<|im_end|>", None, [("get_weather", ARGS)]),
    (THINKING + "\n\n" + QWEN_CALL + "<|im_end|>", THINKING, [("get_weather", ARGS)]),
    ("<think>\n\n</think>\n\n" + QWEN_CALL + "<|im_end|>", "<think>\n\n</think>", [("get_weather", ARGS)]),
    (THINKING + "\n\n" + QWEN_CALL + "\n" + QWEN_CALL2 + "<|im_end|>", THINKING,
     [("get_weather", ARGS), ("search", '{"q": "Lisbon {weather}"}')]),
    (THINKING + "\n\n" + ANSWER + "<|im_end|>", THINKING + "\n\n" + ANSWER, []),
]
REPLIES = [("llama-3.1", *r) for r in LLAMA_REPLIES] + [("qwen3", *r) for r in QWEN_REPLIES]


def events_of(parser, pieces):
    """(content, calls) from the events of ``pieces`` fed one by one, checking the events' order as a client would."""
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.close()
    content, calls = "", []
    for event in events:
        if isinstance(event, Content):
            content += event.text
        elif isinstance(event, CallStart):
            assert event.index == len(calls)
            calls.append((event.name, ""))
        else:
            assert isinstance(event, CallArgs) and event.text and event.index == len(calls) - 1
            calls[-1] = (calls[-1][0], calls[-1][1] + event.text)
    return (None if calls and not content else content), calls


@pytest.mark.parametrize("name, reply, content, calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_the_family_s_calls_are_read_whole_token_by_token_and_at_every_split(tokenizers, name, reply, content,
                                                                             calls):
    tokenizer, family = tokenizers(name), FAMILY[name]
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)  # what the server's parser is fed
    assert "<|python_tag|>" not in text and "<|eom_id|>" not in text and "<|im_end|>" not in text

    def parser():
        return family.format.parser(["get_weather", "search"])

    got_content, got_calls = read_calls(parser(), text)
    assert (got_content, names_args(got_calls)) == (content, calls)
    pieces, sent = [], ""
    for i in range(1, len(ids) + 1):  # a token at a time, as the server streams (half a character held back)
        now = tokenizer.decode(ids[:i], skip_special_tokens=True).rstrip("\ufffd")
        assert now.startswith(sent)
        pieces.append(now[len(sent):])
        sent = now
    assert sent == text and events_of(parser(), pieces) == (content, calls)
    for i in range(len(text) + 1):
        assert events_of(parser(), [text[:i], text[i:]]) == (content, calls), i
    assert events_of(parser(), list(text)) == (content, calls)


# ----------------------------------------------------------------------------- the call grammar

def eos_ids(tokenizer, family: Family) -> list[int]:
    return sorted(tokenizer.convert_tokens_to_ids(t) for t in family.eos)  # as scripted_pair has them


def accepts(tokenizer, family: Family, grammar: str, text: str) -> bool:
    """Does ``grammar`` take the tokens of ``text`` (the model's, special-token text as those tokens) and then an
    end of generation? Through specdec.grammar, as the server builds it (its llguidance tokenizer is cached)."""
    eos = eos_ids(tokenizer, family)
    matcher = Grammar(grammar, tokenizer, len(tokenizer), eos).matcher
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids(family.eos[0])
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting() and matcher.consume_token(end)


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("name", ["llama-3.1", "qwen3"])
def test_the_call_grammar_takes_the_call_as_the_model_writes_it(tokenizers, name):
    tokenizer, family = tokenizers(name), FAMILY[name]
    history_call = LLAMA_CALL if family is LLAMA else QWEN_CALL  # the history's, as test_the_real_template_... has it

    def ok(choice, text, parallel=True):
        return accepts(tokenizer, family, call_grammar(TOOLS, choice, parallel, family.format.name), text)

    for choice in ("required", NAMED, "auto"):
        assert ok(choice, history_call), choice
        assert not ok(choice, history_call.replace('"Lisbon"', "7")), choice  # city: a string
        assert not ok(choice, history_call.replace("get_weather", "get_time")), choice  # no such tool
        assert not ok(choice, history_call.replace(", ", ",")), choice  # the template's layout
    assert ok("auto", ANSWER) and not ok("required", ANSWER)
    if family is QWEN:
        assert tokenizer.convert_tokens_to_ids("<tool_call>") in tokenizer(QWEN_CALL)["input_ids"]
        assert ok("required", QWEN_CALL + "\n" + QWEN_CALL2) and not ok("required", QWEN_CALL + "\n" + QWEN_CALL2,
                                                                        False)
        assert ok("auto", "Let me check.\n" + QWEN_CALL)
    else:
        assert ok("required", '{"name": "search", "parameters": {"q": "x"}}')


# ----------------------------------------------------------------------------- through the server

SERVED = ["llama-3.1", "llama-3.2", "llama-3.3", "qwen3"]
DEFAULTS = RunSettings(gamma=3, max_new_tokens=96, sampling=SamplingParams(temperature=0.0), seed=None)
PROMPT = [{"role": "user", "content": "What is the weather like in Lisbon right now, in celsius?"}]


@dataclass
class Served:
    name: str
    family: Family
    client: openai.OpenAI
    pair: object
    script: dict  # "call": the reply to a prompt without a tool's result


@pytest.fixture(scope="module", params=SERVED)
def served_module(request, tokenizers):
    name = request.param
    family = FAMILY[name]
    default = LLAMA_CALL if family is LLAMA else QWEN_CALL
    script = {"call": default, "default": default}

    def reply_for(prompt: str) -> str:
        return ANSWER if family.result_marker in prompt else script["call"]

    pair = scripted_pair(reply_for, tokenizers(name), opening=family.opening, end=family.eos[0], eos=family.eos)
    config = ServeConfig(model_names=(name,), defaults=DEFAULTS)
    with ServerThread(create_app(config, pair=pair)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=60, max_retries=0)
        yield Served(name, family, client, pair, script)


@pytest.fixture
def served(served_module):
    yield served_module
    served_module.script["call"] = served_module.script["default"]


def ask(served: Served, stream: bool, **fields):
    """(content, [(name, arguments)], finish_reason) of a reply, whole or reassembled from its stream."""
    body = {"model": served.name, "messages": PROMPT, "tools": TOOLS} | fields
    if not stream:
        choice = served.client.chat.completions.create(**body).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls or [])
        return choice.message.content, calls, choice.finish_reason
    chunks = list(served.client.chat.completions.create(stream=True, **body))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content, calls = "".join(d.content or "" for d in deltas), []
    for d in deltas:
        for call in d.tool_calls or []:
            if call.id is not None:  # a call's first delta: its index, id, type, name and arguments ""
                assert call.index == len(calls) and call.type == "function" and call.function.arguments == ""
                calls.append((call.function.name, ""))
            else:
                assert call.index == len(calls) - 1 and call.function.name is None
                calls[-1] = (calls[-1][0], calls[-1][1] + call.function.arguments)
    return content or None, calls, chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["auto", "required", NAMED], ids=["auto", "required", "named"])
def test_the_family_s_call_comes_back_as_tool_calls(served, stream, choice):
    """``required`` and a named function are constrained by the call grammar: the scripted model's tokens must be
    the ones the grammar allows, or its reply would be other tokens."""
    content, calls, finish = ask(served, stream, tool_choice=choice)
    assert (content, calls, finish) == (None, [("get_weather", ARGS)], "tool_calls")
    prompt = served.pair.target.prompts[-1]
    if served.family is LLAMA:
        assert LLAMA_TOOLS_TURN + json.dumps(WEATHER, indent=4) in prompt
    else:
        assert json.dumps(WEATHER) + "\n" + json.dumps(SEARCH) in prompt


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_family_s_own_way_of_calling_comes_back_as_tool_calls(served, stream):
    """Llama 3.1: ``<|python_tag|>`` before the call and ``<|eom_id|>`` after it (special tokens: not in the
    text, and ``<|eom_id|>`` ends the generation); Qwen3: its thinking first (kept as the content)."""
    if served.family is LLAMA:
        served.script["call"] = "<|python_tag|>" + LLAMA_CALL + "<|eom_id|>"
        want = None
    else:
        served.script["call"] = THINKING + "\n\n" + QWEN_CALL
        want = THINKING
    assert ask(served, stream) == (want, [("get_weather", ARGS)], "tool_calls")


def test_a_call_its_result_and_the_answer(served):
    r = served.client.chat.completions.create(model=served.name, messages=PROMPT, tools=TOOLS)
    message = r.choices[0].message
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": '{"celsius": 18}'}
    answer = served.client.chat.completions.create(model=served.name, tools=TOOLS, messages=PROMPT + [
        message.model_dump(exclude_none=True), result])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content == ANSWER
    assert not answer.choices[0].message.tool_calls
    prompt = served.pair.target.prompts[-1]
    if served.family is LLAMA:
        assert prompt.endswith(PROMPT[0]["content"] + "<|eot_id|>" + LLAMA_HISTORY.split("<|eot_id|>", 1)[1])
    else:
        assert prompt.endswith(QWEN_HISTORY.replace("Weather in Lisbon?", PROMPT[0]["content"]))


def test_qwen3_s_thinking_goes_back_into_its_history(served):
    if served.family is not QWEN:
        pytest.skip("Qwen3's template")
    served.script["call"] = THINKING + "\n\n" + QWEN_CALL
    message = served.client.chat.completions.create(model=served.name, messages=PROMPT, tools=TOOLS).choices[0].message
    assert message.content == THINKING
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": '{"celsius": 18}'}
    served.client.chat.completions.create(model=served.name, tools=TOOLS, messages=PROMPT + [
        message.model_dump(exclude_none=True), result])
    assert served.pair.target.prompts[-1].endswith(
        "<|im_start|>assistant\n" + THINKING + "\n\n" + QWEN_HISTORY.split("<|im_start|>assistant\n", 1)[1])


def test_llama_s_refusal_of_two_calls_in_the_history_is_a_400(served):
    if served.family is not LLAMA:
        pytest.skip("Llama 3's template")
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
             for i in range(2)]
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.chat.completions.create(model=served.name, tools=TOOLS, messages=PROMPT + [
            {"role": "assistant", "tool_calls": calls}])
    assert caught.value.body["param"] == "messages" and "single tool-calls" in caught.value.body["message"]
