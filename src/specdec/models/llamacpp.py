"""LlamaCppModel: a GGUF model run by llama.cpp, behind the LanguageModel protocol.

llama.cpp is the fastest CPU engine for quantized GGUF models; we drive it through
llama-cpp-python's bindings of its C API (the optional extra ``specdec[llamacpp]``):

- ``prefill``: clear the context's memory, then ``llama_decode`` the prompt in chunks of
  ``n_batch`` tokens **without logits** (no output row is computed for a prompt token);
- ``score(k tokens)``: one ``llama_decode`` whose batch asks for logits at all k positions, copied
  out of llama.cpp's buffer into a float32 tensor ``[k, vocab]`` (one memmove, no Python loop);
- ``trim(n)``: ``llama_memory_seq_rm`` removes positions >= n of sequence 0 from the KV cache.

Exactness: the rule needs the target's row for a token to be the same whether it is scored alone
(plain decoding) or inside a block of γ + 1 (verification). llama.cpp's CPU kernels do not give
that as they are: a one-row call takes other code paths than a block (vec_dot instead of
llamafile's tinyBLAS for f16 attention and f32/f16/q8_0/q4_0/q5_0 weights; split-KV flash
attention once the cache view reaches 512 cells with an f16 cache and >= 2 threads), blocks of
>= 8 rows take a tiled K-quant matmul, and repacked weights (``use_extra_bufts``) multiply groups
of 4 rows with another kernel than single rows. The rounding differences are amplified by the
int8 quantization of activations: on the default 1.5B target a token's logits differ by up to
0.5 between a one-token call and a block (measured; enough to flip greedy choices every few
dozen tokens). ``LlamaCppSettings(batch_invariant=True)``, a target's setting, removes every one
of these paths:

- flash attention on, over a bf16 KV cache (ggml's split-KV and tiled attention kernels take
  f16/f32 caches only, so every query row goes through the same per-row kernel);
- no repacking, and the tiled K-quant matmul switched off (``GGML_CPU_TILED_MM=0``, read by
  ggml once per process, unless already set);
- at load, a probe scores 9 tokens as a block and one by one; if the rows differ (weights that
  tinyBLAS multiplies for >= 2 rows: f32, f16, q8_0, q4_0, ...), every call of one token is
  padded to 2 rows (copies of its token, logits computed and dropped, the padding removed from
  the cache) so that no row ever comes from a one-row call. K-quant models (the default pair)
  need no padding, so plain decoding keeps llama.cpp's one-token speed.

Then a row is the same bit for bit whatever the block size; tests/test_llamacpp.py checks it on
tiny models at short and long contexts and on the real target. A draft needs none of this: the
rule only needs each drafted token drawn from the q it is handed.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_int
from .base import NO_ABILITIES, check_same_vocabulary, check_trim  # noqa: F401  (check_same_vocabulary: the one vocabulary check, re-exported)

MIN_CONTEXT = 16
GGML_TYPE_F16, GGML_TYPE_BF16 = 1, 30  # ggml.h
PROBE_TOKENS = 9  # block size of the load-time probe: past the 8-row switch of ggml's tiled kernels
DEFAULT_CONTEXT = 4096
INSTALL_HINT = "pip install 'specdec[llamacpp]' (scripts/setup.sh llamacpp builds it from source)"


def available() -> bool:
    """True when llama-cpp-python can be imported here."""
    try:
        _lib()
    except ImportError:
        return False
    return True


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LlamaCppSettings:
    """How llama.cpp runs a model. ``None`` threads mean every available core."""

    n_ctx: int | None = None  # KV cache size in tokens; None = min(4096, the model's training context)
    n_batch: int = 512  # prompt tokens per llama_decode call (also the most a score call sends at once)
    n_threads: int | None = None  # threads for one-token calls
    n_threads_batch: int | None = None  # threads for calls of several tokens
    batch_invariant: bool = False  # a target's setting: a row never depends on the call's size (module docstring)
    flash_attn: bool = True  # llama.cpp's fused attention kernel
    repack: bool = False  # llama.cpp's interleaved weight layouts (a draft may use them; a target may not)

    def validate(self) -> None:
        if self.n_ctx is not None:
            check_int("n_ctx", self.n_ctx, MIN_CONTEXT, note=" (or None for the default)")
        check_int("n_batch", self.n_batch)
        if self.batch_invariant and self.n_batch < PROBE_TOKENS:
            raise ValueError(f"n_batch={self.n_batch} is invalid with batch_invariant: must be >= {PROBE_TOKENS}")
        if self.batch_invariant and self.repack:
            raise ValueError("repack=True is invalid with batch_invariant: repacked weights multiply one row "
                             "with another kernel than four")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, note=f" (or None for all {cpu_cores()} cores)")


class LlamaCppModel:
    """One GGUF file loaded by llama.cpp, with one sequence (id 0) in its KV cache."""

    abilities = NO_ABILITIES  # one sequence, no saved states: a server serves its requests one at a time

    def __init__(self, path: str | os.PathLike, settings: LlamaCppSettings = LlamaCppSettings(), *,
                 name: str | None = None) -> None:
        settings.validate()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"GGUF file {path!r} does not exist")
        lib = _lib()
        self.name = name or os.path.basename(path)
        self.path = path
        self.device = torch.device("cpu")
        model = _load_model(lib, path, settings)
        n_ctx_train = int(lib.llama_model_n_ctx_train(model))
        n_ctx = settings.n_ctx if settings.n_ctx is not None else min(DEFAULT_CONTEXT, n_ctx_train)
        if n_ctx > n_ctx_train:
            lib.llama_model_free(model)
            raise ValueError(f"n_ctx={n_ctx} is invalid for {self.name}: it was trained on {n_ctx_train} tokens, "
                             f"n_ctx must be in [{MIN_CONTEXT}, {n_ctx_train}]")
        n_batch = min(settings.n_batch, n_ctx)
        ctx = _new_context(lib, model, settings, n_ctx, n_batch)
        batch = lib.llama_batch_init(n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, _release, lib, batch, ctx, model)
        self._lib, self._ctx, self._model, self._batch = lib, ctx, model, batch
        self._memory = lib.llama_get_memory(ctx)
        self._vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        self.max_length: int | None = int(lib.llama_n_ctx(ctx)) - 1  # one cell kept free for padding
        self.n_batch = n_batch
        self.settings = settings
        self.min_rows = 1  # score calls shorter than this are padded (see the module docstring)
        self._length = 0
        self._token, self._pos, self._output = _batch_arrays(batch, n_batch)
        if settings.batch_invariant:
            self.min_rows = self._rows_needed_for_invariance()

    @property
    def length(self) -> int:
        return self._length

    @property
    def threads(self) -> tuple[int, int]:
        """(one-token, multi-token) threads llama.cpp runs with."""
        return int(self._lib.llama_n_threads(self._ctx)), int(self._lib.llama_n_threads_batch(self._ctx))

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        LlamaCppSettings(n_threads=n_threads, n_threads_batch=n_threads_batch).validate()
        self._lib.llama_set_n_threads(self._ctx, n_threads, n_threads_batch or n_threads)

    def prefill(self, tokens: Sequence[int]) -> int:
        """Forget the cache, then read ``tokens`` into it; no logits are computed."""
        self._lib.llama_memory_clear(self._memory, True)
        self._length = 0
        ids = self._checked(tokens)
        for start in range(0, len(ids), self.n_batch):
            self._decode(ids[start : start + self.n_batch], want_logits=False)
        return 0

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """[k, vocab] float32 logits after each of the k appended tokens (one llama_decode per n_batch)."""
        ids = self._checked(tokens)
        rows = []
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start : start + self.n_batch]
            padding = max(0, self.min_rows - len(chunk))
            self._decode(chunk + chunk[-1:] * padding, want_logits=True)
            rows.append(self._copy_logits(len(chunk)))
            if padding:
                self._remove_from(self._length - padding)
        if not rows:
            return torch.empty(0, self.vocab_size)
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def trim(self, length: int) -> None:
        check_trim(self, length)
        if length < self._length:
            self._remove_from(length)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (special tokens like <|im_start|> parsed)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        out = (ctypes.c_int32 * capacity)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), out, capacity, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"{self.name}: llama.cpp could not tokenize {len(data)} bytes")
        return list(out[:n])

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of ``token`` as stored in the GGUF file."""
        return bytes(self._lib.llama_vocab_get_text(self._vocab, token) or b"")

    def end_of_generation_ids(self) -> list[int]:
        """Every id llama.cpp treats as ending a generation (EOS, end of turn, ...)."""
        return [t for t in range(self.vocab_size) if self._lib.llama_vocab_is_eog(self._vocab, t)]

    def close(self) -> None:
        """Free llama.cpp's context and weights now (otherwise when the object is collected)."""
        self._finalizer()

    def __repr__(self) -> str:
        return (f"LlamaCppModel({self.name!r}, n_ctx={self.max_length}, threads={self.threads}, "
                f"batch_invariant={self.settings.batch_invariant}, min_rows={self.min_rows})")

    def _rows_needed_for_invariance(self) -> int:
        """1 if a token scored alone gives the row it gets in a block, else 2 (checked to suffice)."""
        probe = [1 + i % (self.vocab_size - 1) for i in range(PROBE_TOKENS)]
        self.prefill([0])
        block = self.score(probe)  # [9, vocab]
        for rows in (1, 2):
            self.min_rows = rows
            self.trim(1)
            if torch.equal(torch.cat([self.score([t]) for t in probe]), block):
                self.prefill([])
                return rows
        raise RuntimeError(f"{self.name}: llama.cpp gives a token other logits alone than in a block even when padded, "
                           "so its rows cannot be made batch-invariant here; use it as a draft, not as a target")

    def _checked(self, tokens: Sequence[int]) -> list[int]:
        ids = [int(t) for t in tokens]
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token {bad} is outside {self.name}'s vocabulary: "
                             f"ids must be in [0, {self.vocab_size - 1}]")
        if self._length + len(ids) > self.max_length:
            raise ValueError(f"{self.name}: {self._length} cached + {len(ids)} new tokens exceed its context of "
                             f"{self.max_length} tokens (n_ctx); load it with a larger n_ctx")
        return ids

    def _decode(self, ids: list[int], want_logits: bool) -> None:
        n = len(ids)
        self._token[:n] = ids
        self._pos[:n] = np.arange(self._length, self._length + n)
        self._output[:n] = want_logits
        self._batch.n_tokens = n
        code = self._lib.llama_decode(self._ctx, self._batch)
        if code != 0:
            raise RuntimeError(f"{self.name}: llama_decode of {n} tokens at position {self._length} "
                               f"failed (code {code})")
        self._length += n

    def _remove_from(self, position: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._memory, 0, position, -1):
            raise RuntimeError(f"{self.name}: llama.cpp could not remove positions >= {position} from its memory")
        self._length = position

    def _copy_logits(self, rows: int) -> torch.Tensor:
        # llama.cpp stores the requested rows contiguously, in batch order: [rows, vocab] float32.
        out = torch.empty(rows, self.vocab_size, dtype=torch.float32)
        source = self._lib.llama_get_logits(self._ctx)
        ctypes.memmove(out.data_ptr(), source, rows * self.vocab_size * 4)
        return out


# --- llama.cpp plumbing -------------------------------------------------------------------------

_ERRORS: deque[str] = deque(maxlen=8)  # llama.cpp's latest error lines, quoted when a load fails
_STATE: dict = {}


def _lib():
    """The llama_cpp module, initialized once: backend up, log reduced to errors."""
    if "lib" not in _STATE:
        os.environ.setdefault("GGML_CPU_TILED_MM", "0")  # see the module docstring; read at ggml's first matmul
        try:
            import llama_cpp
        except ImportError as err:
            raise ImportError(f"the llama.cpp backend needs llama-cpp-python: {INSTALL_HINT}") from err

        @llama_cpp.llama_log_callback
        def keep_errors(level: int, text: bytes, user_data) -> None:
            if level == 3 and text:  # GGML_LOG_LEVEL_ERROR
                _ERRORS.append(text.decode("utf-8", "replace").strip())

        llama_cpp.llama_log_set(keep_errors, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _STATE["log_callback"] = keep_errors  # ctypes must keep it alive as long as llama.cpp may call it
        _STATE["lib"] = llama_cpp
    return _STATE["lib"]


def _load_model(lib, path: str, settings: LlamaCppSettings):
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = settings.repack
    _ERRORS.clear()
    model = lib.llama_model_load_from_file(path.encode("utf-8"), params)
    if not model:
        why = "; ".join(_ERRORS) or "no reason given"
        raise ValueError(f"llama.cpp could not load {path!r} as a model: {why}")
    return model


def _new_context(lib, model, settings: LlamaCppSettings, n_ctx: int, n_batch: int):
    params = lib.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = n_batch  # one call = one micro-batch: a block is scored in one pass
    params.n_seq_max = 1
    params.n_threads = settings.n_threads or cpu_cores()
    params.n_threads_batch = settings.n_threads_batch or settings.n_threads or cpu_cores()
    params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attn
                              else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    params.no_perf = True
    params.type_k = params.type_v = GGML_TYPE_BF16 if settings.batch_invariant else GGML_TYPE_F16
    _ERRORS.clear()
    ctx = lib.llama_init_from_model(model, params)
    if not ctx:
        lib.llama_model_free(model)
        reason = "; ".join(_ERRORS) or "no reason given"
        raise ValueError(f"llama.cpp could not create a context of {n_ctx} tokens: {reason}")
    return ctx


def _batch_arrays(batch, n_batch: int):
    """numpy views of a llama_batch's token, position and output-flag arrays; every row in sequence 0."""
    for i in range(n_batch):
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
    token = np.ctypeslib.as_array(batch.token, shape=(n_batch,))
    pos = np.ctypeslib.as_array(batch.pos, shape=(n_batch,))
    output = np.ctypeslib.as_array(batch.logits, shape=(n_batch,))
    return token, pos, output


def _release(lib, batch, ctx, model) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)  # the context before the weights it points into
    lib.llama_model_free(model)
