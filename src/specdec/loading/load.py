"""``specdec.load_model``: one model, by file or by name, on the backend asked for; the library's way in.

::

    target = load_model("qwen2.5-coder-1.5b")                           # a NativeModel on a CPU
    draft = load_model("qwen2.5-coder-0.5b", tokenizer=target.tokenizer)

``path`` takes what ``--target`` takes (``specdec.loading.locate.locate_model``): a GGUF file, a named model
(``specdec.loading.zoo``), a transformers model directory or a cached model id; None is the default model of
``role``. It is checked before anything loads. ``backend`` is the CLI's ``--backend``
(``specdec.loading.backend.resolve_backend``): ``auto`` runs a GGUF file of an architecture the native kernels
run on the native backend when the device is the CPU, anything else on transformers. The model carries
its tokenizer (``model.tokenizer``): a GGUF file's as llama.cpp reads it (``specdec.loading.tokenizer``),
or the one passed in (a draft shares its target's).
"""

from __future__ import annotations

from ..models.base import LanguageModel
from .backend import resolve_backend
from .hf_pair import load_hf_model
from .locate import ROLE_FLAGS, check_device, gguf_path, locate_model
from .tokenizer import gguf_tokenizer

__all__ = ["load_model"]


def load_model(path: str | None = None, backend: str = "auto", *, role: str = "target", threads: int | None = None,
               device: str = "cpu", dtype: str | None = None, kernels: str = "native", tokenizer=None,
               progress: bool = True, dequantize: bool = False) -> LanguageModel:
    """A :class:`~specdec.models.native.NativeModel`, :class:`~specdec.models.hf.HFModel` or
    :class:`~specdec.models.llamacpp.LlamaCppModel` for ``path`` (module docstring).

    ``threads``: kernel threads of the native and llamacpp backends (None: every core). ``dtype``: the
    transformers backend's (None: its default). ``kernels``: the native backend's compiled kernels (native,
    avx2, scalar). ``role``: ``target`` or ``draft``: which default model None stands for; a llama.cpp
    target runs batch-invariant (``specdec.models.llamacpp``). ``tokenizer``: attach this one instead of
    reading the file's (the transformers backend keeps its own). ``dequantize``: let the native backend run
    matrices of a type its kernels do not read as float32 copies (a warning on stderr); without it such a file is
    a :class:`~specdec.models.kernel_types.NoKernelError` before anything loads."""
    if role not in ROLE_FLAGS:
        raise ValueError(f"role={role!r} is invalid: choose target or draft")
    check_device(device)
    locate_model(path, role, assemble=False)  # a bad value is one line naming it, before anything loads
    resolved = resolve_backend(backend, path, device=device, dequantize=dequantize)
    if resolved == "transformers":
        return load_hf_model(path, role, device=device, dtype=dtype, progress=progress)
    if dtype is not None:
        raise ValueError(f"dtype={dtype!r} applies to the transformers backend only; the {resolved} backend runs "
                         "the GGUF file's own quantized weights (leave dtype at None)")
    file = gguf_path(path, role, progress=progress)
    if tokenizer is None:
        tokenizer = gguf_tokenizer(file)
    if resolved == "native":
        from ..models.native import NativeModel, NativeSettings
        from .native_pair import warn_float32

        warn_float32(file, dequantize)
        return NativeModel(file, NativeSettings(threads=threads, isa=kernels, dequantize=dequantize),
                           tokenizer=tokenizer)
    from ..models.llamacpp import LlamaCppModel, LlamaCppSettings

    model = LlamaCppModel(file, LlamaCppSettings(n_threads=threads, batch_invariant=role == "target"))
    model.tokenizer = tokenizer
    return model
