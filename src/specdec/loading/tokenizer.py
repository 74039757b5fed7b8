"""A GGUF file's tokenizer as llama.cpp reads it: built by transformers from the file's metadata once,
corrected where transformers reads the file differently from llama.cpp, and cached.

llama.cpp writes and reads GGUF files, so its reading is the reference (``tests/test_tokenizer_llamacpp.py``
compares token ids with llama.cpp's own tokenizer, through llama-cpp-python's ``vocab_only`` reading, on a fixed
multilingual and code sample, and with the expected
ids llama.cpp's own tokenizer tests ship). Four corrections, after ``llama_vocab::impl::load`` in
llama.cpp's ``src/llama-vocab.cpp``:

- BOS. A file without ``tokenizer.ggml.add_bos_token`` gets llama.cpp's default: a BOS for SentencePiece
  and WordPiece vocabularies and for the byte-level BPE ones of the pre-tokenizers in
  :data:`BOS_PRE_TOKENIZERS` (Llama 3's family). transformers adds none to such a BPE file, so every
  Llama 3 prompt lacked ``<|begin_of_text|>`` (llama.cpp's own ``ggml-vocab-llama-bpe.gguf``).
- Whole words first. For the pre-tokenizers in :data:`IGNORE_MERGES_PRE_TOKENIZERS` (Llama 3's family,
  GLM-4, ...) a pre-tokenized word that is itself in the vocabulary is that one token, whatever the
  merges would make of it (``ignore_merges``, as Llama 3's ``tokenizer.json`` says too); transformers
  ran the merges (``"Cửa Việt"``: 5 tokens instead of llama.cpp's 3).
- SentencePiece's prefix space. Unless ``tokenizer.ggml.add_space_prefix`` is false, llama.cpp puts a
  space before each stretch of text at the start or after a special token, also when the text starts
  with a space (as sentencepiece does). transformers' ``Metaspace`` pre-tokenizer skips it when the
  text already starts with one (``" hello"``: llama.cpp ``▁ ▁hello``, transformers ``▁hello``), so the
  space comes from a normalizer instead, ``Prepend("▁")`` then ``Replace(" ", "▁")``, as Llama 2's own
  ``tokenizer.json`` does.
- User-defined tokens with spaces. llama.cpp cuts every user-defined token (``tokenizer.ggml.token_type``
  4) out of the raw text, longest first, before the SentencePiece merges (``tokenizer_st_partition``, also
  when special tokens are not parsed). transformers adds them as added tokens only when the token's text
  is in its vocabulary, and its vocabulary spells spaces ``▁``: Gemma 3's runs of 2..31 spaces (ids
  138..167) were dropped and the merges cut the runs instead (33 spaces: llama.cpp ``31 + 2``,
  transformers ``16 + 17``; 2 tokens more on Python's ``textwrap.py``). They are added in their ``▁``
  spelling, matched after the ``Replace(" ", "▁")`` normalizer (only for files without the prefix
  space, whose normalizer would put a ``▁`` of its own in front of the text).

Gemma 4 files keep transformers' reading (no BOS: its chat template writes ``<bos>`` itself; llama.cpp
forces one, ggml-org/llama.cpp#21500).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct

from ..cache import converted_dir, derived_dir, locked

__all__ = ["BOS_PRE_TOKENIZERS", "IGNORE_MERGES_PRE_TOKENIZERS", "llamacpp_add_bos", "llamacpp_space_prefix",
           "match_llamacpp", "user_defined_tokens", "gguf_tokenizer", "save_tokenizer"]

# tokenizer.ggml.pre values llama.cpp adds a BOS to when the file does not say (llama-vocab.cpp)
BOS_PRE_TOKENIZERS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                                "lfm2", "jina-v5-nano", "tekken", "chameleon"})
# tokenizer.ggml.pre values whose words llama.cpp looks up whole before merging (no GGUF key says so)
IGNORE_MERGES_PRE_TOKENIZERS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                          "midm-2.0", "lfm2", "jina-v5-nano", "minicpm5", "youtu", "glm4", "glm5",
                                          "tekken", "granite-embed-multi-97m"})
MARKER = "specdec-tokenizer.json"  # written beside a saved tokenizer: which corrections it has
VERSION = 3  # bump when a correction changes, so that tokenizers cached before are rebuilt


def llamacpp_add_bos(fields: dict) -> bool:
    """Whether llama.cpp adds a BOS to a prompt of the file with these metadata ``fields``."""
    flag = fields.get("tokenizer.ggml.add_bos_token")
    if flag is not None:
        return bool(flag)
    model = fields.get("tokenizer.ggml.model")
    if model in ("llama", "bert"):  # SentencePiece, WordPiece
        return True
    return model == "gpt2" and fields.get("tokenizer.ggml.pre") in BOS_PRE_TOKENIZERS


def llamacpp_space_prefix(fields: dict) -> bool:
    """Whether llama.cpp prefixes text with a space (SentencePiece vocabularies unless the file says not)."""
    return fields.get("tokenizer.ggml.model") == "llama" and bool(fields.get("tokenizer.ggml.add_space_prefix", True))


def user_defined_tokens(gguf_path: str) -> dict[int, str]:
    """The file's user-defined tokens (``tokenizer.ggml.token_type`` 4), id -> text, read straight from the
    metadata (the file's other arrays are walked past, not decoded: well under a second for 262K tokens)."""
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # gguf.md value types
    arrays: dict[str, object] = {}
    with open(gguf_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        def string(pos: int) -> tuple[bytes, int]:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return buf[pos + 8 : pos + 8 + n], pos + 8 + n

        def skip(kind: int, pos: int) -> int:
            if kind in scalar:
                return pos + scalar[kind]
            if kind == 8:
                return string(pos)[1]
            item, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if item in scalar:
                return pos + scalar[item] * count
            for _ in range(count):
                pos = skip(item, pos)
            return pos

        (n_fields,), pos = struct.unpack_from("<Q", buf, 16), 24
        for _ in range(n_fields):
            key, pos = string(pos)
            (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            if key == b"tokenizer.ggml.token_type" and kind == 9:
                item, count = struct.unpack_from("<IQ", buf, pos)
                arrays["types"] = struct.unpack_from(f"<{count}i", buf, pos + 12) if item in (4, 5) else ()
            elif key == b"tokenizer.ggml.tokens" and kind == 9:
                (count,), at, texts = struct.unpack_from("<Q", buf, pos + 4), pos + 12, []
                for _ in range(count):
                    text, at = string(at)
                    texts.append(text)
                arrays["tokens"] = texts
            pos = skip(kind, pos)
            if len(arrays) == 2:
                break
    tokens, types = arrays.get("tokens", []), arrays.get("types", ())
    return {i: tokens[i].decode("utf-8", errors="replace") for i, kind in enumerate(types) if kind == 4}


def match_llamacpp(tokenizer, fields: dict, user_defined: dict[int, str] | None = None):
    """``tokenizer`` (transformers' reading of the file) corrected to llama.cpp's reading; returned.
    ``user_defined``: the file's user-defined tokens (:func:`user_defined_tokens`), for SentencePiece files."""
    from tokenizers import AddedToken, models, normalizers, pre_tokenizers

    if fields.get("tokenizer.ggml.model") == "gemma4":
        return tokenizer
    add_bos = llamacpp_add_bos(fields)
    if bool(getattr(tokenizer, "add_bos_token", False)) != add_bos and tokenizer.bos_token is not None:
        tokenizer.add_bos_token = add_bos  # rebuilds the post-processor
    backend = tokenizer.backend_tokenizer
    pre = fields.get("tokenizer.ggml.pre")
    if fields.get("tokenizer.ggml.model") == "gpt2" and pre in IGNORE_MERGES_PRE_TOKENIZERS:
        if isinstance(backend.model, models.BPE):
            backend.model.ignore_merges = True
    if llamacpp_space_prefix(fields) and isinstance(backend.pre_tokenizer, pre_tokenizers.Metaspace):
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        backend.pre_tokenizer = None
    if fields.get("tokenizer.ggml.model") == "llama" and not llamacpp_space_prefix(fields) and user_defined:
        vocab, added = tokenizer.get_vocab(), backend.get_added_tokens_decoder()
        spelled = [(i, text.replace(" ", "\u2581")) for i, text in sorted(user_defined.items())
                   if i not in added and " " in text]
        missing = [AddedToken(text, normalized=True, special=False) for i, text in spelled if vocab.get(text) == i]
        if missing:
            tokenizer.add_tokens(missing)
    return tokenizer


def save_tokenizer(tokenizer, folder) -> None:
    """Save a corrected tokenizer into ``folder`` (not atomic by itself: save into a temporary folder).

    Read back as transformers' generic ``TokenizersBackend``, the saved ``tokenizer.json`` exactly as corrected: a
    model's own class (``Qwen2Tokenizer``, ...) rebuilds its pipeline from the vocabulary and merges, which added
    an NFC normalizer llama.cpp does not have ("cafe\u0301 A\u030a x" read as 4 ids where llama.cpp reads 7) and parsed
    the 11 MB file in Python (1.3-1.5 s a load, 0.5 s now, AMD EPYC Zen 3). The added tokens go into
    ``tokenizer_config.json`` too, so loading does not parse ``tokenizer.json`` in Python for them."""
    tokenizer.save_pretrained(folder)
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "TokenizersBackend"
    added = tokenizer.added_tokens_decoder
    config["added_tokens_decoder"] = {str(i): token.__getstate__() for i, token in added.items()}
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(folder, MARKER), "w") as f:
        json.dump({"version": VERSION}, f)


def _saved(folder) -> bool:
    try:
        with open(os.path.join(folder, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    ok = isinstance(marker, dict) and marker.get("version") == VERSION
    return ok and os.path.isfile(os.path.join(folder, "tokenizer_config.json"))


def gguf_tokenizer(gguf_path: str):
    """The transformers tokenizer stored in a GGUF file as llama.cpp reads it, built once and then read from
    the cache.

    Saved into a temporary folder and renamed into place whole, under a lock: a process killed while
    saving leaves only that temporary folder, which nothing reads and the next build removes. A folder
    saved before the corrections of this module changed (its marker's version) is rebuilt."""
    from transformers import AutoTokenizer

    from ..native.gguf_file import GGUFFile

    def cached():
        for folder in (derived_dir(gguf_path, "tokenizers"), converted_dir(gguf_path)):
            if _saved(folder):
                return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        return None

    tokenizer = cached()
    if tokenizer is not None:
        return tokenizer
    out = derived_dir(gguf_path, "tokenizers")
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent / f"{out.name}.lock"):
        tokenizer = cached()  # another process built it while we waited
        if tokenizer is not None:
            return tokenizer
        for stale in out.parent.glob(f".{out.name}.*.tmp"):  # we hold the lock: leftovers of a killed build
            shutil.rmtree(stale, ignore_errors=True)
        directory, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
        fields = GGUFFile(gguf_path).fields
        user_defined = user_defined_tokens(gguf_path) if fields.get("tokenizer.ggml.model") == "llama" else None
        tokenizer = match_llamacpp(tokenizer, fields, user_defined)
        tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_tokenizer(tokenizer, tmp)
            shutil.rmtree(out, ignore_errors=True)  # a folder without a marker: not a finished build
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return AutoTokenizer.from_pretrained(str(out), local_files_only=True)  # the first run reads what later ones do


def load_tokenizer(spec: str | None = None, *, progress: bool = True):
    """The tokenizer of a --target value (None: the default target), without loading any weights.

    A GGUF file's is read as llama.cpp reads it, once, then from the cache (:func:`gguf_tokenizer`).
    """
    from transformers import AutoTokenizer

    from .locate import model_source

    name_or_path, gguf_file = model_source(spec, "target", progress=progress, tokenizer_only=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if gguf_file is None:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    return gguf_tokenizer(os.path.join(name_or_path, gguf_file))
