"""Our GGUF tokenizers (``specdec.loading.tokenizer``: transformers' reading, corrected) against llama.cpp's.

The files: the vocabulary-only GGUF files that ship in llama.cpp's source tree (``vendor/llama.cpp/models`` in
llama-cpp-python's source distribution, which ``bash scripts/setup.sh test`` keeps in the specdec cache, in
``<cache>/llama.cpp-tools/sdist``), extracted once into ``<cache>/llama.cpp-tools/vocab-<version>``: Llama 3's
byte-level BPE (``llama-bpe``), Llama 2's SentencePiece (``llama-spm``) and Qwen2's BPE (``qwen2``, Qwen3's
too); and the Gemma 3 270M file of ``specdec[gemma3]`` (``slow``: its 262,144-token vocabulary).

Two references:

1. llama.cpp's ``llama_tokenize`` through the installed ``llama_cpp`` package (llama-cpp-python, the same
   llama.cpp source; ``bash scripts/setup.sh llamacpp``), called as llama.cpp's ``llama-tokenize`` tool calls
   it: BOS as llama.cpp's rule for the file says a prompt gets one, special tokens parsed (the two gave the
   same ids on every sample and expected-ids text of the three vocabularies, so the 20-minute tool build is
   not needed): the ids of a fixed sample (English, German with umlauts, Vietnamese, Chinese, Japanese,
   emoji, Python code with indentation, tabs and backslashes, runs of spaces and newlines (some longer than
   the longest space token), digits), the
   samples joined by the EOS token's text (so each sample is also read right after a special token);
2. the expected ids that llama.cpp's own ``test-tokenizer-0`` checks (``ggml-vocab-*.gguf.inp/.out``, 46
   texts each, no BOS, no special tokens): needs only the source distribution.

And the text ``specdec bench`` hands llama.cpp's tools for a prompt reads back as that prompt; the chat
template is the file's own (``tokenizer.chat_template``) or none. A missing source distribution,
llama-cpp-python or Gemma 3 package is a skip naming the command that provides it, a failure when
``SPECDEC_REQUIRE_REAL`` is set (``scripts/test.sh`` installs all three).
"""

from __future__ import annotations

import json
import os
import pathlib
import tarfile

import pytest

from specdec.bench.llamacpp_cli import tool_prompt
from specdec.cache import cache_dir, derived_dir, write_atomic
from specdec.loading import tokenizer as tk
from specdec.loading import zoo
from specdec.native.gguf_file import GGUFFile

VOCABS = ("llama-bpe", "llama-spm", "qwen2")
SETUP_VOCABS = "bash scripts/setup.sh test"  # downloads llama-cpp-python's source distribution into the cache
SETUP_LLAMACPP = "bash scripts/setup.sh llamacpp"  # builds and installs llama-cpp-python
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file (test-tokenizer-0.cpp)
SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it? I'd say we'll see.",
    "german": "Größere Übungen für Bäcker: Äpfel, Öl und süße Brötchen, Straße, Maß und Fuß.",
    "vietnamese": "Cửa Việt là một thị trấn ven biển.",
    "chinese": "我们今天去北京的图书馆看书，然后吃饺子。",
    "japanese": "東京は日本の首都です。ひらがなとカタカナ、漢字を使います。",
    "emoji": "Launch 🚀 today! 👍🏽 family: 👨‍👩‍👧‍👦 flags 🇩🇪🇯🇵 ❤️",
    "code": ("def f(x):\n    if x > 0:\n\treturn x  # a tab\n        return -x\n\n\nclass A:\n    s = 'a\\tb\\n'\n"
             "    def g(self):\n        pass\n"),
    "whitespace": "a  b   c    d\n\n\n  e\t\tf \n \n   ",
    "digits": "12345 678901 3.14159 1,000,000 0x1F 2024-01-01 99999999",
    "leading space": " hello world",
    # decomposed accents (e + U+0301, A + U+030A): llama.cpp does not normalize them, nor must we (transformers'
    # Qwen2Tokenizer, rebuilt from the vocabulary, added an NFC normalizer and read them as the composed letters)
    "decomposed": "cafe\u0301 A\u030a ne\u0301e",
    # runs longer than Gemma 3's longest space token (31 spaces, a user-defined token): llama.cpp cuts them
    # 31 + 2, transformers' reading cut them 16 + 17 (Python's textwrap.py read as 2 tokens more)
    "space runs": ("x" + " " * 33 + "= [a,  b]\n" + " " * 64 + "return   y\n\n\n\n" + "\t" * 3 + "z" + " " * 31
                   + "<table><td>w</td></table>  \n"),
}


def _unavailable(why: str):
    if os.environ.get("SPECDEC_REQUIRE_REAL"):
        pytest.fail(f"SPECDEC_REQUIRE_REAL is set but {why}")
    pytest.skip(why)


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        _unavailable(f"llama-cpp-python is not installed ({SETUP_LLAMACPP})")
    return llama_cpp


def _sdist() -> pathlib.Path | None:
    """llama-cpp-python's source distribution in the cache: the installed binding's version, else the newest."""
    folder = cache_dir() / "llama.cpp-tools" / "sdist"
    try:
        import llama_cpp
    except ImportError:
        found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
        return found[-1] if found else None
    path = folder / f"llama_cpp_python-{llama_cpp.__version__}.tar.gz"
    return path if path.is_file() else None


def vocab_files(name: str) -> pathlib.Path:
    """``ggml-vocab-NAME.gguf`` (with its .inp/.out) from llama.cpp's source, extracted once, atomically."""
    sdist = _sdist()
    if sdist is None:
        _unavailable(f"llama-cpp-python's source distribution is not in {cache_dir() / 'llama.cpp-tools' / 'sdist'} "
                     f"({SETUP_VOCABS} downloads it)")
    version = sdist.name[len("llama_cpp_python-"):-len(".tar.gz")]
    folder = cache_dir() / "llama.cpp-tools" / f"vocab-{version}"
    names = [f"ggml-vocab-{name}.gguf" + ext for ext in ("", ".inp", ".out")]
    if not all((folder / n).is_file() for n in names):
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for n in names:
                member = tar.extractfile(f"llama_cpp_python-{version}/vendor/llama.cpp/models/{n}")
                write_atomic(folder / n, lambda f, member=member: f.write(member.read()))
    return folder / names[0]


@pytest.fixture(scope="module", params=[*VOCABS, pytest.param("gemma3-270m", marks=pytest.mark.slow)])
def gguf(request) -> str:
    if request.param == "gemma3-270m":
        if zoo.missing_packages(zoo.GEMMA3_270M):  # scripts/test.sh installs it (setup.sh ... gemma3)
            _unavailable(f"the Gemma 3 270M file is not installed ({zoo.GEMMA3_270M.install})")
        return str(zoo.ensure_gguf(zoo.GEMMA3_270M, progress=False))
    return str(vocab_files(request.param))


@pytest.fixture(scope="module")
def tokenizer(gguf):
    return tk.gguf_tokenizer(gguf)


class LlamaCppTokenizer:
    """llama.cpp's tokenization of a file's text, as its ``llama-tokenize`` tool does it (``common_tokenize``
    with ``add_special`` = the vocabulary's add-BOS rule and ``parse_special`` on): ``llama_tokenize`` of the
    file's vocabulary only, through the llama_cpp package."""

    def __init__(self, gguf: str) -> None:
        llama_cpp = _llama_cpp()
        self.llama = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(self.llama.model)))

    def __call__(self, text: str) -> list[int]:
        return list(self.llama.tokenize(text.encode(), add_bos=self.add_bos, special=True))


@pytest.fixture(scope="module")
def llamacpp(gguf) -> LlamaCppTokenizer:
    return LlamaCppTokenizer(gguf)


def _first_difference(ours: list[int], theirs: list[int], separator: int, tokenizer) -> str:
    """Which sample the two id lists first differ in, and how."""
    def split(ids):
        parts, part = [], []
        for i in ids:
            if i == separator:
                parts.append(part)
                part = []
            else:
                part.append(i)
        return parts + [part]

    for name, a, b in zip(SAMPLES, split(ours), split(theirs), strict=False):
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return (f"sample {name!r} ({SAMPLES[name]!r}) from token {k}: ours {a[k:k + 4]} "
                    f"{tokenizer.convert_ids_to_tokens(a[k:k + 4])}, llama.cpp's {b[k:k + 4]} "
                    f"{tokenizer.convert_ids_to_tokens(b[k:k + 4])}")
    return f"the samples agree but the whole differs: ours {len(ours)} ids, llama.cpp's {len(theirs)}"


def test_ids_equal_llamacpps_on_the_sample(gguf, tokenizer, llamacpp):
    assert tk.llamacpp_add_bos(GGUFFile(gguf).fields) == llamacpp.add_bos
    text = tokenizer.eos_token.join(SAMPLES.values())
    theirs = llamacpp(text)
    ours = list(tokenizer(text)["input_ids"])
    assert ours == theirs, _first_difference(ours, theirs, tokenizer.eos_token_id, tokenizer)
    assert theirs.count(tokenizer.eos_token_id) == len(SAMPLES) - 1  # the separators stayed special tokens
    decoded = tokenizer.decode(ours, skip_special_tokens=True)
    assert "".join(decoded.split()) == "".join("".join(SAMPLES.values()).split())  # and back, but for spacing


def test_ids_equal_llamacpps_own_expected_ids(gguf, tokenizer):
    inp, out = pathlib.Path(gguf + ".inp"), pathlib.Path(gguf + ".out")
    if not inp.is_file():
        pytest.skip(f"{os.path.basename(gguf)} ships no expected ids")
    raw = inp.read_text(encoding="utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts.pop()  # as test-tokenizer-0.cpp reads the file
    expected = [[int(t) for t in line.split()] for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(texts) == len(expected) > 40
    wrong = [(text, ids) for text, ids in zip(texts, expected, strict=True)
             if list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]) != ids]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts differ, the first {wrong[0][0]!r}: expected {wrong[0][1]}"


def test_the_prompt_text_the_bench_hands_llamacpps_tools_reads_back_as_the_prompt(gguf, tokenizer, llamacpp):
    """``specdec bench``'s llamacpp-cli modes write prompt ids as text (``tool_prompt``): the tool must read
    that text as the same ids, its own BOS included (Llama 3's and Gemma's tokenizers add one)."""
    ids = list(tokenizer("\n".join(SAMPLES.values()))["input_ids"])
    text, echoed = tool_prompt(tokenizer, ids, tk.llamacpp_add_bos(GGUFFile(gguf).fields))
    assert llamacpp(text) == ids
    assert echoed == (tokenizer.bos_token.encode() if ids[0] == tokenizer.bos_token_id else b"")


def test_the_chat_template_is_the_files_own(gguf, tokenizer):
    assert tokenizer.chat_template == GGUFFile(gguf).fields.get("tokenizer.chat_template")


def test_a_tokenizer_cached_before_the_corrections_changed_is_rebuilt(tmp_path, monkeypatch):
    from tiny_qwen2 import write_tiny_qwen2
    from transformers import AutoTokenizer

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    model = write_tiny_qwen2(tmp_path / "tiny.gguf", tokenizer=True)
    builds = []
    real = AutoTokenizer.from_pretrained

    def counting(*args, **kwargs):
        builds.extend([kwargs["gguf_file"]] if "gguf_file" in kwargs else [])
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counting)
    first = tk.gguf_tokenizer(model)
    marker = derived_dir(model, "tokenizers") / tk.MARKER
    assert builds == ["tiny.gguf"] and json.loads(marker.read_text()) == {"version": tk.VERSION}
    tk.gguf_tokenizer(model)
    assert builds == ["tiny.gguf"]  # read from the cache
    marker.write_text(json.dumps({"version": tk.VERSION - 1}))
    again = tk.gguf_tokenizer(model)
    assert builds == ["tiny.gguf"] * 2 and json.loads(marker.read_text()) == {"version": tk.VERSION}
    assert again("the cat sat")["input_ids"] == first("the cat sat")["input_ids"]
