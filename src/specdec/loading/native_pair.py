"""Load a pair for the native backend: both GGUF files run by specdec's own kernels (``specdec.models.native``).

Nothing is converted or de-quantized: the files are memory-mapped as they are. The tokenizer is the
target's, rebuilt by transformers from the GGUF metadata once (≈15 s), corrected to llama.cpp's reading
and kept in the cache beside the file's other derived data (seconds on later runs;
``specdec.loading.tokenizer.gguf_tokenizer``).
"""

from __future__ import annotations

from ..models.base import check_same_vocabulary
from .tokenizer import gguf_tokenizer

__all__ = ["load_native_models"]


def load_native_models(target_path: str, draft_path: str | None, *, threads: int | None = None,
                       draft_head: int | None = None, kernels: str = "native") -> tuple:
    """(target, draft or None, tokenizer, end-of-generation ids) for two GGUF files."""
    from ..models.native import NativeModel, NativeSettings

    tokenizer = gguf_tokenizer(target_path)
    settings = NativeSettings(threads=threads, isa=kernels)
    target_model = NativeModel(target_path, settings, tokenizer=tokenizer)
    draft_model = NativeModel(draft_path, settings, tokenizer=tokenizer) if draft_path else None
    if draft_model is not None:
        check_same_vocabulary(target_model, draft_model)
        if draft_head:
            from .frequent import frequent_tokens

            draft_model.cut_head(frequent_tokens(tokenizer, draft_head))
    eos = {int(t) for t in (tokenizer.eos_token_id, *target_model.end_of_generation_ids()) if t is not None}
    return target_model, draft_model, tokenizer, sorted(eos)
