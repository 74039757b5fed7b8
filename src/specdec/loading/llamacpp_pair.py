"""The llama.cpp backend's models (``specdec.models.llamacpp``, llama-cpp-python): both GGUF files run as they
are, the target batch-invariant; the tokenizer is the target's, as llama.cpp reads the file
(``specdec.loading.tokenizer``).
"""

from __future__ import annotations

from ..models.base import check_same_vocabulary
from .locate import gguf_path


def load_llamacpp_models(target: str | None, draft: str | None, *, with_draft: bool = True,
                         threads: int | None = None, progress: bool = True) -> tuple:
    """(target, draft or None, tokenizer, end-of-generation ids): target and draft run by llama.cpp; prompts and
    text go through the target's transformers tokenizer."""
    from ..models.llamacpp import LlamaCppModel, LlamaCppSettings
    from .tokenizer import load_tokenizer

    # The target's rows must not depend on the block size (the rule's exactness; specdec.models.llamacpp
    # explains); a draft needs no such care.
    target_settings = LlamaCppSettings(n_threads=threads, batch_invariant=True)
    target_model = LlamaCppModel(gguf_path(target, "target", progress=progress), target_settings)
    draft_model = None
    if with_draft:
        draft_model = LlamaCppModel(gguf_path(draft, "draft", progress=progress), LlamaCppSettings(n_threads=threads))
    if draft_model is not None:
        check_same_vocabulary(target_model, draft_model)
    tokenizer = load_tokenizer(target, progress=progress)
    eos = set(target_model.end_of_generation_ids())
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(int(tokenizer.eos_token_id))
    return target_model, draft_model, tokenizer, sorted(eos)
