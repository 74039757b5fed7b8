"""Load a pair for the native backend: both GGUF files run by specdec's own kernels (``specdec.models.native``).

Nothing is converted or de-quantized: the files are memory-mapped as they are. The tokenizer is the
target's, rebuilt by transformers from the GGUF metadata once (≈15 s) and kept in the cache beside
the file's other derived data (seconds on later runs; :func:`gguf_tokenizer` writes it atomically).
"""

from __future__ import annotations

import os
import shutil
from functools import cache

from ..models.base import check_same_vocabulary
from .cache import converted_dir, derived_dir, locked


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
    default pair, Qwen2). A value that does not name a readable GGUF file counts as runnable, so that the
    model locator reports it with its own error."""
    from ..models.native import SUPPORTED_ARCHS
    from ..native.gguf_file import GGUFFile

    if spec is None:
        return True
    path = os.path.expanduser(str(spec))
    if os.path.isdir(path):
        files = [name for name in os.listdir(path) if name.lower().endswith(".gguf")]
        path = os.path.join(path, files[0]) if len(files) == 1 else path
    try:
        return GGUFFile(path).fields.get("general.architecture") in SUPPORTED_ARCHS
    except (OSError, ValueError):
        return True


def gguf_tokenizer(gguf_path: str):
    """The transformers tokenizer stored in a GGUF file, built once and then read from the cache.

    Saved into a temporary folder and renamed into place whole, under a lock: a process killed while
    saving leaves only that temporary folder, which nothing reads and the next build removes."""
    from transformers import AutoTokenizer

    def cached():
        for folder in (derived_dir(gguf_path, "tokenizers"), converted_dir(gguf_path)):
            if (folder / "tokenizer_config.json").is_file():
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
        tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(out, ignore_errors=True)  # a folder without tokenizer_config.json: not a finished build
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return tokenizer


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
