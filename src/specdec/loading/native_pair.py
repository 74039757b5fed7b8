"""Load a pair for the native backend: both GGUF files run by specdec's own kernels (``specdec.models.native``).

Nothing is converted or de-quantized: the files are memory-mapped as they are. The tokenizer is the
target's, rebuilt by transformers from the GGUF metadata once (≈15 s), corrected to llama.cpp's reading
and kept in the cache beside the file's other derived data (seconds on later runs;
``specdec.loading.tokenizer.gguf_tokenizer``).
"""

from __future__ import annotations

import os
from functools import cache

from ..models.base import check_same_vocabulary
from . import zoo
from .tokenizer import gguf_tokenizer

__all__ = ["native_available", "native_runs", "gguf_tokenizer", "load_native_models"]


@cache
def native_available() -> str | None:
    """None when the native backend can run here (its kernels are compiled, or compile now), else why not."""
    from ..native import build

    if build.compiler() is None:
        return "the native backend compiles its kernels here and needs a C++ compiler (g++); none was found"
    try:
        for name in build.sources():
            build.build(name)
    except build.KernelBuildError as err:
        return str(err).splitlines()[0]
    return None


def native_runs(spec: str | None) -> bool:
    """Whether the native backend runs the architecture of a --target/--draft-model GGUF value (None: the
    default pair, Qwen2; a named model: its recorded architecture). A value that does not name a readable
    GGUF file counts as runnable, so that the model locator reports it with its own error."""
    from ..models.native import SUPPORTED_ARCHS
    from ..native.gguf_file import GGUFFile

    if spec is None:
        return True
    named = zoo.named_model(spec)
    if named is not None:
        return named.architecture in SUPPORTED_ARCHS
    path = os.path.expanduser(str(spec))
    if os.path.isdir(path):
        files = [name for name in os.listdir(path) if name.lower().endswith(".gguf")]
        path = os.path.join(path, files[0]) if len(files) == 1 else path
    try:
        return GGUFFile(path).fields.get("general.architecture") in SUPPORTED_ARCHS
    except (OSError, ValueError):
        return True


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
