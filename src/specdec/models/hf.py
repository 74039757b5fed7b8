"""HFModel: any transformers causal LM behind the LanguageModel protocol, with its KV cache.

Rollback is a crop of the ``DynamicCache``; a cache that cannot be cropped back exactly (sliding
windows, recurrent state) is refused when the model is wrapped, before any generation.

``score_many`` scores several sequences (each its own cache) in one padded forward pass: one read of
the weights for every request's rows, which is what a GPU serving several requests needs. Padding
changes the shapes of the matrix products, so a row's logits differ from scoring it alone in their last
bits (as in every batched GPU server); on the CPU the server therefore scores requests in turn
(its ``abilities.batch_scores`` False), where each request's logits stay bit for bit what they are alone.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence

import torch

from .base import Abilities, check_trim

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "auto": None}
    name = aliases.get(dtype, dtype)
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: choose one of {', '.join(DTYPES)} (or auto)")
    return DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} is not available here: torch sees no CUDA device (use cpu)")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={str(device)!r} is invalid: choose cpu or cuda")
    return dev


class HFModel:
    """Wraps a ``transformers`` causal LM (``model``) and, optionally, its tokenizer."""

    def __init__(self, model, tokenizer=None, *, name: str | None = None) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", "model")
        self.device = next(model.parameters()).device
        head = model.get_output_embeddings()
        self.vocab_size = int(getattr(head, "out_features", None) or head.weight.shape[0])
        self.max_length: int | None = getattr(model.config, "max_position_embeddings", None)
        self._new_cache = lambda: DynamicCache(config=model.config)
        self._cache = self._new_cache()
        if not self._cache.is_croppable:
            raise ValueError(
                f"{self.name}: its KV cache cannot be trimmed back exactly (sliding-window or recurrent "
                "layers), so rejected drafts could not be rolled back; speculative decoding refuses it"
            )
        self._length = 0
        # no prefix cache; score_many used by a server only on a GPU (above)
        self.abilities = Abilities(switch_state=True, score_many=True, batch_scores=self.device.type != "cpu")
        # transformers >= 5.2x names the cache argument `cache`; earlier releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        gguf_file: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
    ) -> HFModel:
        """Load weights (and tokenizer) from a model id or directory, or from a GGUF file.

        ``gguf_file`` is the file's name inside ``name_or_path``, or a path to the file itself.
        Nothing is downloaded: transformers reads local files only.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype)
        if gguf_file is not None and os.path.isfile(gguf_file):
            name_or_path, gguf_file = os.path.dirname(os.path.abspath(gguf_file)), os.path.basename(gguf_file)
        # local_files_only: never reach for a model hub (a missing model is named, not looked up online).
        kwargs = {"gguf_file": gguf_file, "local_files_only": True} if gguf_file else {"local_files_only": True}
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **kwargs).to(dev)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        return cls(model, tokenizer, name=gguf_file or name_or_path)

    @property
    def length(self) -> int:
        return self._length

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int]) -> int:
        self._cache = self._new_cache()
        self._length = 0
        if len(tokens):
            self._forward(tokens, logits_to_keep=1)
        return 0  # no prefix cache: every token read

    @torch.inference_mode()
    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """[k, vocab] float32 logits after each of the k appended tokens, in one forward pass."""
        logits = self._forward(tokens, logits_to_keep=0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits

    @torch.inference_mode()
    def score_many(self, states: list[tuple], tokens: list[list[int]]) -> tuple[list[torch.Tensor], list[tuple]]:
        """Score the tokens of several sequences in one forward pass: ``states[s]`` as ``state()`` gives it,
        ``tokens[s]`` its k_s appended tokens (0 allowed). Returns each sequence's ``[k_s, vocab]`` logits and
        its new state (a new cache, length + k_s); the model's own state is left as it was.

        Layout of sequence s in the batch: ``[pad | its past L_s | its k_s tokens | pad]``, the pads masked
        out, its positions L_s.. given explicitly; its new cache is the slice of past and new rows."""
        if len(states) != len(tokens):
            raise ValueError(f"score_many needs one token list per state: {len(states)} states, "
                             f"{len(tokens)} token lists")
        rows = [[int(t) for t in seq] for seq in tokens]
        logits = [torch.zeros(0, self.vocab_size, device=self.device) for _ in rows]
        new_states = list(states)
        busy = [s for s, seq in enumerate(rows) if seq]
        if not busy:
            return logits, new_states
        pasts = [int(states[s][1]) for s in busy]
        if min(pasts) < 0:
            raise ValueError(f"score_many: a state's length must be >= 0, got {min(pasts)}")
        past, new = max(pasts), max(len(rows[s]) for s in busy)
        ids = torch.zeros(len(busy), new, dtype=torch.long)  # [B, K]
        mask = torch.zeros(len(busy), past + new, dtype=torch.long)  # [B, P + K]
        positions = torch.zeros(len(busy), new, dtype=torch.long)  # [B, K]
        for b, (s, length) in enumerate(zip(busy, pasts, strict=True)):
            k = len(rows[s])
            ids[b, :k] = torch.tensor(rows[s])
            mask[b, past - length : past + k] = 1
            positions[b] = torch.arange(length, length + new)
        cache = self._new_cache()
        if past:  # the pasts, padded on the left to one length
            template = next(states[s][0] for s, length in zip(busy, pasts, strict=True) if length)
            for layer in range(len(template.layers)):
                keys, values = (self._padded([states[s][0].layers[layer] for s in busy], pasts, past, name)
                                for name in ("keys", "values"))
                cache.update(keys, values, layer)
        dev = self.device
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                         use_cache=True, logits_to_keep=0, **{self._cache_kwarg: cache})
        for b, (s, length) in enumerate(zip(busy, pasts, strict=True)):
            k = len(rows[s])
            logits[s] = out.logits[b, :k].float()
            own = self._new_cache()
            for layer, part in enumerate(cache.layers):
                own.update(part.keys[b : b + 1, :, past - length : past + k].clone(),
                           part.values[b : b + 1, :, past - length : past + k].clone(), layer)
            new_states[s] = (own, length + k)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return logits, new_states

    @staticmethod
    def _padded(layers: list, lengths: list[int], past: int, name: str) -> torch.Tensor:
        """One layer's keys or values of several caches, ``[B, kv heads, past, head dim]``, each sequence's L_s
        rows at the end (zeros before: masked out)."""
        first = next(getattr(layer, name) for layer, length in zip(layers, lengths, strict=True) if length)
        out = first.new_zeros((len(layers), first.shape[1], past, first.shape[3]))
        for b, (layer, length) in enumerate(zip(layers, lengths, strict=True)):
            if length:
                out[b, :, past - length :] = getattr(layer, name)[0, :, :length]
        return out

    def trim(self, length: int) -> None:
        check_trim(self, length)
        if length < self._length:
            self._cache.crop(length - self._length)  # negative: remove that many (transformers 4 and 5)
            self._length = length

    def state(self) -> tuple:
        """The sequence state (KV cache, length), to ``restore`` later: one model serving several
        sequences in turn (``specdec serve``) keeps each one's cache between its turns. ``prefill``
        starts a fresh cache object, so a saved state is never written by another sequence."""
        return self._cache, self._length

    def restore(self, state: tuple) -> None:
        """Make ``state`` (from ``state()``) the current sequence again."""
        self._cache, self._length = state

    def _forward(self, tokens: Sequence[int], logits_to_keep: int) -> torch.Tensor:
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)  # [1, k]
        kwargs = {self._cache_kwarg: self._cache}
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=logits_to_keep, **kwargs)
        self._length += ids.shape[1]
        return out.logits[0].float()  # [k or 1, vocab]
