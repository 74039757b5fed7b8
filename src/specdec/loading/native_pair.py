"""Load a pair for the native backend: both GGUF files run by specdec's own kernels (``specdec.models.native``).

Nothing is converted or de-quantized: the files are memory-mapped as they are (a file with matrices of a type
the kernels do not read is refused, ``specdec.models.kernel_types``, unless ``dequantize`` asks for float32
copies of them, which :func:`warn_float32` says on stderr). The tokenizer is the
target's, rebuilt by transformers from the GGUF metadata once (≈15 s), corrected to llama.cpp's reading
and kept in the cache beside the file's other derived data (seconds on later runs;
``specdec.loading.tokenizer.gguf_tokenizer``).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from ..models.base import check_same_vocabulary
from ..models.kernel_types import check_native_types
from .settings import draft_head_cut
from .tokenizer import gguf_tokenizer

__all__ = ["load_native_models", "warn_float32"]


def warn_float32(path: str, dequantize: bool) -> None:
    """Before a GGUF file loads on the native backend: a ``NoKernelError`` when it has matrices of a type the
    kernels do not read and ``dequantize`` is False; with ``dequantize``, that same line as a warning on stderr."""
    found = check_native_types(path, dequantize=dequantize)
    if found is not None:
        print(f"specdec: warning: {found.message(allowed=True)}", file=sys.stderr, flush=True)


def load_native_models(target_path: str, draft_path: str | None, *, threads: int | None = None,
                       draft_head: int | None = None, kernels: str = "native", dequantize: bool = False) -> tuple:
    """(target, draft or None, tokenizer, end-of-generation ids) for two GGUF files; ``dequantize``:
    :func:`warn_float32`."""
    from ..models.native import NativeModel, NativeSettings

    for path in (target_path, draft_path):
        if path:
            warn_float32(path, dequantize)  # both checked before either loads
    with ThreadPoolExecutor(1) as pool:  # the tokenizer (Python, transformers) read while the weights load (C)
        reading = pool.submit(gguf_tokenizer, target_path)
        settings = NativeSettings(threads=threads, isa=kernels, dequantize=dequantize)
        target_model = NativeModel(target_path, settings)
        draft_model = NativeModel(draft_path, settings) if draft_path else None
        tokenizer = reading.result()
    for model in (target_model, draft_model):
        if model is not None:
            model.tokenizer = tokenizer
    if draft_model is not None:
        check_same_vocabulary(target_model, draft_model)
        if cut := draft_head_cut(draft_head, draft_model.vocab_size):
            from .frequent import frequent_tokens

            draft_model.cut_head(frequent_tokens(tokenizer, cut))
    eos = {int(t) for t in (tokenizer.eos_token_id, *target_model.end_of_generation_ids()) if t is not None}
    return target_model, draft_model, tokenizer, sorted(eos)
