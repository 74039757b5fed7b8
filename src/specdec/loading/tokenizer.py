"""A GGUF file's tokenizer as llama.cpp reads it: built by transformers from the file's metadata once,
corrected where transformers reads the file differently from llama.cpp, and cached.

llama.cpp writes and reads GGUF files, so its reading is the reference (``tests/test_tokenizer_llamacpp.py``
compares token ids with llama.cpp's own tokenizer, through llama-cpp-python's ``vocab_only`` reading, on a fixed
multilingual and code sample, and with the expected
ids llama.cpp's own tokenizer tests ship). Three corrections, after ``llama_vocab::impl::load`` in
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

Gemma 4 files keep transformers' reading (no BOS: its chat template writes ``<bos>`` itself; llama.cpp
forces one, ggml-org/llama.cpp#21500).
"""

from __future__ import annotations

import json
import os
import shutil

from .cache import converted_dir, derived_dir, locked

__all__ = ["BOS_PRE_TOKENIZERS", "IGNORE_MERGES_PRE_TOKENIZERS", "llamacpp_add_bos", "llamacpp_space_prefix",
           "match_llamacpp", "gguf_tokenizer", "save_tokenizer"]

# tokenizer.ggml.pre values llama.cpp adds a BOS to when the file does not say (llama-vocab.cpp)
BOS_PRE_TOKENIZERS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                                "lfm2", "jina-v5-nano", "tekken", "chameleon"})
# tokenizer.ggml.pre values whose words llama.cpp looks up whole before merging (no GGUF key says so)
IGNORE_MERGES_PRE_TOKENIZERS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                          "midm-2.0", "lfm2", "jina-v5-nano", "minicpm5", "youtu", "glm4", "glm5",
                                          "tekken", "granite-embed-multi-97m"})
MARKER = "specdec-tokenizer.json"  # written beside a saved tokenizer: which corrections it has
VERSION = 1  # bump when a correction changes, so that tokenizers cached before are rebuilt


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


def match_llamacpp(tokenizer, fields: dict):
    """``tokenizer`` (transformers' reading of the file) corrected to llama.cpp's reading; returned."""
    from tokenizers import models, normalizers, pre_tokenizers

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
    return tokenizer


def save_tokenizer(tokenizer, folder) -> None:
    """Save a corrected tokenizer into ``folder`` (not atomic by itself: save into a temporary folder)."""
    tokenizer.save_pretrained(folder)
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
        tokenizer = match_llamacpp(tokenizer, GGUFFile(gguf_path).fields)
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
