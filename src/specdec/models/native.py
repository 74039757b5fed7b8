"""NativeModel: a GGUF file run by specdec's own CPU kernels, weights kept as the file stores them.

One runner for every architecture in ``specdec.models.archs`` (Qwen2, Llama, Qwen3, Gemma 3, Phi-3, Granite: each
a file that reads its config and flags from the metadata); the layer itself is one C function (``ops_layer``) told
apart by data: optional q/k and post norms, the rotary layout and width, the activation, the residual scale, each
layer's window, scale and rotary frequencies. The weights (fused tensors split by rows, the rotary frequencies) are
``specdec.models.native_weights``. The GGUF file is memory-mapped; every
quantized matrix stays in its 2- to 8-bit blocks and is multiplied by ``specdec.native.kernels``
(nothing de-quantized, no float32 copy: the resident size is the file plus the KV cache); Q4_K, Q6_K, Q2_K, Q3_K and
Q4_0 matrices whose rows are a multiple of 16 are copied once at load into panels of 16 output rows (the same bytes,
Q4_K's plus 3%; the file's pages let go: ``NativeSettings.panels``, ``kernels.PANELS``). A file with
matrices of a type no kernel reads is refused (``specdec.models.kernel_types``) unless
``NativeSettings.dequantize`` asks for float32 copies of them. Norm weights and biases are float32 in the
file and used as they are.

Exactness. A target's logits for a token must be bit for bit the same whether it is scored alone
(plain decoding) or inside a block of γ + 1 (verification); otherwise the p that verifies a draft
is not the p plain decoding samples from. Every piece of the forward pass is row-independent:

- the kernels quantize each activation row by itself and sum in a fixed order (tested bitwise);
- norms, rotary embedding and attention (``specdec/native/ops.cpp``) compute each row, and each
  (row, head), by itself in an order fixed by its own length; SiLU and residual adds are element-wise.

``tests/test_native_model.py`` checks this through the whole model at several context lengths.

Prompts are read with the kernels' prompt-reading product (``MODE_PROMPT``, ``specdec/native/prompt.h`` and
``prompt32.h``): its own fixed arithmetic, row-independent too, with AMX tiles where the CPU has them; 1.5–3×
faster than the scoring kernels for the hundreds of rows of a prompt (the panels' kernels are that arithmetic, for
scoring and prompts alike). The
role decides the arithmetic, never the row count: ``prefill`` always reads, ``score`` always scores, so plain
and speculative decoding see the same KV cache and the same logits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..native import kernels as ops
from ..native.gguf_file import GGUFFile
from .archs import SUPPORTED_ARCHS, read_config
from .archs.config import ModelConfig
from .base import Abilities, check_trim
from .kernel_types import check_native_types
from .native_weights import Layer, Linear, float32_values, inverse_frequencies, rotary_factors
from .prefix import LEND_FROM, PrefixCache, prefix_key

READ_BLOCK = 512  # prompt tokens per forward pass of ``read`` (bounds the activations' memory: ~50 MB)
__all__ = ["SUPPORTED_ARCHS", "KVCache", "NativeModel", "NativeSettings", "read_config"]


@dataclass(frozen=True)
class NativeSettings:
    threads: int | None = None  # kernel threads; None: every core
    isa: str = "native"  # which compiled kernels: native, avx2, scalar (specdec.native.build)
    prompt_kernels: bool = True  # read prompts with the prompt-reading product (MODE_PROMPT); False: as scoring
    dequantize: bool = False  # run matrices of a type without a kernel as float32 copies (else: NoKernelError)
    panels: bool = True  # Q2_K, Q3_K, Q4_K, Q6_K, Q4_0 matrices in 16-row panels at load (kernels.PANELS); else stored
    stack: bool = True  # q, k, v (and gate, up) of one type as one matrix each: one product call (the same bits)


class KVCache:
    """Keys and values of every layer, ``[capacity, kv heads, head dim]`` each, grown by doubling.

    Positions below ``frozen`` are a prefix-cache entry's rows in this same buffer (``models.prefix``: lent,
    not copied): they are never written here; a write there first makes this cache a copy of its own."""

    def __init__(self, config: ModelConfig, capacity: int = 512) -> None:
        self.config = config
        shape = (config.layers, capacity, config.kv_heads, config.head_dim)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)
        self.frozen = 0

    def ensure(self, length: int) -> None:
        capacity = self.keys.shape[1]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], capacity, *old.shape[2:]))
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
        self.frozen = 0  # a new buffer: the entry keeps the old one

    def writable(self, start: int, end: int) -> None:
        """Room for positions ``start..end - 1``, which the caller writes next (never an entry's rows)."""
        self.ensure(end)
        if start < self.frozen:
            self.keys, self.values = self.keys.clone(), self.values.clone()
            self.frozen = 0

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @classmethod
    def lent(cls, config: ModelConfig, buffers: tuple[torch.Tensor, torch.Tensor], n: int) -> KVCache:
        """A cache over an entry's own buffers, its first ``n`` positions frozen (no copy)."""
        cache = cls.__new__(cls)
        cache.config, (cache.keys, cache.values), cache.frozen = config, buffers, n
        return cache

    @classmethod
    def from_prefix(cls, config: ModelConfig, buffers: tuple[torch.Tensor, torch.Tensor], n: int) -> KVCache:
        """A fresh cache holding a copy of the first ``n`` positions of ``buffers``, with room for 512 more
        (the rest zero, as a new cache's: only the copy and the room are written)."""
        cache = cls.__new__(cls)
        cache.config, cache.frozen = config, 0
        shape = (config.layers, n + 512, config.kv_heads, config.head_dim)
        cache.keys, cache.values = torch.empty(shape), torch.empty(shape)
        for mine, theirs in ((cache.keys, buffers[0]), (cache.values, buffers[1])):
            mine[:, :n] = theirs[:, :n]
            mine[:, n:] = 0
        return cache


class NativeModel:
    """A GGUF file's model (an architecture of ``specdec.models.archs``) behind the LanguageModel protocol
    (``specdec.models.base``), with every optional ability (rows computed each by itself: score_many's are bit
    for bit each sequence's alone, so the engine always batches them)."""

    abilities = Abilities(switch_state=True, score_many=True, batch_scores=True, read_prefix=True)

    def __init__(self, path: str, settings: NativeSettings = NativeSettings(), *, tokenizer=None) -> None:
        self.path, self.settings, self.tokenizer = path, settings, tokenizer
        self.name = os.path.basename(path)
        self.device = torch.device("cpu")
        self._file = GGUFFile(path)
        self.config = read_config(self._file)
        check_native_types(self._file, dequantize=settings.dequantize)  # no float32 copy unless asked for
        threads = settings.threads or os.cpu_count() or 1
        self._threads = threads
        self.threads = (threads, threads)  # kernel threads for one token and for a block (as llama.cpp reports)
        tensors = self._file.tensors

        def get(name):
            if name not in tensors:
                raise ValueError(f"{self.name}: tensor {name!r} is missing")
            return tensors[name]

        c = self.config
        embed = get("token_embd.weight")
        self.vocab_size = int(embed.shape[1])
        self._embed, self._embed_type = embed.data, embed.qtype  # [vocab, bytes per row], as stored
        factors, long_factors = rotary_factors(c, get, self.name)
        frequencies: dict[tuple, torch.Tensor] = {}  # one tensor per distinct rotary setting, shared by its layers
        for layer in c.layer:
            frequencies.setdefault((layer.rope_base, layer.rope_scale),
                                   inverse_frequencies(c, layer, factors, long_factors))
        self.layers = [Layer(get, tensors.__contains__, i, c, frequencies[(lc.rope_base, lc.rope_scale)], settings,
                             threads, self.name) for i, lc in enumerate(c.layer)]
        self.output_norm = float32_values(get("output_norm.weight"))
        self.head = Linear(tensors.get("output.weight", embed), None, settings, threads)  # tied when absent
        self._kept: torch.Tensor | None = None  # token ids of a cut head, None = every token
        self.max_length: int | None = self.config.context
        self._cache = KVCache(self.config)
        self._length = 0
        self.prefix_cache: PrefixCache | None = None  # prompt-read KV kept across prefills (``models.prefix``)
        self.last_reused = 0  # prompt tokens the last prefill took from the prefix cache
        self._prefix_key = prefix_key(self)
        self._shape = ops.Shape(c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn,
                                c.norm_eps, c.rope_layout, c.activation, c.rope_dims, c.rope_long_from,
                                c.rope_mscale, c.residual_scale)
        self._logit_factor = float(np.float32(1) / np.float32(c.logit_scale))  # llama.cpp's 1.0f / logit_scale
        self._inv_freq = self.layers[0].inv_freq  # the first layer's (every layer's for most models)
        self._stack = ops.Stack([layer.weights for layer in self.layers], [layer.inv_freq for layer in self.layers])

    # --- the LanguageModel protocol -------------------------------------------------------------
    @property
    def length(self) -> int:
        return self._length

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int]) -> int:
        """Forget the sequence, then read ``tokens`` with the prompt product; with a prefix cache, the
        longest prefix an earlier prefill read is taken instead of read again (the same bits); returns its length."""
        tokens = [int(t) for t in tokens]
        reused = self.reuse_prefix(tokens)
        self.read(tokens[reused:])
        self.keep_prefix(tokens)
        return reused

    # ``prefill`` in three verbs, so a server can read a long prompt a chunk at a time between other work.
    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Start a new sequence holding the longest prefix of ``tokens`` the prefix cache has; returns its
        length (0 without a cache or a hit). A hit of most of an entry whose buffer nobody writes any more
        borrows that buffer (no copy; ``prefix.LEND_FROM``); any other hit copies the rows."""
        cache = self.prefix_cache
        self._cache = None  # the sequence before: let go first, so a buffer only it wrote in is free to lend
        entry, reused = cache.longest(self._prefix_key, tokens) if cache is not None else (None, 0)
        if not reused:
            self._cache = KVCache(self.config)
        else:
            lent = KVCache.lent(self.config, entry.rows, reused) if reused >= LEND_FROM * len(entry.tokens) else None
            fresh = lent is not None and cache.lend(entry, lent, reused)
            self._cache = lent if fresh else KVCache.from_prefix(self.config, entry.rows, reused)
        self._length = self.last_reused = reused
        if cache is not None:
            cache.count(len(tokens) - reused, reused)
        return reused

    @torch.inference_mode()
    def read(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence as prompt (the prompt product, no logits), ``READ_BLOCK`` tokens
        per forward pass."""
        tokens = [int(t) for t in tokens]
        for start in range(0, len(tokens), READ_BLOCK):
            self._forward(tokens[start : start + READ_BLOCK], logits=False,
                          mode=ops.MODE_PROMPT if self.settings.prompt_kernels else ops.MODE_FAST)

    def keep_prefix(self, tokens: Sequence[int]) -> None:
        """Give the prefix cache the rows of ``tokens``, the sequence's first positions, which ``reuse_prefix``
        and ``read`` wrote (prompt-read rows only: never call it after ``score``): the buffer itself, those rows
        frozen from now on; this sequence goes on writing after them."""
        cache, n = self.prefix_cache, len(tokens)
        if cache is None or n > self._length or cache.longest(self._prefix_key, tokens)[1] == n:
            return  # nothing to keep, or an entry holds these rows already
        kv = self._cache
        kv.frozen = max(kv.frozen, n)
        cache.add(self._prefix_key, tokens, kv.buffers, kv.nbytes, writer=kv)

    @torch.inference_mode()
    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """[k, vocab] float32 logits after each of the k appended tokens."""
        return self._forward(list(tokens), logits=True)

    @torch.inference_mode()
    def score_many(self, states: list[tuple], tokens: list[list[int]]) -> tuple[list[torch.Tensor], list[tuple]]:
        """Score the tokens of several sequences in one forward pass (one read of the weights for all rows).
        ``states[s]``: sequence s as ``state()`` gives it (its KV cache and length); ``tokens[s]``: its k_s
        appended tokens (0 allowed). Returns each sequence's ``[k_s, vocab]`` logits and its new state (the same
        cache, length + k_s): bit for bit what ``restore(states[s])`` then ``score(tokens[s])`` gives. The model's
        own state is left as it was; each sequence needs its own cache."""
        if len(states) != len(tokens):
            raise ValueError(f"score_many needs one token list per state: {len(states)} states, "
                             f"{len(tokens)} token lists")
        rows = [[int(t) for t in seq] for seq in tokens]
        caches, starts, counts = [s[0] for s in states], [int(s[1]) for s in states], [len(r) for r in rows]
        busy = [id(cache) for cache, k in zip(caches, counts, strict=True) if k]
        if len(set(busy)) != len(busy):
            raise ValueError("score_many: two of the sequences share a KV cache (each sequence needs its own)")
        for cache, start, k in zip(caches, starts, counts, strict=True):
            if start < 0:
                raise ValueError(f"score_many: a state's length must be >= 0, got {start}")
            cache.writable(start, start + k)
        flat, isa = [t for r in rows for t in r], self.settings.isa
        if not flat:
            out = torch.zeros(0, self.vocab_size)
        else:
            x = self._embed_rows(flat)  # [sum k_s, hidden]
            ops.layers_many(self._stack, self._shape, x, starts, counts, [cache.keys for cache in caches],
                            [cache.values for cache in caches], self._threads, isa)  # ops.layer_many's bits
            out = self._logits(x)
        new_states = [(cache, start + k) for cache, start, k in zip(caches, starts, counts, strict=True)]
        return list(out.split(counts)), new_states

    def trim(self, length: int) -> None:
        check_trim(self, length)
        self._length = length  # positions past the length are overwritten by the next call

    def state(self) -> tuple:
        return self._cache, self._length

    def restore(self, state: tuple) -> None:
        self._cache, self._length = state

    def cut_head(self, keep: Sequence[int]) -> None:
        """Logits for ``keep`` only, −inf elsewhere (a draft's cheaper head: ``specdec.models.head``)."""
        ids = np.array(sorted({int(i) for i in keep}), dtype=np.int64)
        if ids.size == 0 or ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise ValueError(f"kept token ids must be a non-empty subset of [0, {self.vocab_size})")
        self.head.keep_rows(ids)
        self._kept = torch.from_numpy(ids)

    def end_of_generation_ids(self) -> list[int]:
        """The ids the file's metadata names as ending a generation (EOS, end of turn)."""
        keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        return sorted({int(self._file.fields[key]) for key in keys if key in self._file.fields})

    def vocabulary(self) -> bytes | None:
        """The file's token list as stored (``tokenizer.ggml.tokens``): two files' lists compared whole."""
        return self._file.raw_value("tokenizer.ggml.tokens")

    def token_text(self, i: int):
        """Token ``i``'s text in this file's own list (not the shared tokenizer's: the vocabulary check compares
        the two files)."""
        if not hasattr(self, "_tokens"):
            self._tokens = self._file.strings("tokenizer.ggml.tokens")
        return self._tokens[i] if i < len(self._tokens) else None

    # --- the forward pass ---------------------------------------------------------------------
    def _forward(self, tokens: list[int], logits: bool, mode: int = ops.MODE_FAST) -> torch.Tensor | None:
        start, k = self._length, len(tokens)
        if k == 0:
            return torch.zeros(0, self.vocab_size) if logits else None
        self._cache.writable(start, start + k)
        x = self._embed_rows(tokens)  # [k, hidden]
        ops.layers(self._stack, self._shape, x, start, self._cache.keys, self._cache.values, self._threads,
                   self.settings.isa, mode)  # every layer in one call (ops.layer's bits)
        self._length = start + k
        return self._logits(x) if logits else None

    def _logits(self, x: torch.Tensor) -> torch.Tensor:  # [k, hidden] → [k, vocab]
        c = self.config
        out = self.head(ops.rms_norm(x, self.output_norm, c.norm_eps, self.settings.isa))  # [k, vocab or kept]
        if c.logit_scale != 1.0:
            out.mul_(self._logit_factor)  # element by element (Granite: times 1 / logit_scale, a float32)
        if self._kept is None:
            return out
        return out.new_full((x.shape[0], self.vocab_size), float("-inf")).index_copy_(1, self._kept, out)

    def _embed_rows(self, tokens: list[int]) -> torch.Tensor:  # → [k, hidden]
        x = ops.dequantize_rows(self._embed, self._embed_type, self.config.hidden, np.asarray(tokens),
                                self.settings.isa)
        scale = self.config.embed_scale
        return x if scale == 1.0 else x.mul_(scale)  # element by element (Gemma: sqrt(hidden), a float32)
